"""The GPUs of this host as ``nvidia-smi`` numbers them: which this process may use, which is the
trainer's, and how much memory each has. No CUDA context is made (``vf-rl`` asks before any
process starts); without ``nvidia-smi`` each answer is ``None``."""

from __future__ import annotations

import functools


def visible_gpus() -> list[str] | None:
    """GPU ids visible to this process, as ``nvidia-smi`` numbers them: ``CUDA_VISIBLE_DEVICES`` if set,
    else those nvidia-smi lists, else ``None`` (unknown: no driver here)."""
    import os

    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return [g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    out = _nvidia_smi(["-L"])
    return None if out is None else [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU")]


def trainer_gpu_of(config, gpus: list[str] | None) -> str | None:
    """The trainer's (first) GPU among ``gpus`` (:func:`visible_gpus`): inference's first with ``[inference]
    shared``, else the one after inference's ``gpus``; None when not among them."""
    index = 0 if config.inference.shared else config.inference.gpus
    return gpus[index] if gpus and index < len(gpus) else None


def _nvidia_smi(args: list[str]) -> str | None:
    """``nvidia-smi``'s output for ``args``, or ``None`` (not installed, failed, or past 20 s)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def gpu_total_bytes(index: str) -> int | None:
    """Memory of GPU ``index`` (as ``nvidia-smi`` numbers it), or ``None`` without ``nvidia-smi``.
    Asked once per process (a launch reads it for the shared split and again for its estimate)."""
    out = _nvidia_smi(["-i", str(index), "--query-gpu=memory.total", "--format=csv,noheader,nounits"])
    try:
        return int(float(out.split()[0]) * 2**20) if out and out.strip() else None
    except ValueError:
        return None
