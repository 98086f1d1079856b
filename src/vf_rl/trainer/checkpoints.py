"""Checkpoints that a kill never leaves half-written, and the run's records cut back on resume.

``CheckpointingTrainer`` is the ``transformers.Trainer`` that ``RLTrainer`` builds on: every
``checkpoint-<step>`` is written under a temporary name and renamed when complete (so resume
never picks a broken one), and resuming drops the ``metrics.jsonl``/``batches.jsonl`` records of
the steps after the checkpoint (they are trained again).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from transformers import Trainer

try:
    from transformers.trainer_utils import rotate_checkpoints
except ImportError:  # transformers 4.x: a Trainer method
    rotate_checkpoints = None

from vf_rl.trainer.callbacks import truncate_jsonl


class CheckpointingTrainer(Trainer):
    """``Trainer`` with atomic checkpoints and :meth:`prepare_resume`."""

    _checkpoint_staging: Path | None = None

    def prepare_resume(self, checkpoint: str | bool) -> None:
        """Main process: find the checkpoint to resume from (``True``: the last one in
        ``output_dir``) and cut the run's jsonl records back to its step.

        Raises:
            ValueError: naming ``resume_from_checkpoint``, when there is no such checkpoint.
        """
        from transformers.trainer_utils import get_last_checkpoint

        path = get_last_checkpoint(self.args.output_dir) if checkpoint is True else str(checkpoint)
        if not path or not Path(path).is_dir():
            raise ValueError(f"resume_from_checkpoint: no checkpoint found ({checkpoint!r} in {self.args.output_dir})")
        step = json.loads((Path(path) / "trainer_state.json").read_text())["global_step"]
        for name in ("metrics.jsonl", "batches.jsonl"):
            truncate_jsonl(Path(self.args.output_dir) / name, step)
        print(f"Resuming from {path} (step {step})", flush=True)

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
