#!/usr/bin/env python
"""Soak test: a vf-rl run, disturbed on purpose, must end as an undisturbed run would.

    .venv/bin/python scripts/soak.py configs/vf-rl/reverse-text-cpu.toml --minutes 60 [--seed 0]

Runs ``vf-rl @ CONFIG --wait`` (real tmux, real vLLM) into a fresh output directory and, at
random moments (``--server-every`` / ``--trainer-every`` seconds on average):

* kills the inference server with SIGKILL, as an OOM kill would (vf-rl restarts it and the
  trainer generates the batch in flight again);
* kills the trainer with SIGKILL, then resumes with ``vf-rl @ CONFIG --resume --wait``.

It stops disturbing after ``--minutes`` and lets the run finish. Then it checks what an
undisturbed run would have left: every step 1..max_steps logged exactly once in
``metrics.jsonl`` and ``batches.jsonl``, and the dataset rows of every step equal to the rows
the config's seed gives (``batching.prompt_rows`` + ``orchestrator.batch_rows``). Prints a
summary (duration, kills, steps, steps lost) and exits 0 only when nothing was lost.
Not part of CI (it runs for as long as you ask); sends traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from vf_rl.config.schema import load_config
from vf_rl.parent_watch import kill_tree


def jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def pids(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_for_port(port: int, timeout: float = 120.0) -> None:
    """Until the stopped server has released ``port`` (vf-rl refuses a port in use)."""
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return
            except OSError:
                time.sleep(1.0)


def expected_rows(config_path: Path) -> list[list]:
    """The dataset rows (``row_id``) of every step, as the config's seed gives them."""
    from transformers import AutoTokenizer

    from vf_rl import load_environment
    from vf_rl.orchestrator.orchestrator import batch_rows
    from vf_rl.orchestrator.samples import prompt_rows

    config = load_config(config_path)
    a = config.trainer.args
    env = load_environment(config.env.id, **config.env.args)
    rows = prompt_rows(env.get_dataset(), AutoTokenizer.from_pretrained(config.model), a["max_prompt_len"],
                       a.get("seed", 42) if a["shuffle_dataset"] else None)
    per_batch = a["batch_size"] // a["rollouts_per_example"]
    return [[r["row_id"] for r in batch_rows(rows, step, per_batch)] for step in range(a["max_steps"])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--minutes", type=float, default=60.0, help="how long to keep disturbing the run")
    parser.add_argument("--max-steps", type=int, default=None, help="override trainer.args.max_steps")
    parser.add_argument("--server-every", type=float, default=300.0, help="mean seconds between server kills")
    parser.add_argument("--trainer-every", type=float, default=900.0, help="mean seconds between trainer kills")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="run directory (default: a new temporary one)")
    opts = parser.parse_args(argv)
    rng = random.Random(opts.seed)

    out = opts.out or Path(tempfile.mkdtemp(prefix="vf-rl-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    load_config(opts.config)  # validated as vf-rl would
    import tomllib

    data = tomllib.loads(opts.config.read_text())
    data["model"] = str(Path(data["model"]).expanduser()) if data["model"].startswith("~") else data["model"]
    data["trainer"]["args"] = {**data["trainer"]["args"], "output_dir": str(out / "run"), "save_steps": 2}
    if opts.max_steps:
        data["trainer"]["args"]["max_steps"] = opts.max_steps
    config = out / "soak.toml"
    config.write_text(tomli_w.dumps(data))
    run_config = load_config(config)
    max_steps = run_config.trainer.args["max_steps"]
    _, port = run_config.server_address()
    session = f"vf-rl-soak-{port}"
    run_dir = out / "run"
    resolved = run_dir.resolve() / "resolved.toml"  # what both panes read: it names their processes
    print(f"soak: {config} -> {run_dir}, {max_steps} steps, disturbing for {opts.minutes:.0f} min", flush=True)

    start = time.monotonic()
    stop_disturbing = start + opts.minutes * 60
    kills = {"server": 0, "trainer": 0}
    launches = 0
    next_server = start + rng.expovariate(1 / opts.server_every)
    next_trainer = start + rng.expovariate(1 / opts.trainer_every)
    while True:
        argv = [sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "-s", session, "--wait"]
        if launches and any(run_dir.glob("checkpoint-*")):  # killed before the first checkpoint: start over
            argv.insert(-1, "--resume")
        launches += 1
        run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while run.poll() is None:
            now = time.monotonic()
            logged = [r["step"] for r in jsonl(run_dir / "metrics.jsonl") if "reward" in r]
            if now < stop_disturbing and logged and now >= next_server:
                for pid in pids(f"vf-vllm @ {resolved}|vf_rl.inference.server @ {resolved}")[:1]:
                    kill_tree(pid)
                    kills["server"] += 1
                    print(f"soak: {now - start:.0f} s: killed the inference server (after step {max(logged)})",
                          flush=True)
                next_server = now + rng.expovariate(1 / opts.server_every)
            if now < stop_disturbing and logged and now >= next_trainer:
                for pid in pids(f"vf_rl.trainer.cli @ {resolved}|vf-train @ {resolved}")[:1]:
                    os.kill(pid, signal.SIGKILL)
                    kills["trainer"] += 1
                    print(f"soak: {now - start:.0f} s: killed the trainer (after step {max(logged)})", flush=True)
                next_trainer = now + rng.expovariate(1 / opts.trainer_every)
            time.sleep(1.0)
        output = run.stdout.read()
        if run.returncode == 0:
            break
        if launches > kills["trainer"] + 3:
            print(f"soak: vf-rl failed without a trainer kill:\n{output[-3000:]}", flush=True)
            return 1
        print(f"soak: vf-rl exited with status {run.returncode}; resuming", flush=True)
        wait_for_port(port)

    minutes = (time.monotonic() - start) / 60
    steps = [r["step"] for r in jsonl(run_dir / "metrics.jsonl") if "reward" in r]
    batches = jsonl(run_dir / "batches.jsonl")
    expected = expected_rows(config)
    rows_ok = [b["rows"] for b in batches] == expected
    lost = max_steps - len(set(steps))
    restarts = len((run_dir / "logs" / "inference.restarts").read_text().splitlines()) \
        if (run_dir / "logs" / "inference.restarts").exists() else 0
    print(f"soak: {minutes:.1f} min, {kills['server']} server kills ({restarts} restarts in the last launch), "
          f"{kills['trainer']} trainer kills ({launches - 1} resumes); steps logged {len(steps)} "
          f"(unique {len(set(steps))} of {max_steps}), steps lost {lost}; "
          f"rows per step {'identical to' if rows_ok else 'DIFFERENT from'} an undisturbed run", flush=True)
    ok = lost == 0 and steps == list(range(1, max_steps + 1)) and rows_ok
    if ok and opts.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
