"""CPU cores for the two sides of a CPU-only run, split as GPUs are.

With ``inference.gpus = 0`` and ``trainer.gpus = 0`` the vLLM server and the trainer share this
machine's cores. Each side's OpenMP threads default to every core, so on a small machine both
run twice as many threads as there are cores and spend much of the step waiting on each other
(``docs/benchmarks.md``). ``vf-rl`` therefore gives the
server the first half of the cores it may use and the trainer the rest, as it gives inference
the first GPUs and the trainer the next ones: vf-vllm gets ``VLLM_CPU_OMP_THREADS_BIND`` (vLLM's
own setting), vf-train ``VF_RL_CPU_CORES``, which it applies to itself before torch starts.

Either variable set by the user wins (``VF_RL_CPU_CORES=all`` keeps the trainer on every core).
This module imports neither torch nor vLLM.
"""

from __future__ import annotations

import os

TRAINER_CORES_ENV = "VF_RL_CPU_CORES"
SERVER_CORES_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def format_cpu_list(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the list syntax of taskset, numactl and vLLM)."""
    parts, cores = [], sorted(cores)
    start = prev = cores[0]
    for core in [*cores[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(parts)


def parse_cpu_list(text: str) -> set[int]:
    """``"0-2,5"`` -> ``{0, 1, 2, 5}``.

    Raises:
        ValueError: not a list of core ids and ``a-b`` ranges."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            first, last = int(low), int(high or low)
            if first < 0 or last < first:
                raise ValueError
            cores.update(range(first, last + 1))
    except ValueError:
        raise ValueError(f"{TRAINER_CORES_ENV}={text!r}: expected core ids and ranges such as 1 or 2-3,6, "
                         f"or 'all'") from None
    return cores


def split_cpu_cores(available: list[int] | None = None) -> tuple[str, str] | None:
    """The server's and the trainer's cores as CPU lists: the first half (at least one core)
    and the rest of ``available`` (default: the cores this process may run on). ``None`` with
    fewer than 2 cores: both sides share the one there is."""
    cores = sorted(os.sched_getaffinity(0) if available is None else available)
    if len(cores) < 2:
        return None
    half = len(cores) // 2
    return format_cpu_list(cores[:half]), format_cpu_list(cores[half:])


def cpu_side_env(environ: dict[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """The pane environment additions (server, trainer) of a run with both sides on the CPU;
    a side whose variable is already set in ``environ`` (default ``os.environ``) gets nothing."""
    environ = os.environ if environ is None else environ
    split = split_cpu_cores()
    if split is None:
        return {}, {}
    server = {} if SERVER_CORES_ENV in environ else {SERVER_CORES_ENV: split[0]}
    trainer = {} if TRAINER_CORES_ENV in environ else {TRAINER_CORES_ENV: split[1]}
    return server, trainer


def apply_trainer_cores() -> set[int] | None:
    """Pin this process to ``VF_RL_CPU_CORES`` (unset or ``all``: nothing changes) and default
    ``OMP_NUM_THREADS`` to that many threads. Call before torch is imported, so that its thread
    pool is sized for those cores. Returns the cores, or None.

    Raises:
        ValueError: a malformed value, or cores this process may not use (one line)."""
    text = os.environ.get(TRAINER_CORES_ENV, "").strip()
    if not text or text == "all":
        return None
    cores = parse_cpu_list(text)
    allowed = os.sched_getaffinity(0)
    if not cores <= allowed:
        raise ValueError(f"{TRAINER_CORES_ENV}={text!r}: {format_cpu_list(sorted(cores - allowed))} not among the "
                         f"cores this process may use ({format_cpu_list(sorted(allowed))})")
    os.sched_setaffinity(0, cores)
    os.environ.setdefault("OMP_NUM_THREADS", str(len(cores)))
    return cores
