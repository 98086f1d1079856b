#!/usr/bin/env python
"""End to end, side by side: vf-rl (`vf-rl @ config --wait`, real tmux, real vLLM) against TRL's
GRPOTrainer (``loss_type="cispo"``) on the same model, environment, batch and settings.

    python benchmarks/e2e_vs_trl.py --device cpu --steps 12            # CPU: TRL's transformers generate
    python benchmarks/e2e_vs_trl.py --device gpu --steps 100 --trl-vllm server     # 2 GPUs
    python benchmarks/e2e_vs_trl.py --device gpu --steps 100 --trl-vllm colocate --shared   # 1 GPU

Both sides: SmolLM2-135M-Instruct (``vf-rl prepare-model``'s directory, or ``--model``),
reverse-text with ``few_shot = 2`` from the offline data (the same rows in the same order; TRL
scores with the environment's own rubric), ``--prompts`` x ``--rollouts`` rollouts per step,
``--max-tokens``, temperature 1, LoRA ``--lora-rank``/``--lora-alpha`` on the 7 projections,
constant ``--lr``, CISPO with TRL's ``epsilon_high`` set to our ``mask_ratio_high`` (8), grad clip
1, no gradient checkpointing, advantages = reward minus the group mean (TRL:
``scale_rewards="none"``). Not the same: vf-rl generates one step ahead (async, one step
off-policy) while TRL generates, then trains.

Prints, side by side and as ratios vf-rl/TRL: seconds per step (median after ``--warmup``),
rollouts per second, completion tokens per second, the fraction of a step spent waiting for
generation, peak memory (CPU: summed RSS of each side's processes, sampled every second; GPU:
peak allocated per device), and the mean reward of the last 3 steps each side finished by the
time the faster side finished (reward at equal wall time). ``--json`` writes all of it;
``--plot`` draws reward against wall time for both.

Needs TRL (``pip install trl==1.16.0``) in the environment that runs this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def default_model() -> str:
    cache = Path(os.environ.get("VF_RL_CACHE", Path.home() / ".cache" / "vf-rl")).expanduser()
    return str(cache / "models" / "SmolLM2-135M-Instruct")


class RssSampler:
    """Peak of the summed RSS (bytes) of the processes whose command line contains ``marker``
    (or this process's children when ``marker`` is None), sampled every ``period`` seconds."""

    def __init__(self, marker: str | None, period: float = 1.0):
        import psutil

        self.psutil, self.marker, self.period, self.peak = psutil, marker, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _processes(self):
        if self.marker is None:
            return self.psutil.Process().children(recursive=True)
        found = []
        for p in self.psutil.process_iter(["cmdline"]):
            if any(self.marker in part for part in (p.info["cmdline"] or [])):
                found += [p, *p.children(recursive=True)]
        return {p.pid: p for p in found}.values()

    def _run(self):
        while not self._stop.wait(self.period):
            total = 0
            for p in self._processes():
                try:
                    total += p.memory_info().rss
                except self.psutil.Error:
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_vf_rl(opts, out: Path) -> dict:
    """``vf-rl @ config --wait`` in real tmux; per-step records from metrics.jsonl."""
    import tomli_w

    from vf_rl.inference.communicator import free_port

    port = free_port()
    gpus = 1 if opts.device == "gpu" else 0
    inference_args = {"max_model_len": 1024}
    if opts.device == "cpu" or opts.enforce_eager:
        inference_args["enforce_eager"] = True
    config = {
        "model": opts.model,
        "env": {"id": "reverse-text", "args": {"few_shot": 2, "source": "offline"}},
        "inference": {"gpus": gpus, "shared": bool(opts.shared and gpus), "args": inference_args},
        "trainer": {"gpus": gpus, "args": {
            "output_dir": str(out / "vf-rl"), "run_name": "e2e-vf-rl", "vllm_server_port": port,
            "batch_size": opts.prompts * opts.rollouts, "rollouts_per_example": opts.rollouts,
            "micro_batch_size": opts.micro_batch, "max_tokens": opts.max_tokens, "max_seq_len": 512,
            "max_steps": opts.steps, "learning_rate": opts.lr, "lora_rank": opts.lora_rank,
            "lora_alpha": float(opts.lora_alpha), "temperature": 1.0, "save_steps": 10 ** 6, "seed": opts.seed}},
    }
    path = out / "vf-rl.toml"
    path.write_text(tomli_w.dumps(config))
    sampler = RssSampler(f"--port {port}") if opts.device == "cpu" else None
    trainer_sampler = RssSampler(str(path)) if opts.device == "cpu" else None
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "vf_rl.cli.launch", "@", str(path), "-s", f"e2e-{port}", "--wait"],
                            capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak = (sampler.stop() + trainer_sampler.stop()) if sampler else None
    if result.returncode != 0:
        raise RuntimeError(f"vf-rl failed ({result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "vf-rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r and "timing/elapsed_s" in r]
    elapsed = [r["timing/elapsed_s"] for r in steps]
    return {"side": "vf-rl", "wall_s": wall, "peak_rss": peak,
            "step_s": [b - a for a, b in zip([0.0, *elapsed], elapsed)], "elapsed_s": elapsed,
            "reward": [r["reward"] for r in steps],
            "wait_s": [r.get("timing/wait_s", 0.0) for r in steps],
            "completion_tokens": [r.get("tokens/completion", 0.0) * opts.prompts * opts.rollouts for r in steps]}


