"""vLLM's model-info cache, filled while vf-vllm is still importing vLLM.

Before it starts its engine, vLLM inspects the model's class (which interfaces it implements) in
a fresh Python process, so that importing the model's module cannot initialize CUDA in the
server's own process, and keeps the answer under ``$VLLM_CACHE_ROOT/modelinfos``. With that cache
empty (a first run, a new vLLM, a container without a kept cache) the inspection is a serial
start of Python plus vLLM's imports, seconds to tens of seconds (``docs/benchmarks.md``).
:func:`start` runs the same inspection in a process of
its own as soon as vf-vllm starts, beside vf-vllm's own imports, and vf-vllm waits for it (it is
done by then, or nearly) just before vLLM would inspect: vLLM then reads the cache.

    python -m vf_rl.inference.model_info ARCH [ARCH ...]   # what :func:`start` runs

Nothing here is needed for correctness: when the architecture is unknown, the cache is already
filled or the inspection fails, vLLM inspects as it always does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

WAIT_S = 120.0
"""Seconds vf-vllm waits at most for the inspection before it lets vLLM inspect by itself."""


def architectures(model: str) -> list[str]:
    """The ``architectures`` of ``model``'s ``config.json``: a local directory, or a hub id whose
    config is in the local hub cache (nothing is downloaded); ``[]`` when neither is readable."""
    config = Path(model).expanduser() / "config.json"
    if not config.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # not a hub id (a bad path: vLLM reports it)
            return []
        if not isinstance(cached, str):
            return []
        config = Path(cached)
    try:
        archs = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [a for a in archs if isinstance(a, str)]


def cache_dir() -> Path:
    """vLLM's model-info cache: ``$VLLM_CACHE_ROOT/modelinfos`` (vLLM's default root:
    ``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "vllm")
    return Path(root).expanduser() / "modelinfos"


def cached(archs: list[str]) -> bool:
    """Whether vLLM's cache holds an answer for every one of ``archs``. vLLM names each file
    ``<module>-<class>.json`` and most architectures are their class's name; an architecture
    served by a class of another name reads as not cached (and is inspected again, in parallel)."""
    try:
        names = {p.name for p in cache_dir().iterdir()}
    except OSError:
        return False
    return all(any(n.endswith(f"-{arch}.json") for n in names) for arch in archs)


def start(model: str) -> subprocess.Popen | None:
    """Start the inspection of ``model``'s architectures in the background (output discarded);
    ``None`` when its ``config.json`` names none or vLLM's cache has them already."""
    archs = architectures(model)
    if not archs or cached(archs):
        return None
    return subprocess.Popen([sys.executable, "-m", __name__, *archs], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish(process: subprocess.Popen | None, timeout: float = WAIT_S) -> None:
    """Wait for :func:`start`'s process (``timeout`` seconds at most, then stop it)."""
    if process is None:
        return
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def inspect(archs: list[str]) -> None:
    """Inspect ``archs`` through vLLM's registry in this process, which exists for it (vLLM's own
    subprocess hop is replaced by a plain call here), so that vLLM saves each answer in its cache."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()  # this process is the subprocess
    for arch in archs:
        model = registry.ModelRegistry.models.get(arch)
        if model is not None:
            model.inspect_model_cls()


if __name__ == "__main__":
    inspect(sys.argv[1:])
