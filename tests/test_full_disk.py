"""A full disk while a checkpoint is written (``trainer/checkpoints.py``): nothing half-written
becomes the resume point, one line says what happened, exit status 6, and a resume after space
is freed goes on exactly from the previous complete checkpoint.

The disk is a real size-limited filesystem: a tmpfs mounted for the run's output directory (root
only; CI runs as root), with the weight-sync file's directory bind-mounted from the ordinary disk
(the 540 MB file each step rewrites would fill it first).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for_memory, write_cpu_config

from vf_rl.trainer.checkpoints import last_complete_checkpoint


def test_resume_takes_the_newest_complete_checkpoint_only(tmp_path):
    """A save's temporary copy and a checkpoint directory without its trainer_state.json (a copy cut
    short, an older version's partial save) are never the resume point."""
    for name in ("checkpoint-1", "checkpoint-3", ".tmp-checkpoint-4/checkpoint-4", "checkpoint-9x"):
        (tmp_path / name).mkdir(parents=True)
    for name in ("checkpoint-1", ".tmp-checkpoint-4/checkpoint-4", "checkpoint-9x"):
        (tmp_path / name / "trainer_state.json").write_text('{"global_step": 1}')
    (tmp_path / "checkpoint-3" / "adapter_model.safetensors").write_bytes(b"partial")
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-1"
    (tmp_path / "checkpoint-12").mkdir()
    (tmp_path / "checkpoint-12" / "trainer_state.json").write_text('{"global_step": 12}')
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-12"  # by step, not by name
    assert last_complete_checkpoint(tmp_path / "nothing") is None


def mount(*argv: str) -> None:
    done = subprocess.run(["mount", *argv], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"mount {' '.join(argv)} failed: {done.stderr.strip()} (needs root with mount rights; CI has them)")


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def fill(directory: Path, leave: int) -> Path:
    """Write a file in ``directory`` that leaves ``leave`` bytes of its filesystem free."""
    filler = directory / "filler"
    with filler.open("wb") as f:
        f.truncate(0)
        size = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize - leave
        os.posix_fallocate(f.fileno(), 0, max(size, 0))
    return filler


def test_a_full_disk_is_told_from_other_failed_writes(tmp_path):
    """torch's writer reports a full disk only as a failed write ("unexpected pos"), safetensors as
    os error 28: both are a full disk; a failed write with room left is not."""
    import torch
    from safetensors.torch import save_file

    from vf_rl.trainer.checkpoints import _disk_full

    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root (CI runs as root)")
    small = tmp_path / "small"
    small.mkdir()
    mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small))
    try:
        errors = []
        for write in (lambda p: torch.save({"w": torch.zeros(2 << 20)}, p), lambda p: save_file({"w": torch.zeros(2 << 20)}, p)):
            with pytest.raises(Exception) as failed:
                write(str(small / "w.bin"))
            errors.append(failed.value)
            assert _disk_full(failed.value, small), repr(failed.value)
            (small / "w.bin").unlink(missing_ok=True)
        assert isinstance(errors[0], RuntimeError) and "No space" not in str(errors[0])  # torch names no full disk
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)  # lazily: a failed write's file may still be open
    assert not _disk_full(RuntimeError("unexpected pos 576 vs 534"), tmp_path)


@pytest.mark.server
def test_full_disk_while_saving_keeps_the_previous_checkpoint_and_resumes_exactly(server, model_dir, tmp_path,
                                                                                  restore_base_weights):
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs for the output directory needs root (CI runs as root)")
    out, weights = tmp_path / "run", tmp_path / "weights-on-disk"
    out.mkdir()
    weights.mkdir()
    mount("-t", "tmpfs", "-o", "size=256m", "tmpfs", str(out))
    try:
        (out / "weights").mkdir()
        mount("--bind", str(weights), str(out / "weights"))
        try:
            run_full_disk(server, model_dir, tmp_path, out)
        finally:
            subprocess.run(["umount", "-l", str(out / "weights")], check=False)
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False)


def run_full_disk(server, model_dir, tmp_path: Path, out: Path) -> None:
    config = write_cpu_config(tmp_path / "disk.toml", model_dir, out, server.port, batch_size=8,
                              rollouts_per_example=4, micro_batch_size=8, max_steps=2, max_tokens=8, save_steps=1,
                              preflight="off")
    wait_for_memory()
    run = subprocess.Popen([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    first = out / "checkpoint-1"
    try:
        while run.poll() is None and not (first / "trainer_state.json").is_file():
            time.sleep(0.1)
        run.send_signal(signal.SIGSTOP)  # still early in step 2: fill the disk before its checkpoint
        saved = digests(first)
        # checkpoint-2 will have room for what a save writes before the optimizer's state, and half of that:
        # the save fails inside torch's writer, which names no full disk (only a failed write)
        before_optimizer = sum((first / name).stat().st_size for name in saved
                               if name not in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"))
        filler = fill(out, before_optimizer + (first / "optimizer.pt").stat().st_size // 2 + (1 << 20))
        run.send_signal(signal.SIGCONT)
        output, errors = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    print(output[-2000:], errors[-2000:], sep="\n")
    assert run.returncode == 6, errors[-3000:]
    assert errors.strip().splitlines()[-1] == (f"[vf-rl] no space left on device while saving checkpoint-2 in {out}; "
                                               "the resume point stays checkpoint-1; free space and run with --resume")
    assert "Traceback" not in errors
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint-1"]  # no partial copy
    assert digests(first) == saved  # the resume point untouched
    assert last_complete_checkpoint(out) == first
    trained = jsonl(out / "batches.jsonl")  # step 2 was trained, its checkpoint failed

    filler.unlink()  # space freed
    resumed = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config), "--resume"],
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"Resuming from {first} (step 1)" in resumed.stdout
    assert [r["step"] for r in jsonl(out / "metrics.jsonl") if "reward" in r] == [1, 2]
    assert jsonl(out / "batches.jsonl") == trained  # step 2 again, on the same rows
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