TRL_SCRIPT = r'''
import asyncio, json, sys, time, resource
from pathlib import Path
opts = json.loads(sys.argv[1])
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from vf_rl import load_environment
from vf_rl.trainer.batching import prompt_rows
from transformers import AutoTokenizer

torch.set_num_threads(max(torch.get_num_threads(), 1))
env = load_environment("reverse-text", few_shot=2, source="offline")
tokenizer = AutoTokenizer.from_pretrained(opts["model"])
rows = prompt_rows(env.get_dataset(), tokenizer, 512, opts["seed"])  # the rows vf-rl uses, in its order
n = opts["prompts"] * (opts["steps"] + 1)
data = Dataset.from_list([{"prompt": rows[i % len(rows)]["prompt"], "answer": rows[i % len(rows)]["answer"]}
                          for i in range(n)])

def rubric_reward(prompts, completions, answer, **kwargs):
    async def score(p, c, a):
        reward, _ = await env.rubric.score(prompt=p, completion=c, answer=a, state={}, info={}, task="default")
        return reward
    async def all_():
        return await asyncio.gather(*(score(p, c, a) for p, c, a in zip(prompts, completions, answer)))
    return list(asyncio.run(all_()))

records, start = [], [None]
class Clock(TrainerCallback):
    def on_train_begin(self, args, state, control, **kw):
        start[0] = time.perf_counter()
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "reward" in logs:
            records.append({"step": state.global_step, "elapsed_s": time.perf_counter() - start[0],
                            "reward": logs["reward"], "completion_length": logs.get("completions/mean_length", 0.0)})

batch = opts["prompts"] * opts["rollouts"]
kwargs = dict(output_dir=opts["out"], per_device_train_batch_size=batch, gradient_accumulation_steps=1,
              num_generations=opts["rollouts"], max_completion_length=opts["max_tokens"], temperature=1.0, top_p=1.0,
              learning_rate=opts["lr"], lr_scheduler_type="constant", beta=0.0, loss_type="cispo", epsilon_high=8.0,
              scale_rewards="none", max_grad_norm=1.0, gradient_checkpointing=False, max_steps=opts["steps"],
              logging_steps=1, save_strategy="no", report_to="none", seed=opts["seed"], shuffle_dataset=False,
              use_cpu=opts["device"] == "cpu", bf16=opts["device"] == "gpu")
if opts["trl_vllm"] != "none":
    kwargs |= dict(use_vllm=True, vllm_mode=opts["trl_vllm"])
    if opts["trl_vllm"] == "server":
        kwargs["vllm_server_base_url"] = opts["trl_server_url"]
        kwargs["vllm_server_timeout"] = 600
    else:
        kwargs["vllm_gpu_memory_utilization"] = 0.3
        kwargs["vllm_max_model_length"] = 1024
        kwargs["vllm_enable_sleep_mode"] = False
config = GRPOConfig(**kwargs)
lora = LoraConfig(r=opts["lora_rank"], lora_alpha=opts["lora_alpha"], lora_dropout=0.0, task_type="CAUSAL_LM",
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
trainer = GRPOTrainer(model=opts["model"], reward_funcs=rubric_reward, args=config, train_dataset=data,
                      processing_class=tokenizer, peft_config=lora, callbacks=[Clock()])
trainer.train()
on_gpu = torch.cuda.is_available()
peak = torch.cuda.max_memory_allocated() if on_gpu else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
Path(opts["out"], "trl.json").write_text(json.dumps({"records": records, "peak": peak}))
'''


