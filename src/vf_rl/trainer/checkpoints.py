"""Checkpoints that a kill or a full disk never leaves half-written, the run's records cut back
on resume, and a checkpoint when the watchdog stops the run.

``CheckpointingTrainer`` is the ``transformers.Trainer`` that ``RLTrainer`` builds on: every
``checkpoint-<step>`` is written under a temporary name (``.tmp-checkpoint-<step>``) and renamed
when complete; resume takes the newest complete one (:func:`last_complete_checkpoint`: its
``trainer_state.json``, the last file a save writes, is there), and drops the
``metrics.jsonl``/``batches.jsonl`` records of the steps after it (they are trained again).

A save that runs out of disk space removes its partial copy and raises :class:`DiskFull`, one
line naming the checkpoint, the directory and the resume point that stays. A run the watchdog
stops (``vf_rl.watchdog.Stalled``) saves the last complete step first (:meth:`save_on_stop`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

from transformers import Trainer
from transformers.trainer_callback import ProgressCallback

try:
    from transformers.trainer_utils import rotate_checkpoints
except ImportError:  # transformers 4.x: a Trainer method
    rotate_checkpoints = None

from vf_rl.trainer.callbacks import truncate_jsonl
from vf_rl.watchdog import Stalled

STATE_FILE = "trainer_state.json"
"""The last file ``Trainer._save_checkpoint`` writes: a checkpoint directory that has it is complete."""
FULL_BYTES = 1 << 20
"""A save that failed with less free space than this (bytes) left where it wrote ran out of it
(torch's writer reports a full disk only as a failed write)."""


class DiskFull(RuntimeError):
    """A checkpoint could not be written for lack of disk space; ``str()`` is the one line
    (what, where, the resume point that stays, what to do). The partial copy is removed."""


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """The complete ``checkpoint-<step>`` of the highest step in ``output_dir`` (one with its
    ``trainer_state.json``), or ``None``. Temporary copies and directories a save left without
    that file (older versions, a copy cut short) are never picked."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint-*")
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / STATE_FILE).is_file()]
    return max(found)[1] if found else None


def _disk_full(exc: BaseException, where: Path) -> bool:
    """Whether ``exc`` (or what it was raised from) says the disk is full, or ``where`` has less
    than :data:`FULL_BYTES` free."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen) or "os error 28" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(where).free < FULL_BYTES
    except OSError:
        return False


class CheckpointingTrainer(Trainer):
    """``Trainer`` with atomic checkpoints, :meth:`prepare_resume` and :meth:`save_on_stop`."""

    _checkpoint_staging: Path | None = None

    def prepare_resume(self, checkpoint: str | bool) -> str:
        """The checkpoint to resume from (``True``: :func:`last_complete_checkpoint` of
        ``output_dir``); the main process cuts the run's jsonl records back to its step.

        Returns:
            its path.
        Raises:
            ValueError: naming ``resume_from_checkpoint``, when there is no such complete checkpoint.
        """
        out = self.args.output_dir
        path = last_complete_checkpoint(out) if checkpoint is True else Path(str(checkpoint))
        if path is None or not (path / STATE_FILE).is_file():
            raise ValueError(f"resume_from_checkpoint: no complete checkpoint found ({checkpoint!r} in {out}: "
                             f"a checkpoint-<step> directory with its {STATE_FILE})")
        step = json.loads((path / STATE_FILE).read_text())["global_step"]
        if self.is_world_process_zero():
            for name in ("metrics.jsonl", "batches.jsonl"):
                truncate_jsonl(Path(out) / name, step)
            print(f"Resuming from {path} (step {step})", flush=True)
        return str(path)

    def train(self, *args, **kwargs):
        """``Trainer.train``; when the watchdog stops the run (``Stalled``), the last complete
        step is saved first (:meth:`save_on_stop`), and the line says where.

        Raises:
            Stalled: its line, with the checkpoint's fate added. DiskFull: as a save raises it.
            Either after the progress bar is closed (the line is then a line of its own).
        """
        try:
            try:
                return super().train(*args, **kwargs)
            except Stalled as exc:
                raise Stalled(f"{exc}; {self.save_on_stop()}") from None
        except (Stalled, DiskFull):
            for callback in self.callback_handler.callbacks:
                if isinstance(callback, ProgressCallback) and getattr(callback, "training_bar", None) is not None:
                    callback.on_train_end(self.args, self.state, self.control)
            raise

    def save_on_stop(self) -> str:
        """Save ``checkpoint-<global_step>``, the last complete step (weights, optimizer, scheduler,
        RNG: the stopped step changed none of them), unless it exists or no step is complete.
        With several processes nothing is saved (the others wait in a collective and cannot
        join a save). Returns what happened, in words, for the stop's line.

        Raises:
            DiskFull: no space left for it.
        """
        step, out = self.state.global_step, Path(self.args.output_dir)
        if step == 0:
            return "no step was complete, so there is no checkpoint: run again"
        if not (out / f"checkpoint-{step}" / STATE_FILE).is_file():
            if self.args.world_size > 1:
                last = last_complete_checkpoint(out)
                return (f"the resume point stays {last.name if last else 'none'} (several processes: no save "
                        "outside a step); run with --resume")
            self.model.zero_grad(set_to_none=True)
            self._save_checkpoint(self.model, trial=None)
        return f"checkpoint-{step} (the last complete step) is in {out}: run with --resume to go on from step {step + 1}"

    def _get_output_dir(self, trial):
        return str(self._checkpoint_staging) if self._checkpoint_staging else super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        """Write ``checkpoint-<step>`` under a temporary name and rename it when complete, so a
        kill mid-save never leaves a half-written checkpoint that resume would pick."""
        out = Path(self.args.output_dir)
        step = self.state.global_step
        staging = out / f".tmp-checkpoint-{step}"
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)
        self._checkpoint_staging = staging
        try:
            super()._save_checkpoint(model, trial)
        except Exception as exc:
            if not (self.args.should_save and _disk_full(exc, out)):
                raise
            shutil.rmtree(staging, ignore_errors=True)  # nothing half-written stays (and its space is free again)
            last = last_complete_checkpoint(out)
            raise DiskFull(f"[vf-rl] no space left on device while saving checkpoint-{step} in {out}; the resume point "
                           f"stays {last.name if last else 'none (no complete checkpoint yet)'}; free space and run "
                           "with --resume") from exc
        finally:
            self._checkpoint_staging = None
        if self.args.should_save:
            written = staging / f"checkpoint-{step}"
            final = out / f"checkpoint-{step}"
            if final.exists():
                shutil.rmtree(final)
            os.replace(written, final)
            shutil.rmtree(staging, ignore_errors=True)
            if rotate_checkpoints is not None:  # transformers >= 5
                rotate_checkpoints(output_dir=str(out), save_total_limit=self.args.save_total_limit,
                                   best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=False)
            else:
                self._rotate_checkpoints(use_mtime=False, output_dir=str(out))
        self.accelerator.wait_for_everyone()
