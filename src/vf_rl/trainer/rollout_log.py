"""What a step leaves of its rollouts: the Trainer pane's sample table, wandb's table, and the
rollouts file ``<output_dir>/rollouts/step-NNNNNN.jsonl.gz`` that ``vf-rl view`` reads.

A rollouts file holds one JSON object per rollout of the step's batch, in the batch's order
(grouped by prompt), gzip-compressed; it is written to a temporary name and renamed, so a reader
never sees half a file. Its fields (:func:`rollout_record`): ``step`` (1-based optimizer step),
``group`` (the prompt's index in the batch), ``row_id`` (its dataset index), ``example_id``,
``task``, ``prompt`` and ``completion`` (chat messages, or text for a completion-style
environment), ``answer`` (the dataset row's expected answer, ``null`` when it has none),
``reward``, ``advantage``, ``metrics`` (each reward function's score), ``is_truncated``,
``completion_tokens``, ``error`` and ``error_kind``.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from vf_rl.trainer import display

ROLLOUTS_DIR = "rollouts"
"""The folder of a run's rollouts files, under its output directory."""


def rollouts_path(output_dir: str | Path, step: int) -> Path:
    """``<output_dir>/rollouts/step-000005.jsonl.gz`` for 1-based optimizer step ``step``."""
    return Path(output_dir) / ROLLOUTS_DIR / f"step-{step:06d}.jsonl.gz"


def records_rollouts(step: int, every: int, max_steps: int) -> bool:
    """Whether the rollouts of optimizer step ``step`` (1-based) are written with
    ``log_rollouts_every = every``: step 1, every ``every``-th step and the last; none for 0."""
    return every > 0 and (step == 1 or step % every == 0 or step == max_steps)


def _plain(value):
    """``value`` as JSON can hold it: containers walked, anything else not a JSON scalar as its text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def rollout_record(batch, index: int) -> dict:
    """The record of ``batch.rollouts[index]`` (the fields in this module's docstring); its advantage
    is ``batch.advantages[index]`` (``None`` when the batch carries none)."""
    r = batch.rollouts[index]
    per_group = max(len(batch.rollouts) // max(len(batch.row_ids), 1), 1)
    group = index // per_group
    advantages = getattr(batch, "advantages", None) or []
    return {"step": batch.step + 1, "group": group,
            "row_id": _plain(batch.row_ids[group]) if group < len(batch.row_ids) else None,
            "example_id": _plain(r.example_id), "task": r.task, "prompt": _plain(r.prompt),
            "completion": _plain(r.completion), "answer": _plain(r.answer), "reward": float(r.reward),
            "advantage": float(advantages[index]) if index < len(advantages) else None,
            "metrics": _plain(r.metrics), "is_truncated": bool(r.is_truncated),
            "completion_tokens": sum(len(t.completion_ids) for t in r.turns), "error": r.error,
            "error_kind": r.error_kind}


def write_rollouts(batch, output_dir: str | Path) -> Path:
    """Write ``batch``'s rollouts to :func:`rollouts_path` (replacing a file of the same step, as a
    resumed run redoes its steps) and return the path.

    Raises:
        OSError: the folder or file cannot be written.
    """
    path = rollouts_path(output_dir, batch.step + 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with gzip.open(partial, "wt", encoding="utf-8") as f:
        for index in range(len(batch.rollouts)):
            f.write(json.dumps(rollout_record(batch, index), ensure_ascii=False) + "\n")
    os.replace(partial, path)
    return path


def read_rollouts(path: str | Path) -> list[dict]:
    """The records of one rollouts file, in its order.

    Raises:
        OSError: unreadable (``gzip.BadGzipFile`` for a file that is not gzip). ValueError: a line that is not JSON.
    """
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def recorded_steps(output_dir: str | Path) -> list[int]:
    """The 1-based steps whose rollouts file is in ``<output_dir>/rollouts/``, ascending."""
    folder = Path(output_dir) / ROLLOUTS_DIR
    steps = []
    for path in folder.glob("step-*.jsonl.gz") if folder.is_dir() else []:
        number = path.name[len("step-"):-len(".jsonl.gz")]
        if number.isdigit():
            steps.append(int(number))
    return sorted(steps)


def record_step_rollouts(batch, args) -> None:
    """After optimizer step ``batch.step + 1`` (main process): the sample table on its cadence
    (``display.shows_samples``), wandb's table every ``logging_steps``, and the rollouts file on the
    cadence of ``args.log_rollouts_every`` (:func:`records_rollouts`)."""
    step = batch.step + 1
    if display.shows_samples(step, args.max_steps):
        display.sample_table(batch, step)
    if batch.step % max(int(args.logging_steps), 1) == 0:
        display.wandb_sample_table(batch, args.report_to)
    if records_rollouts(step, int(args.log_rollouts_every), args.max_steps):
        write_rollouts(batch, args.output_dir)
