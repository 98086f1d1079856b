"""Shared fixtures: the prepared SmolLM2 model and one real vf-vllm server (CPU) per session."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from vf_rl.config.cpus import SERVER_CORES_ENV, TRAINER_CORES_ENV, format_cpu_list, split_cpu_cores


def worker_cores() -> list[int]:
    """This test process's share of the cores: under pytest-xdist, worker ``i`` of ``n`` gets every
    ``n``-th core from core ``i`` (all of them when there are fewer cores than workers); otherwise every core."""
    cores = sorted(os.sched_getaffinity(0))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if count < 2 or len(cores) < count:
        return cores
    return cores[int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")) % count::count]


# The servers the tests start get the first half of this process's cores and every vf-train they run
# the rest, as `vf-rl` splits a CPU run (vf_rl.config.cpus): both on every core, their OpenMP threads wait
# on each other and a step of the CPU demo's size took 50 s instead of 9. Two xdist workers on two
# cores each keep to their own core (server, trainer and the worker's own torch): spread over both,
# one worker's threads spin while the other's compute, and some tests ran five times slower.
SHARE = worker_cores()
CORES = split_cpu_cores(SHARE)
if CORES is not None:
    os.environ.setdefault(TRAINER_CORES_ENV, CORES[1])
elif len(SHARE) < len(os.sched_getaffinity(0)):
    os.environ.setdefault(SERVER_CORES_ENV, format_cpu_list(SHARE))
    os.environ.setdefault(TRAINER_CORES_ENV, format_cpu_list(SHARE))
    os.environ.setdefault("OMP_NUM_THREADS", str(len(SHARE)))  # before torch is imported: its pool's size

from vf_rl.inference.communicator import free_port  # noqa: E402, F401  (re-exported for the tests)

# Two pytest-xdist workers each hold a session server while their tests start more (a vf-rl run's own,
# the LoRA and scale-out modules'): 1 GiB of KV cache per server (~23k tokens at max_model_len 1024, room
# for every test's batch) instead of vf-vllm's CPU default of 2 keeps them all within a 24 GiB machine.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def classic_verifiers() -> bool:
    """Whether the ``verifiers`` this process imports has the classic API (0.2-0.3): the set-up's
    is 0.4 (v1 only); ``PYTHONPATH=.venv/verifiers-classic`` puts 0.3.1 first (scripts/test.sh)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verifiers").startswith(("0.2.", "0.3."))
    except PackageNotFoundError:
        return False


def pytest_collection_modifyitems(config, items):
    """Tests marked ``classic`` need verifiers' classic API: without it they are skipped, with the
    command that runs them (CI's second pass does)."""
    if classic_verifiers():
        return
    skip = pytest.mark.skip(reason="needs verifiers 0.2-0.3 (the classic API): PYTHONPATH=.venv/verifiers-classic "
                                   "pytest -m classic (scripts/test.sh's second pass)")
    for item in items:
        if "classic" in item.keywords:
            item.add_marker(skip)


LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
PR_SET_PDEATHSIG = 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After each test (its fixtures' teardown included), free what it left to the allocator and hand the
    free heap back to the system (glibc's ``malloc_trim``): a worker that trained a model in-process
    otherwise keeps ~3 GiB resident for the rest of the session, and two such workers beside the servers
    the later modules start ran a 24 GiB machine out of memory."""
    yield
    gc.collect()
    if hasattr(LIBC, "malloc_trim"):
        LIBC.malloc_trim(0)


def mem_available_gib() -> float:
    """The system's available memory (``MemAvailable``), GiB."""
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable")) / 2**20


def wait_for_memory(gib: float = 4.0, timeout_s: float = 300.0) -> None:
    """Wait (``timeout_s`` at most, then go on) until ``gib`` of memory is available: a server started
    while the other worker's run is at its peak is what runs the machine out of memory."""
    deadline = time.monotonic() + timeout_s
    while mem_available_gib() < gib and time.monotonic() < deadline:
        time.sleep(5)


def die_with_this_thread() -> None:
    """``preexec_fn`` for a server: its own session (stopped as a process group), and ``SIGTERM`` when the
    thread that started it dies (``PR_SET_PDEATHSIG``), so that a worker killed mid-run (out of memory, a
    timeout) leaves no server behind for its replacement to compete with."""
    os.setsid()
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C stops it, as in a pane, whatever this worker ignores


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from vf_rl.launcher.prepare_model import default_model_dir, prepare

    return prepare(default_model_dir())


def write_cpu_config(path: Path, model_dir: Path, out: Path, port: int, env_id: str = "reverse-text",
                     inference_args: dict | None = None, env_args: dict | None = None, **trainer_args) -> Path:
    """Write a vf-rl TOML config for SmolLM2 on the CPU: reverse-text from its offline data with
    ``few_shot = 2`` (or ``env_args``), ``output_dir = out``, the server at ``port``; ``trainer_args`` added to (or
    replacing) ``[trainer.args]``. Returns ``path``."""
    import tomli_w

    inference = {"gpus": 0, **({"args": inference_args} if inference_args else {})}
    args = {"output_dir": str(out), "max_seq_len": 256, "learning_rate": 1e-4, "vllm_server_port": port,
            **trainer_args}
    path.write_text(tomli_w.dumps({"model": str(model_dir),
                                   "env": {"id": env_id, "args": {"few_shot": 2, "source": "offline"} if env_args is None
                                           else env_args},
                                   "inference": inference, "trainer": {"gpus": 0, "args": args}}))
    return path


class Server:
    def __init__(self, port: int, model: str, process: subprocess.Popen, log: Path):
        self.port, self.model, self.process, self.log = port, model, process, log
        self.base_url = f"http://127.0.0.1:{port}"


def start_server(model_dir: Path, workdir: Path, *extra: str, env: dict | None = None):
    """Start a real vf-vllm (vLLM CPU build) serving ``model_dir`` on a free port (``env`` added
    to its environment); yield a :class:`Server`, then stop it."""
    port = free_port()
    log = workdir / "server.log"
    env = {**os.environ, "VLLM_CACHE_ROOT": str(workdir / "cache"), "PYTHONUNBUFFERED": "1",
           **({SERVER_CORES_ENV: CORES[0]} if CORES and SERVER_CORES_ENV not in os.environ else {}), **(env or {})}
    argv = [sys.executable, "-m", "vf_rl.inference.server", "--model", str(model_dir), "--port", str(port),
            "--enforce-eager", "--max-model-len", "1024", *extra]
    wait_for_memory()
    # the death signal follows the thread that starts the server: only the main thread lives for the session
    on_main = threading.current_thread() is threading.main_thread()
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=not on_main, preexec_fn=die_with_this_thread if on_main else None)
    deadline = time.monotonic() + 400
    while True:
        if process.poll() is not None:
            pytest.fail(f"vf-vllm exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"vf-vllm not ready in 400 s:\n{log.read_text()[-3000:]}")
        time.sleep(2)
    yield Server(port, str(model_dir), process, log)
    os.killpg(process.pid, 15)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)


@pytest.fixture(scope="session")
def server(model_dir, tmp_path_factory) -> Server:
    """A real vf-vllm (vLLM CPU build) serving SmolLM2-135M-Instruct on a free port."""
    yield from start_server(model_dir, tmp_path_factory.mktemp("vf-vllm"), "--enable-auto-tool-choice",
                            "--tool-call-parser", "hermes")


@pytest.fixture(scope="session")
def base_weights(model_dir, tmp_path_factory) -> Path:
    """The base model's weights exported once per session (one 540 MB file, not one per test)."""
    import torch
    from transformers import AutoModelForCausalLM

    from vf_rl.trainer.weights import export_weights

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    directory = tmp_path_factory.mktemp("base-weights")
    export_weights(base, directory)
    return directory


@pytest.fixture
def restore_base_weights(server, base_weights):
    """For runs that push trained weights to the shared server: put the base weights back."""
    yield
    from vf_rl.inference.client import InferenceClient

    InferenceClient(port=server.port).update_weights(str(base_weights))


def run_vf_eval(server: Server, env_id: str, env_args: dict, out: Path, max_tokens: int = 16,
                timeout: float = 300) -> subprocess.CompletedProcess:
    """``vf-eval ENV_ID`` against the session's server: 2 examples x 2 rollouts, rollouts to ``out``."""
    import json

    return subprocess.run([sys.executable, "-m", "vf_rl.launcher.eval", env_id, "-m", server.model,
                           "--base-url", f"{server.base_url}/v1", "-n", "2", "-r", "2", "-t", str(max_tokens),
                           "-a", json.dumps(env_args), "-o", str(out)], capture_output=True, text=True, timeout=timeout)


def assert_rollouts_well_formed(rollouts, max_turns: int | None = None, max_reward: float = 1.0) -> None:
    """Checks every rollout against a real server must pass: no error, reward in range, one
    assistant message per model turn, and token ids and log-probs of equal, non-zero length."""
    for r in rollouts:
        assert r.error is None, r.error
        assert 0.0 <= r.reward <= max_reward
        assert len([m for m in r.completion if m["role"] == "assistant"]) == len(r.turns)
        if max_turns is not None:
            assert len(r.turns) <= max_turns
        for turn in r.turns:
            assert len(turn.completion_ids) == len(turn.completion_logprobs) > 0
