"""What the Trainer pane shows: a line per step, a sample table on its own cadence, generation
progress.

While ``Trainer``'s progress bar is on screen (``callbacks.QuietProgress`` attaches it here), every
line is printed above it (tqdm's ``external_write_mode``: the bar is cleared, the line printed,
the bar drawn again below it), and the progress of the batch being waited for is the bar's postfix
rather than a line of its own, so no two writers share a line. A log written from the pane
(``<output_dir>/logs/trainer.log``) keeps each line's last state (what follows its last carriage
return), so a redrawn bar leaves nothing there and each printed line is there once.
"""

from __future__ import annotations

import contextlib
import sys

from rich.console import Console
from rich.table import Table

# no file given: rich writes to whatever sys.stdout is at each print (a notebook's or a test's
# replacement of sys.stdout included), not to the stream of the moment this module was imported
_console = Console(width=160, soft_wrap=False)

SAMPLE_EVERY = 5
"""The sample table is printed after step 1, every ``SAMPLE_EVERY`` steps and after the last."""

_bar = None  # Trainer's progress bar while training runs (attach_progress_bar)


def attach_progress_bar(bar) -> None:
    """Print above ``bar`` (a tqdm bar, or ``None`` once it is closed) and show the generation
    progress in its postfix."""
    global _bar
    _bar = bar


def _above_bar():
    """A context in which output goes above the progress bar (tqdm clears it, then draws it again
    below); a no-op without a bar."""
    if _bar is None:
        return contextlib.nullcontext()
    from tqdm import tqdm

    return tqdm.external_write_mode(file=sys.stdout)


def shows_samples(step: int, max_steps: int) -> bool:
    """Whether the sample table is printed after optimizer step ``step`` (1-based) of ``max_steps``:
    the first, every :data:`SAMPLE_EVERY`-th and the last."""
    return step == 1 or step % SAMPLE_EVERY == 0 or step == max_steps


def last_text(messages) -> str:
    """Content of the last message (a prompt's question, a completion's final answer)."""
    if isinstance(messages, str):
        return messages
    return str(messages[-1].get("content") or "") if messages else ""


def step_line(step: int, max_steps: int, logs: dict) -> None:
    """``Step 3/30: reward=0.21 (std 0.09) loss=... entropy=... importance_ratio=...`` and the
    seconds spent generating, waiting for the batch, training and syncing weights."""
    g = logs.get
    line = (f"Step {step}/{max_steps}: reward={g('reward', 0):.3f} (std {g('reward/std', 0):.3f}) "
            f"loss={g('loss', 0):.4f} entropy={g('entropy', 0):.3f} importance_ratio={g('importance_ratio', 0):.3f} "
            f"grad_norm={g('grad_norm', 0):.3f} | gen={g('timing/generation_s', 0):.1f}s "
            f"wait={g('timing/wait_s', 0):.1f}s train={g('timing/train_s', 0):.1f}s sync={g('timing/sync_s', 0):.1f}s")
    with _above_bar():
        print(line, flush=True)


def note(text: str) -> None:
    """``text`` on a line of its own (a health alarm, a stop)."""
    with _above_bar():
        print(text, flush=True)


def eval_line(step: int, logs: dict) -> None:
    """``Eval at step 10: reward=0.42 (std 0.11, 35s)``."""
    with _above_bar():
        print(f"Eval at step {step}: reward={logs.get('eval/reward', 0):.3f} (std {logs.get('eval/reward/std', 0):.3f}, "
              f"{logs.get('eval/timing_s', 0):.0f}s)", flush=True)


def sample_table(batch, step: int, rows: int = 3) -> None:
    """A few samples of ``batch``, one per group: prompt, completion, the expected answer (a column
    only when a shown row has one: the dataset row's ``answer``) and reward."""
    group = max(len(batch.rollouts) // max(len(batch.row_ids), 1), 1)
    shown = batch.rollouts[::group][:rows]
    answers = ["" if r.answer is None else str(r.answer) for r in shown]
    table = Table(title=f"Step {step} samples", show_lines=True, expand=False)
    table.add_column("prompt", max_width=50 if any(answers) else 60, overflow="fold")
    table.add_column("completion", max_width=60 if any(answers) else 80, overflow="fold")
    if any(answers):
        table.add_column("answer", max_width=30, overflow="fold")
    table.add_column("reward", justify="right")
    for r, answer in zip(shown, answers):
        completion = last_text(r.completion) if not r.error else f"[{r.error_kind} error] {r.error}"
        table.add_row(last_text(r.prompt)[-200:], completion[:400], *([answer[:200]] if any(answers) else []),
                      f"{r.reward:.3f}")
    with _above_bar():
        _console.print(table)


def progress_printer(step: int):
    """An ``on_progress(finished, total)`` for ``Orchestrator.wait``. With a progress bar attached,
    the bar's postfix ``batch 4: 37/64 rollouts`` while the batch is generated; once it is complete
    the postfix is dropped (the step line gives the batch's seconds) and the bar taken off the
    screen until it is drawn again, so that what the step prints meanwhile starts a line of its own.
    Without a bar, one updating line ``Generating batch 4: 37/64 rollouts``, ended when the batch
    is complete."""

    def show(done: int, total: int) -> None:
        if _bar is not None and done < total:
            _bar.set_postfix_str(f"batch {step + 1}: {done}/{total} rollouts")
        elif _bar is not None:
            _bar.set_postfix_str("", refresh=False)
            _bar.clear()
        else:
            print(f"\rGenerating batch {step + 1}: {done}/{total} rollouts", end="\n" if done >= total else "",
                  flush=True)

    return show


def wandb_sample_table(batch, report_to) -> None:
    """A prompt/completion/reward table in wandb when a run is active."""
    if "wandb" not in (report_to or []):
        return
    import wandb

    if wandb.run is None:
        return
    table = wandb.Table(columns=["step", "prompt", "completion", "reward", "error"])
    for r in batch.rollouts[:8]:
        error = f"[{r.error_kind}] {r.error}" if r.error else ""
        table.add_data(batch.step + 1, last_text(r.prompt), last_text(r.completion), r.reward, error)
    wandb.log({"samples": table}, commit=False)
