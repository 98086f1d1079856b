"""What the Trainer pane shows: a line per step, a sample table, generation progress."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

# no file given: rich writes to whatever sys.stdout is at each print (a notebook's or a test's
# replacement of sys.stdout included), not to the stream of the moment this module was imported
_console = Console(width=160, soft_wrap=False)


def last_text(messages) -> str:
    """Content of the last message (a prompt's question, a completion's final answer)."""
    if isinstance(messages, str):
        return messages
    return str(messages[-1].get("content") or "") if messages else ""


def step_line(step: int, max_steps: int, logs: dict) -> None:
    """``Step 3/30: reward=0.21 (std 0.09) loss=... entropy=... importance_ratio=...`` and the
    seconds spent generating, waiting for the batch, training and syncing weights."""
    g = logs.get
    print(f"Step {step}/{max_steps}: reward={g('reward', 0):.3f} (std {g('reward/std', 0):.3f}) "
          f"loss={g('loss', 0):.4f} entropy={g('entropy', 0):.3f} importance_ratio={g('importance_ratio', 0):.3f} "
          f"grad_norm={g('grad_norm', 0):.3f} | gen={g('timing/generation_s', 0):.1f}s "
          f"wait={g('timing/wait_s', 0):.1f}s train={g('timing/train_s', 0):.1f}s sync={g('timing/sync_s', 0):.1f}s",
          flush=True)


def eval_line(step: int, logs: dict) -> None:
    print(f"Eval at step {step}: reward={logs.get('eval/reward', 0):.3f} (std {logs.get('eval/reward/std', 0):.3f}, "
          f"{logs.get('eval/timing_s', 0):.0f}s)", flush=True)


def sample_table(batch, step: int, rows: int = 3) -> None:
    """A few prompt/completion/reward samples of ``batch``, one per group."""
    table = Table(title=f"Step {step} samples", show_lines=True, expand=False)
    table.add_column("prompt", max_width=50, overflow="fold")
    table.add_column("completion", max_width=80, overflow="fold")
    table.add_column("reward", justify="right")
    group = max(len(batch.rollouts) // max(len(batch.row_ids), 1), 1)
    for r in batch.rollouts[::group][:rows]:
        completion = last_text(r.completion) if not r.error else f"[{r.error_kind} error] {r.error}"
        table.add_row(last_text(r.prompt)[-200:], completion[:400], f"{r.reward:.3f}")
    _console.print(table)


def progress_printer(step: int):
    """An ``on_progress(finished, total)`` for ``Orchestrator.wait``: one updating line
    ``Generating batch 4: 37/64 rollouts``, ended when the batch is complete."""

    def show(done: int, total: int) -> None:
        print(f"\rGenerating batch {step + 1}: {done}/{total} rollouts", end="\n" if done >= total else "", flush=True)

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
