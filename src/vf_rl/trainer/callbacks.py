"""What a run leaves behind every step besides the weights: ``metrics.jsonl``, the console
line, the plot and the run's summary at the end, and the final checkpoint (``Trainer`` callbacks)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from vf_rl.trainer import display
from vf_rl.trainer.health import Health
from vf_rl.trainer.model import Float32Rotary


def append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop records of steps after ``last_step`` (a resume redoes them); atomic rewrite."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def evaluating(args) -> bool:
    """Whether evaluation during training is on (``eval_strategy`` is not ``"no"``)."""
    return getattr(args.eval_strategy, "value", args.eval_strategy) != "no"


def peak_memory() -> dict[str, float]:
    """``memory/peak_gib`` (the most bytes PyTorch held in tensors) and ``memory/reserved_peak_gib``
    (its caching allocator's most, what nvidia-smi counts for this process, less the CUDA context)
    on this process's GPU since the last call, in GiB, then the peaks reset; ``{}`` without CUDA.
    Beside the launch's estimate (``vf_rl.config.memory``) they show what a step really took, the weight
    push of the step before it included."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    peaks = {"memory/peak_gib": torch.cuda.max_memory_allocated() / 2**30,
             "memory/reserved_peak_gib": torch.cuda.max_memory_reserved() / 2**30}
    torch.cuda.reset_peak_memory_stats()
    return peaks


class RunCallback(Float32Rotary):
    """Before the first step, RoPE buffers back in float32 (:class:`model.Float32Rotary`). Always
    save (and, when evaluation is on, evaluate) the final step; empty the device cache every
    ``torch_empty_cache_steps``; read the health rules (:class:`~vf_rl.trainer.health.Health`:
    ``health/<rule>`` in each step's record, a line when an alarm changes, ``health_stop``); write
    ``metrics.jsonl`` (with a GPU, each step's peak memory: :func:`peak_memory`), the console line
    and the plot."""

    health: Health | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self.health = Health(args, state, args.output_dir)  # a resumed run's metrics.jsonl is cut back by now

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_save = True
            if evaluating(args):
                control.should_evaluate = True
        if args.torch_empty_cache_steps and state.global_step % args.torch_empty_cache_steps == 0:
            from accelerate.utils import clear_device_cache

            clear_device_cache()
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        if self.health is not None:  # every process: with several, they stop together
            self.health.on_log(args, state, control, logs, display.note)
        if not state.is_world_process_zero:
            return
        if "reward" in logs:
            logs.update(peak_memory())
        record = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
        append_jsonl(Path(args.output_dir) / "metrics.jsonl", record)
        if "reward" in logs:
            display.step_line(state.global_step, state.max_steps, logs)
        elif "eval/reward" in logs:
            display.eval_line(state.global_step, logs)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            from vf_rl.trainer.plot import plot_run

            try:
                print(f"Plot: {plot_run(Path(args.output_dir))}", flush=True)
            except Exception as exc:  # a plot must never fail a finished run
                print(f"(no plot: {exc})", flush=True)


SUMMARY_NAME = "summary.txt"
SUMMARY_STEPS = 5  # the first and the last this many steps are averaged


def _segments_s(steps: list[dict]) -> float:
    """Seconds of training in ``steps`` (records with ``timing/elapsed_s``, which counts from the
    server's readiness and starts again at a resume): the sum of each run segment's last value."""
    total, last = 0.0, 0.0
    for r in steps:
        elapsed = r.get("timing/elapsed_s")
        if elapsed is None:
            continue
        if elapsed < last:  # a resumed run's first step: a new segment
            total += last
        last = elapsed
    return total + last