def start_trl_server(opts, out: Path) -> subprocess.Popen:
    """``trl vllm-serve`` on GPU 0 (TRL's own server, weight updates over NCCL) for ``--trl-vllm server``."""
    from urllib.parse import urlparse

    url = urlparse(opts.trl_server_url)
    argv = [sys.executable, "-m", "trl.scripts.vllm_serve", "--model", opts.model, "--host", url.hostname,
            "--port", str(url.port), "--gpu_memory_utilization", "0.5", "--max_model_len", "1024"]
    if opts.enforce_eager:
        argv += ["--enforce_eager", "true"]
    log = (out / "trl-vllm.log").open("w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})


def run_trl(opts, out: Path) -> dict:
    """TRL's GRPOTrainer in a subprocess (its own peak memory). On the GPU: ``--trl-vllm server``
    starts ``trl vllm-serve`` on GPU 0 and trains on GPU 1; ``colocate`` and ``none`` use GPU 0."""
    trl_out = out / "trl"
    trl_out.mkdir(parents=True, exist_ok=True)
    args = {**vars(opts), "out": str(trl_out), "model": opts.model}
    env = dict(os.environ)
    server = None
    if opts.device == "gpu":
        from vf_rl.inference.communicator import free_port

        env["CUDA_VISIBLE_DEVICES"] = "1" if opts.trl_vllm == "server" else "0"
        # colocate runs vLLM with the external launcher: one torch.distributed process
        env |= {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port())}
        if opts.trl_vllm == "server":
            server = start_trl_server(opts, out)
    start = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, "-c", TRL_SCRIPT, json.dumps(args, default=str)],
                                capture_output=True, text=True, env=env)
    finally:
        if server is not None:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"TRL failed ({result.returncode}): {result.stderr[-3000:]}")
    data = json.loads((trl_out / "trl.json").read_text())
    records = data["records"]
    elapsed = [r["elapsed_s"] for r in records]
    return {"side": "trl", "wall_s": wall, "peak_rss": data["peak"],
            "step_s": [b - a for a, b in zip([0.0, *elapsed], elapsed)], "elapsed_s": elapsed,
            "reward": [r["reward"] for r in records], "wait_s": None,
            "completion_tokens": [r["completion_length"] * opts.prompts * opts.rollouts for r in records]}


def since_first_step(side: dict) -> list[float]:
    """Each step's end in seconds after step 1 ended: both sides' clocks start at the same point
    (after their server's start-up, model load and first generation), so they compare."""
    return [t - side["elapsed_s"][0] for t in side["elapsed_s"]]


