"""Kill the vLLM engine process (or the trainer) of a running ``vf-rl`` run with SIGKILL, mid-generation or mid-push.

    python3 scripts/gpu/kill_engine.py --run-dir OUTPUT_DIR --port PORT --step N --when generating|pushing
        [--kill engine|trainer]

Waits until the run's ``metrics.jsonl`` has step ``N``, then finds the engine processes (``VLLM::EngineCore``)
under the ``vf-vllm`` listening on ``PORT`` and kills them, the API server left alive, as a CUDA fault or the
kernel's OOM killer would end the engine:

- ``generating``: as soon as vLLM's ``/metrics`` shows requests running;
- ``pushing``: once a batch's requests have all finished (the trainer takes the batch and pushes the weights it
  is to be generated with next), the engine is stopped (SIGSTOP) so that the push cannot finish, and killed
  3 s later with the push in flight.

``--kill trainer`` kills the run's ``vf-train`` process (the one reading ``OUTPUT_DIR/resolved.toml``) instead,
the same way: with ``pushing`` it is stopped as the batch drains (an ``nccl`` push under way: the vLLM workers
wait in the broadcast) and killed 3 s later.

Prints one line per event (JSON) and exits 0 once the kill is done, 1 if the run ended first.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil


def logged_step(metrics: Path) -> int:
    """The last step of ``metrics.jsonl`` with a reward (0 before the first)."""
    steps = [0]
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "reward" in record:
                steps.append(int(record.get("step", 0)))
    return max(steps)


def running_requests(port: int) -> float | None:
    """vLLM's ``vllm:num_requests_running`` (summed over engines), or ``None`` while unreachable."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def gpu_pids() -> set[int]:
    """The processes nvidia-smi lists on any GPU (none where it is missing)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {int(line) for line in out.split() if line.strip().isdigit()}


def engines(port: int) -> list[psutil.Process]:
    """The engine processes under the process that listens on ``port``: those titled
    ``VLLM::EngineCore`` (vLLM sets the title where ``setproctitle`` is installed), else its
    children forked without an exec (the server's own command line: vf-vllm forks the engine on a
    GPU; multiprocessing's resource tracker and torch's compile workers exec), else its
    descendants that hold a GPU (the API server holds none)."""
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            server = psutil.Process(conn.pid)
            children = server.children(recursive=True)
            named = [p for p in children if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]
            forked = [p for p in server.children() if p.cmdline() == server.cmdline()]
            on_gpu = gpu_pids()
            return named or forked or [p for p in children if p.pid in on_gpu]
    return []


def trainers(run_dir: Path) -> list[psutil.Process]:
    """The run's ``vf-train`` processes: those whose argv runs the trainer on ``run_dir/resolved.toml``."""
    resolved = str(run_dir.resolve() / "resolved.toml")
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        argv = p.info["cmdline"] or []
        if any(a.endswith(("vf-train", "vf_rl.trainer.cli")) and argv[i + 1:i + 3] == ["@", resolved]
               for i, a in enumerate(argv)):
            found.append(psutil.Process(p.info["pid"]))
    return found


def say(event: str, **fields) -> None:
    print(json.dumps({"t": round(time.time(), 3), "event": event, **fields}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--when", choices=["generating", "pushing"], required=True)
    parser.add_argument("--kill", choices=["engine", "trainer"], default="engine")
    parser.add_argument("--timeout", type=float, default=900.0)
    a = parser.parse_args()
    find = (lambda: engines(a.port)) if a.kill == "engine" else (lambda: trainers(a.run_dir))
    deadline = time.monotonic() + a.timeout
    while logged_step(a.run_dir / "metrics.jsonl") < a.step:
        if time.monotonic() > deadline or (a.run_dir / "summary.json").exists():
            say("run ended first")
            return 1
        time.sleep(0.1)
    say("step logged", step=a.step)
    seen_running = False
    while time.monotonic() < deadline:
        running = running_requests(a.port)
        if running:
            seen_running = True
        if a.when == "generating" and running:
            targets = find()
            for p in targets:
                os.kill(p.pid, signal.SIGKILL)
            say("killed mid-generation", kill=a.kill, running=running, pids=[p.pid for p in targets])
            return 0 if targets else 1
        if a.when == "pushing" and seen_running and running == 0:
            targets = find()
            for p in targets:
                os.kill(p.pid, signal.SIGSTOP)
            say("stopped after the batch drained", pids=[p.pid for p in targets])
            time.sleep(3)
            for p in targets:
                os.kill(p.pid, signal.SIGKILL)
            say("killed mid-push", kill=a.kill, pids=[p.pid for p in targets])
            return 0 if targets else 1
        time.sleep(0.01)
    say("timed out")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