def run_summary(run_dir: Path, max_steps: int | None = None) -> str:
    """What a finished run reached, from ``run_dir/metrics.jsonl`` (what the run logged, and what
    ``vf-rl plot`` draws; of a file that several fresh runs appended to, the last run's records), as
    lines of text:

    - steps done (of ``max_steps``), seconds of training (``timing/elapsed_s`` of the last step,
      summed over the segments of a resumed run) and per step;
    - ``reward``: first (mean over the first :data:`SUMMARY_STEPS` steps), last (mean over the last
      ones), best (the highest step's, and which step);
    - ``eval/reward`` before (the first evaluation) and after (the last), when the run evaluated;
    - the last checkpoint and the ``vf-rl export`` command that turns it into a model directory.

    Raises:
        FileNotFoundError: no metrics file.
    """
    import statistics

    from vf_rl.trainer.export import last_checkpoint
    from vf_rl.trainer.plot import load_metrics

    records = load_metrics(run_dir)
    # the last run's records: a fresh run in the same output_dir appends from step 0 or 1 again
    # (a resume first cuts the file back to its checkpoint, so its steps keep rising)
    starts = [i for i in range(1, len(records)) if records[i].get("step", 0) < records[i - 1].get("step", 0)]
    records = records[starts[-1]:] if starts else records
    steps = [r for r in records if "reward" in r]
    evals = [r for r in records if "eval/reward" in r]
    lines = [f"Run summary ({run_dir / 'metrics.jsonl'}):"]
    if not steps:
        lines.append("  no training step was logged")
    else:
        seconds = _segments_s(steps)
        of = f" of {max_steps}" if max_steps else ""
        lines.append(f"  steps:           {steps[-1]['step']}{of}, {seconds:.0f} s of training "
                     f"({seconds / len(steps):.1f} s per step)")
        n = min(SUMMARY_STEPS, len(steps))
        first = statistics.fmean(r["reward"] for r in steps[:n])
        last = statistics.fmean(r["reward"] for r in steps[-n:])
        best = max(steps, key=lambda r: r["reward"])
        lines.append(f"  reward:          first {first:.3f} (mean of steps {steps[0]['step']}-{steps[n - 1]['step']}), "
                     f"last {last:.3f} (mean of steps {steps[-n]['step']}-{steps[-1]['step']}), "
                     f"best {best['reward']:.3f} (step {best['step']})")
    if evals:
        before, after = evals[0], evals[-1]
        change = (f"{before['eval/reward']:.3f} at step {before['step']} -> {after['eval/reward']:.3f} at step {after['step']}"
                  if after is not before else f"{before['eval/reward']:.3f} at step {before['step']}")
        lines.append(f"  held-out reward: {change} (eval/reward)")
    checkpoint = last_checkpoint(run_dir)
    if checkpoint is None:
        lines.append("  last checkpoint: none")
    else:
        lines.append(f"  last checkpoint: {checkpoint}")
        lines.append(f"  use it:          vf-rl export {run_dir} {run_dir / 'model'}   (vf-rl export --help)")
    return "\n".join(lines)


class RunSummary(TrainerCallback):
    """At the end of training, the main process prints :func:`run_summary` and writes it to
    ``<output_dir>/summary.txt``. After the final checkpoint is saved and the plot drawn."""

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        out = Path(args.output_dir)
        try:
            text = run_summary(out, state.max_steps)
            (out / SUMMARY_NAME).write_text(text + "\n")
        except Exception as exc:  # a summary must never fail a finished run
            print(f"(no run summary: {exc})", flush=True)
            return
        print(text, flush=True)


class TimeBudget(TrainerCallback):
    """``max_time_s``: end training at the first step that ends ``max_time_s`` seconds after
    the first step of this run ended (so the server's start-up, the model's warm-up and
    compilation are not counted). That step is saved, and evaluated when evaluation is on, as
    the last of ``max_steps`` would be. The main process decides for all processes."""

    def __init__(self, max_time_s: float):
        self.max_time_s = max_time_s
        self.first_step_end: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self.first_step_end is None:
            self.first_step_end = now
            return control
        stop = now - self.first_step_end >= self.max_time_s
        if args.world_size > 1:  # clocks differ between processes: all follow the main one
            from accelerate.utils import broadcast_object_list

            stop = broadcast_object_list([stop], from_process=0)[0]
        if stop and state.global_step < state.max_steps:
            control.should_training_stop = control.should_save = True
            if evaluating(args):
                control.should_evaluate = True
            if state.is_world_process_zero:
                print(f"max_time_s: {self.max_time_s:.0f} s of training after step 1 reached at step "
                      f"{state.global_step}; stopping", flush=True)
        return control


class QuietProgress(ProgressCallback):
    """The progress bar without ``Trainer``'s raw dict print (we print our own line), attached to
    the pane's display while training runs (``display.attach_progress_bar``: lines go above it, the
    generation progress into its postfix)."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        display.attach_progress_bar(self.training_bar)  # None on every process but the main one

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass

    def on_train_end(self, args, state, control, **kwargs):
        display.attach_progress_bar(None)
        super().on_train_end(args, state, control, **kwargs)