def summary(side: dict, opts, horizon: float) -> dict:
    steps = side["step_s"][opts.warmup:] or side["step_s"]
    step_s = statistics.median(steps)
    rollouts = opts.prompts * opts.rollouts
    tokens = statistics.fmean(side["completion_tokens"][opts.warmup:] or side["completion_tokens"])
    finished = [r for r, t in zip(side["reward"], since_first_step(side)) if t <= horizon + 1e-6]
    wait = (statistics.fmean(w / s for w, s in zip(side["wait_s"][opts.warmup:], steps) if s > 0)
            if side["wait_s"] else None)
    return {"side": side["side"], "step_s": step_s, "rollouts_per_s": rollouts / step_s,
            "completion_tokens_per_s": tokens / step_s, "wait_fraction": wait,
            "peak_gib": side["peak_rss"] / 2**30 if side["peak_rss"] else None,
            "reward_at_equal_wall": statistics.fmean(finished[-3:]) if finished else None,
            "reward_first3": statistics.fmean(side["reward"][:3]), "reward_last3": statistics.fmean(side["reward"][-3:]),
            "steps": len(side["reward"]), "wall_s": side["wall_s"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--model", default=default_model())
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the per-step medians")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=8, help="vf-rl's micro_batch_size")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--shared", action="store_true", help="GPU: vLLM and the trainer on one GPU (vf-rl shared = true)")
    p.add_argument("--enforce-eager", action="store_true", help="GPU: vLLM without CUDA graphs (vf-rl side)")
    p.add_argument("--trl-vllm", choices=["none", "server", "colocate"], default="none",
                   help="TRL's generation: transformers generate (none), trl vllm-serve (server), colocate")
    p.add_argument("--trl-server-url", default="http://127.0.0.1:8001", help="with --trl-vllm server")
    p.add_argument("--sides", default="vf-rl,trl")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="PNG of reward against wall time")
    p.add_argument("--from-json", type=Path, default=None,
                   help="print the table (and --plot) of an earlier run's --json file instead of running")
    opts = p.parse_args(argv)
    if opts.from_json:
        saved = json.loads(opts.from_json.read_text())
        runs = saved["runs"]
        opts = argparse.Namespace(**{**saved["settings"], "json": None, "plot": opts.plot})
    else:
        out = opts.out or Path(tempfile.mkdtemp(prefix="vf-rl-e2e-"))
        out.mkdir(parents=True, exist_ok=True)
        runs = {}
        for name in opts.sides.split(","):
            print(f"e2e: running {name} ...", flush=True)
            runs[name] = (run_vf_rl if name == "vf-rl" else run_trl)(opts, out)
    horizon = min(since_first_step(r)[-1] for r in runs.values())
    rows = {name: summary(r, opts, horizon) for name, r in runs.items()}
    keys = ["step_s", "rollouts_per_s", "completion_tokens_per_s", "wait_fraction", "peak_gib", "reward_at_equal_wall",
            "reward_first3", "reward_last3", "steps", "wall_s"]
    print(f"\n{opts.prompts} prompts x {opts.rollouts} rollouts, max_tokens {opts.max_tokens}, LoRA r{opts.lora_rank}/"
          f"{opts.lora_alpha}, lr {opts.lr}, {opts.steps} steps, device {opts.device}, median after {opts.warmup} warm-up "
          f"steps; reward at equal wall time = mean of the last 3 steps done {horizon:.0f} s after step 1")
    print("| metric | " + " | ".join(rows) + (" | vf-rl / trl |" if len(rows) == 2 else " |"))
    print("|---" * (len(rows) + 1 + (len(rows) == 2)) + "|")
    for key in keys:
        values = [rows[n][key] for n in rows]
        cells = ["-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in values]
        ratio = ""
        if len(values) == 2 and all(isinstance(v, (int, float)) and v for v in values):
            ratio = f" | {values[0] / values[1]:.2f}x"
        elif len(values) == 2:
            ratio = " | -"
        print(f"| {key} | " + " | ".join(cells) + ratio + " |")
    if opts.json:
        opts.json.write_text(json.dumps({"settings": vars(opts), "summary": rows, "runs": runs}, default=str, indent=1))
    if opts.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for name, r in runs.items():
            ax.plot(since_first_step(r), r["reward"], marker=".", label=name)
        ax.set_xlabel("wall time after step 1 (s)")
        ax.set_ylabel("mean reward of the step's rollouts")
        ax.set_title(f"reverse-text, SmolLM2-135M, {opts.prompts}x{opts.rollouts} rollouts, {opts.device}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(opts.plot, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
