#!/usr/bin/env python
"""The rollout request path alone: seconds per batch of ``--prompts`` x ``--rollouts`` rollouts
through the environment (``Orchestrator.run``, the trainer's own path and sampling arguments)
against a vf-vllm server, for each request path of ``--paths``:

- ``chat-thread``: one chat completion per rollout, the orchestrator a thread in this process;
- ``group-thread``: one completion request per group (``env_api/group_sampling.py``), a thread;
- ``group-process``: one request per group, the orchestrator in its own process (the default
  of ``vf-train``, ``orchestrator/process.py``);

under three conditions:

- ``idle``: nothing else runs;
- ``busy-thread``: one Python thread spins in this process (the trainer's Python beside the
  rollout client);
- ``gpu-load``: another process keeps the GPU busy with matrix products (GPU only).

    python benchmarks/generation.py --serve --model ~/.cache/vf-rl/models/SmolLM2-135M-Instruct \\
        --vllm-args "--enforce-eager --max-model-len 1024" --prompts 4 --max-tokens 24 --rounds 3   # CPU
    python benchmarks/generation.py --serve --model /tmp/smol --vllm-args "--gpu-memory-utilization 0.3" \\
        --json results/generation-h100.json                                      # GPU, 16 x 8, 128 tokens

``--servers N`` starts N servers on the same device(s) and spreads each batch's groups over them
(several vLLM engines on one GPU: each engine's per-step host work covers a part of the batch).

Prints per path and condition the median (min-max) seconds per batch after ``--warmup`` rounds, the
completion tokens per second, the milliseconds per token of each batch's longest rollout (a batch
lasts at least that rollout's decode steps) and, on a GPU, the share of the time it ran a kernel;
``--json`` writes them with the settings. The rows are reverse-text's (``few_shot = 2``, offline)
by default (``--env``, ``--env-args``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

GPU_LOAD = ("import torch\nx = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
            "while True:\n    x = (x @ x).clamp_(-1, 1)\n")


class BusyThread:
    """A Python thread that spins until stopped (holds the GIL as a training step's Python does)."""

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self):
        n = 0
        while not self._stop.is_set():
            n = (n * 31 + 7) % 1000003

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class GpuLoad:
    """Another process that keeps the GPU busy."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", GPU_LOAD], start_new_session=True)
        time.sleep(5)
        return self

    def __exit__(self, *exc):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class GpuBusy:
    """The GPU's busy share while the block runs: nvidia-smi's ``utilization.gpu`` (the share of
    each sample period in which a kernel ran) every 100 ms on the first visible GPU, averaged;
    ``share`` stays ``None`` without nvidia-smi (the CPU)."""

    def __enter__(self):
        self.share, self.process = None, None
        if shutil.which("nvidia-smi"):
            gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
            self.process = subprocess.Popen(["nvidia-smi", "-i", gpu, "--query-gpu=utilization.gpu",
                                             "--format=csv,noheader,nounits", "-lms", "100"],
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        if self.process is not None:
            self.process.terminate()
            out, _ = self.process.communicate()
            samples = [float(line) for line in out.split() if line.replace(".", "", 1).isdigit()]
            self.share = statistics.fmean(samples) / 100 if samples else None


def measure(orchestrator, rows: list[dict], rollouts: int, rounds: int, warmup: int) -> dict:
    """Seconds per batch and completion tokens per second of ``rounds`` batches after ``warmup``;
    ``ms_per_longest_token``: a batch's seconds over its longest rollout's completion tokens (all its
    turns), the decode steps the batch cannot finish sooner than; ``gpu_busy``: :class:`GpuBusy`
    over the timed rounds."""
    def batch():
        rollouts_done = orchestrator.run(rows, rollouts)
        errors = [r.error for r in rollouts_done if r.error]
        if errors:
            raise RuntimeError(f"{len(errors)} rollouts failed; first: {errors[0]}")
        return rollouts_done

    seconds, tokens, longest = [], [], []
    for _ in range(warmup):
        batch()
    with GpuBusy() as busy:
        for _ in range(rounds):
            start = time.perf_counter()
            done = batch()
            seconds.append(time.perf_counter() - start)
            lengths = [sum(len(t.completion_ids) for t in r.turns) for r in done]
            tokens.append(sum(lengths))
            longest.append(max(max(lengths), 1))
    return {"s_per_batch": seconds, "median_s": statistics.median(seconds),
            "tokens_per_s": statistics.fmean(t / s for t, s in zip(tokens, seconds)),
            "tokens_per_batch": statistics.fmean(tokens),
            "ms_per_longest_token": statistics.median(1000 * s / n for s, n in zip(seconds, longest)),
            "gpu_busy": busy.share}


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        process.wait(timeout=60)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the served model (name or path)")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="a running vf-vllm (without --serve)")
    p.add_argument("--serve", action="store_true", help="start a vf-vllm for --model and stop it afterwards")
    p.add_argument("--vllm-args", default="", help="more vf-vllm flags with --serve")
    p.add_argument("--servers", type=int, default=1,
                   help="with --serve: this many vf-vllm servers on the same device(s), started one after another, each "
                        "with --vllm-args (give each its share, e.g. --gpu-memory-utilization 0.15 for two); the "
                        "groups of a batch are spread over them as vf-train spreads them over vllm_server_urls")
    p.add_argument("--env", default="reverse-text")
    p.add_argument("--env-args", default='{"few_shot": 2, "source": "offline"}')
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--modes", default=None, help="default: idle,busy-thread (and gpu-load with a GPU)")
    p.add_argument("--paths", default="chat-thread,group-thread,group-process")
    p.add_argument("--json", type=Path)
    opts = p.parse_args(argv)
    from transformers import AutoTokenizer

    from vf_rl import RLConfig, load_environment
    from vf_rl.config.sections import OrchestratorConfig
    from vf_rl.env_api import Environment
    from vf_rl.launcher.eval import start_server
    from vf_rl.orchestrator.orchestrator import Orchestrator
    from vf_rl.orchestrator.process import OrchestratorProcess, env_source
    from vf_rl.orchestrator.samples import prompt_rows

    has_gpu = bool(shutil.which("nvidia-smi")) and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0
    modes = (opts.modes or ("idle,busy-thread,gpu-load" if has_gpu else "idle,busy-thread")).split(",")
    env = load_environment(opts.env, **json.loads(opts.env_args))
    rows = prompt_rows(env.get_dataset(), AutoTokenizer.from_pretrained(opts.model), 512)[:opts.prompts]
    args = RLConfig(output_dir=tempfile.mkdtemp(prefix="vf-rl-generation-"), use_cpu=not has_gpu, report_to="none",
                    batch_size=opts.prompts * opts.rollouts, rollouts_per_example=opts.rollouts,
                    micro_batch_size=opts.rollouts, max_tokens=opts.max_tokens, max_seq_len=opts.max_tokens + 512)
    processes, base_url, server_start_s = [], opts.base_url, []  # launch to /health, seconds, per --serve server
    if opts.serve:  # one after another: a vLLM profiles the GPU's free memory while it starts
        urls = []
        for i in range(opts.servers):
            started = time.perf_counter()
            try:
                process, url = start_server(opts.model, shlex.split(opts.vllm_args),
                                            Path(args.output_dir) / f"vf-vllm-{i}.log")
            except RuntimeError as exc:
                _stop(processes)
                raise SystemExit(f"generation: {exc}") from None
            processes.append(process)
            urls.append(url)
            server_start_s.append(round(time.perf_counter() - started, 1))
            print(f"generation: vf-vllm {i} answered /health {server_start_s[-1]} s after it started", flush=True)
        base_url = urls[0] if len(urls) == 1 else urls
    results = {}
    options = dict(base_url=base_url, model_name=opts.model,
                   config=OrchestratorConfig(batch_size=args.batch_size, rollouts_per_example=opts.rollouts,
                                             sampling_args=args.sampling_args(), max_seq_len=args.max_seq_len))
    try:
        for path in opts.paths.split(","):
            if path == "group-process":
                orchestrator = OrchestratorProcess(env_source(env, options), rows).start(**options)
            elif path in ("chat-thread", "group-thread"):
                thread_env = load_environment(opts.env, **json.loads(opts.env_args))
                if path == "chat-thread":  # the base class's path: one chat completion per rollout
                    thread_env.generate = types.MethodType(Environment.generate, thread_env)
                orchestrator = Orchestrator(thread_env, rows, **options)
            else:
                raise SystemExit(f"--paths: unknown path {path!r} (chat-thread, group-thread, group-process)")
            try:
                for mode in modes:
                    context = {"idle": None, "busy-thread": BusyThread, "gpu-load": GpuLoad}[mode]
                    with context() if context is not None else contextlib.nullcontext():
                        r = results.setdefault(path, {})[mode] = measure(orchestrator, rows, opts.rollouts,
                                                                          opts.rounds, opts.warmup)
                    busy = "" if r["gpu_busy"] is None else f", GPU busy {r['gpu_busy']:.0%}"
                    print(f"{path:13s} {mode:12s} {r['median_s']:.2f} s per batch ({min(r['s_per_batch']):.2f}-"
                          f"{max(r['s_per_batch']):.2f}), {r['tokens_per_s']:.0f} tokens/s, "
                          f"{r['tokens_per_batch']:.0f} tokens per batch, {r['ms_per_longest_token']:.1f} ms per "
                          f"token of the longest rollout{busy}", flush=True)
            finally:
                orchestrator.close()
    finally:
        _stop(processes)
    if opts.json:
        opts.json.write_text(json.dumps({"settings": {k: str(v) if isinstance(v, Path) else v
                                                      for k, v in vars(opts).items()},
                                         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                         "server_start_s": server_start_s, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
