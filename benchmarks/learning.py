#!/usr/bin/env python
"""Learning per wall-clock second, side by side: vf-rl (`vf-rl @ config --wait`, real tmux, real
vLLM) against TRL's GRPOTrainer (``loss_type="cispo"``) on the same model, environment rows and
order, loss, learning rate, LoRA, sampling and seed.

    python benchmarks/learning.py --env reverse-text --device cpu --minutes 10 --prompts 4 --max-tokens 24
    python benchmarks/learning.py --env reverse-text --device gpu --minutes 8 --shared \\
        --trl-vllm colocate --sides vf-rl,trl-compile,trl --json results/learning-reverse-text-h100.json

Both sides train for ``--minutes`` of wall clock counted from the end of their own step 1 (so
start-up, model load, the first generation and compilation are not counted; vf-rl stops with
``max_time_s``, TRL with the same rule in a callback), or ``--steps`` steps, whichever comes
first. Each side evaluates the environment's held-out rows (``--eval-examples`` x
``--eval-rollouts``, the same rows for both) before its first step and after its last.

Sides (``--sides``): ``vf-rl``, and TRL sides named ``trl`` plus options joined by ``-``:
``compile`` (``torch_compile=True``), ``liger`` (``use_liger_kernel=True``), ``sleep`` (vLLM sleep
mode in colocate). TRL generates with transformers on the CPU (``--trl-vllm none``) and with
``--trl-vllm colocate`` (one GPU) or ``server`` (``trl vllm-serve`` on GPU 0, training on GPU 1;
with LoRA, TRL 1.16 sends the server its base weights at every sync, so the side copies each merged
tensor before it is sent: see ``TRL_SCRIPT``). ``trl-async`` is TRL's asynchronous trainer
(``trl.experimental.async_grpo.AsyncGRPOTrainer``: rollouts up to ``max_staleness`` weight
versions behind, its own PPO-clip loss; no liger, compile or sleep mode) against the same server,
started as TRL asks for LoRA (``--enable-lora``, ``--max-loras`` for every version in flight, runtime
adapter loading: each sync pushes the adapter, not the merged weights), single-turn environments
only; its FlashAttention-3 kernel comes from the Hugging Face hub, so the side serves its attention
with torch's FlashAttention varlen kernel instead (``varlen_flash_attn``).
The best TRL side is the one with the most rollouts per second; ratios are against it.

Environments (``--env``; the offline data shipped with vf-rl):
``reverse-text`` (``few_shot = 2``, continuous LCS reward), ``gsm8k`` (the shipped synthetic
sample, ``few_shot = 2``, binary reward), ``alphabet-sort`` (two model turns per rollout: TRL's
side runs the environment's own turn loop through GRPOTrainer's ``rollout_func``, each round
of turns one batched generate call on its colocated vLLM, or transformers without vLLM; the
environment's tokens are masked out with ``env_mask`` and the reward is the rubric's),
``fixed-length`` (throughput at a named completion length: reverse-text with every rollout sampled
to ``--max-tokens``, vLLM's ``ignore_eos`` on both sides, ``benchmarks/fixed_length.py``; with
random-weight models of real shapes, ``--full-weights`` or LoRA, ``--no-eval``: the user-size
end-to-end benchmark, ``scripts/gpu/plans/x1-usersize.sh``).

Output: a table (reward at 2/4/8/16/30 minutes: the mean over the steps each side finished in
the 30 s up to then, at least its last 3; held-out reward before and after; time to reach the
best TRL side's final reward; seconds per step, rollouts per second, completion tokens per step and
trained per second (the sampled tokens each step trains on; prompts are not counted, since vf-rl
computes a group's shared prompt once), the share of a step vf-rl waits for generation; peak
memory: CPU summed RSS of each side's processes, GPU ``nvidia-smi`` memory in use above the
idle baseline, sampled every second); ``--json`` in the format of ``benchmarks/results/
learning-*.json``: ``{"settings", "sides": {side: {"rollouts_per_step", "max_tokens", "points":
[[seconds_since_step1, step, reward_mean, eval_reward_or_null], ...], "peak_gib", "settings",
"summary"}}}`` (step 0 is the evaluation before training, at 0 s); ``--plot`` draws reward
against seconds, every side on one plot, held-out rewards as larger markers.

A side whose sampler's log-probs differ from its trainer's by more than ``SAMPLER_GAP_NATS`` per
token (the median of vf-rl's ``logprob_diff/mean``, of TRL's ``sampling/sampling_logp_difference/mean``)
does not generate with the weights it trains: the table says so, the comparison leaves it out,
and the exit status is 3 (after the JSON and plot are written).

Needs TRL (a dependency of vf-rl) in the environment that runs this script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKPOINTS_MIN = (2, 4, 8, 16, 30)
READING_WINDOW_S = 30.0  # the training reward at a checkpoint: the mean over this much wall clock (reward_by)
# A side whose sampler's log-probs differ from its trainer's by more than this (nats per token, median over its steps)
# does not generate with the weights it trains (a broken weight sync, a wrong model in vLLM): not a measurement.
# A working side reads far below it (bf16 kernels and one step of staleness: hundredths of a nat).
SAMPLER_GAP_NATS = 1.0


@dataclass
class EnvSpec:
    """One benchmark environment: its ``load_environment`` arguments and lengths (tokens)."""

    args: dict
    max_tokens: int
    max_seq_len: int
    multi_turn: bool = False
    trainer_args: dict = field(default_factory=dict)
    trl_micro_batch: int | None = None  # TRL's default micro batch here (None: the whole step)
    env_id: str | None = None  # the id both sides load (None: the --env name)
    sampling: dict = field(default_factory=dict)  # vLLM sampling extensions the environment sets (TRL gets them too)


ENVS = {
    "reverse-text": EnvSpec({"few_shot": 2, "source": "offline"}, max_tokens=128, max_seq_len=512),
    "gsm8k": EnvSpec({"few_shot": 2, "source": "offline"}, max_tokens=256, max_seq_len=1024),
    "alphabet-sort": EnvSpec({"source": "offline", "min_turns": 2, "max_turns": 2, "min_names_per_turn": 1,
                              "max_names_per_turn": 2, "few_shot": 1}, max_tokens=128, max_seq_len=1024,
                             multi_turn=True, trl_micro_batch=32),  # one of 128 ran out of memory on an H100
    # throughput at a named completion length: reverse-text with every rollout sampled to max_tokens (vLLM's
    # ignore_eos; benchmarks/fixed_length.py), so that both sides generate and train the same tokens per step
    # (its pre-flight verdict, every rollout cut, is by design: off)
    "fixed-length": EnvSpec({"base": "reverse-text", "few_shot": 2, "source": "offline"}, max_tokens=512,
                            max_seq_len=1024, env_id="fixed_length", sampling={"ignore_eos": True},
                            trainer_args={"preflight": "off"}),
}
BENCHMARKS_DIR = Path(__file__).resolve().parent  # on both sides' PYTHONPATH: benchmark environments (fixed_length)


def env_id(opts, spec: EnvSpec) -> str:
    """The environment id both sides load: the spec's own, else the ``--env`` name."""
    return spec.env_id or opts.env


def seq_len_for(spec: EnvSpec, max_tokens: int) -> EnvSpec:
    """``spec`` with its ``max_seq_len`` longer by what ``max_tokens`` exceeds its own ``max_tokens``
    by: a longer ``--max-tokens`` keeps the room the environment leaves for its prompts."""
    return replace(spec, max_seq_len=spec.max_seq_len + max(0, max_tokens - spec.max_tokens))


def side_env(opts, out: Path, side: str) -> dict[str, str]:
    """The environment variables a side's processes run with: this process's, the side's own
    compile caches (:func:`side_caches`), and this folder first on ``PYTHONPATH`` (the benchmark
    environments' modules)."""
    path = os.pathsep.join(p for p in (str(BENCHMARKS_DIR), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **side_caches(opts, out, side), "PYTHONPATH": path}


def trl_generation_kwargs(opts, spec: EnvSpec) -> dict:
    """``GRPOConfig.generation_kwargs`` for the environment's sampling extensions: vLLM's own names
    when TRL generates with vLLM (``SamplingParams``), transformers' equivalent without
    (``ignore_eos`` -> ``min_new_tokens = max_tokens``).

    Raises:
        ValueError: an extension without a transformers equivalent, on ``--trl-vllm none``."""
    if opts.trl_vllm != "none" or not spec.sampling:
        return dict(spec.sampling)
    unknown = set(spec.sampling) - {"ignore_eos"}
    if unknown:
        raise ValueError(f"--trl-vllm none: no transformers equivalent of {sorted(unknown)}")
    return {"min_new_tokens": opts.max_tokens} if spec.sampling.get("ignore_eos") else {}


def default_model() -> str:
    cache = Path(os.environ.get("VF_RL_CACHE", Path.home() / ".cache" / "vf-rl")).expanduser()
    return str(cache / "models" / "SmolLM2-135M-Instruct")


class PeakSampler:
    """Peak memory in bytes, sampled every ``period`` seconds in a thread.

    ``gpu``: ``nvidia-smi``'s memory in use, summed over the GPUs this process sees
    (``CUDA_VISIBLE_DEVICES`` when set, so that runs on other GPUs of the host do not count),
    above what was in use when the sampler started. Otherwise the summed RSS of the processes
    whose command line contains ``marker`` and their children (shared pages count once per
    process)."""

    def __init__(self, gpu: bool, marker: str = "", period: float = 1.0):
        import psutil

        self.psutil, self.gpu, self.marker, self.period, self.peak = psutil, gpu, marker, period, 0
        self.baseline = self._gpu_used() if gpu else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _gpu_used() -> int:
        return sum(int(used) for used, in nvidia_smi("memory.used")) * 2**20

    def _rss(self) -> int:
        found = []
        for p in self.psutil.process_iter(["cmdline"]):
            if any(self.marker in part for part in (p.info["cmdline"] or [])):
                try:
                    found += [p, *p.children(recursive=True)]
                except self.psutil.Error:  # it or a child ended while being listed
                    found.append(p)
        total = 0
        for p in {p.pid: p for p in found}.values():
            try:
                total += p.memory_info().rss
            except self.psutil.Error:
                pass
        return total

    def _run(self):
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, self._gpu_used() - self.baseline if self.gpu else self._rss())

    def stop(self) -> float:
        """Stop sampling; the peak in GiB."""
        self._stop.set()
        self._thread.join()
        return self.peak / 2**30


def trl_options(side: str) -> dict:
    """``trl-compile-liger`` -> ``{"torch_compile": True, "use_liger_kernel": True}``.

    Raises:
        ValueError: an unknown option."""
    known = {"compile": "torch_compile", "liger": "use_liger_kernel", "sleep": "vllm_enable_sleep_mode"}
    parts = side.split("-")[1:]
    if side == "trl-async":  # TRL's asynchronous trainer: none of the options above apply to it
        return {"async": True}
    unknown = [p for p in parts if p not in known]
    if side.split("-")[0] != "trl" or unknown:
        raise ValueError(f"--sides: {side!r} is not vf-rl, trl[-compile][-liger][-sleep] or trl-async")
    return {known[p]: True for p in parts}


# --- vf-rl ------------------------------------------------------------------------------------

def default_trl_micro_batch(spec: EnvSpec, step: int) -> int | None:
    """TRL's micro batch (rollouts) when ``--trl-micro-batch`` is not given: the environment's own
    (``EnvSpec.trl_micro_batch``) where it is smaller than the step of ``step`` rollouts and divides it,
    else ``None`` (the whole step in one)."""
    micro = spec.trl_micro_batch
    return micro if micro and micro < step and step % micro == 0 else None


def toml_pairs(pairs: list[str], option: str = "--vf-arg") -> dict:
    """``["max_off_policy_steps=2", 'loss_type="dapo"']`` -> ``{"max_off_policy_steps": 2, ...}``
    (each value a TOML value): extra ``[trainer.args]`` (``--vf-arg``) or environment
    arguments (``--env-arg``)."""
    import tomllib

    try:
        return tomllib.loads("\n".join(pairs))
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"{option}: expected KEY=VALUE with a TOML value ({exc})") from None


def vf_rl_config(opts, spec: EnvSpec, out: Path, port: int) -> dict:
    """The vf-rl side's config (the TOML ``vf-rl @`` reads): the shared settings, then the
    environment's trainer arguments, then ``--vf-arg`` ([trainer.args]) and ``--vllm-arg``
    ([inference.args])."""
    gpus = 1 if opts.device == "gpu" else 0
    inference_args = {"max_model_len": spec.max_seq_len + 512}
    if opts.device == "cpu" or opts.enforce_eager:
        inference_args["enforce_eager"] = True
    if opts.shared and gpus:
        inference_args["gpu_memory_utilization"] = opts.vllm_memory
    inference_args |= toml_pairs(opts.vllm_arg, "--vllm-arg")
    adapter = {"use_lora": False} if opts.full_weights else {"lora_rank": opts.lora_rank,
                                                              "lora_alpha": float(opts.lora_alpha)}
    evaluation = {"eval_strategy": "no"} if opts.no_eval else {
        "eval_strategy": "steps", "eval_steps": opts.eval_every, "num_eval_examples": opts.eval_examples,
        "eval_rollouts_per_example": opts.eval_rollouts}
    args = {"output_dir": str(out / "vf-rl"), "run_name": f"learning-{opts.env}", "vllm_server_port": port,
            "batch_size": opts.prompts * opts.rollouts, "rollouts_per_example": opts.rollouts,
            "micro_batch_size": opts.micro_batch, "max_tokens": opts.max_tokens, "max_seq_len": spec.max_seq_len,
            "max_steps": opts.steps, "max_time_s": opts.minutes * 60.0, "learning_rate": opts.lr, **adapter,
            "temperature": 1.0, "save_steps": 10 ** 6, "seed": opts.seed, **evaluation,
            **spec.trainer_args, **toml_pairs(opts.vf_arg)}
    return {"model": opts.model, "env": {"id": env_id(opts, spec), "args": spec.args},
            "inference": {"gpus": gpus, "shared": bool(opts.shared and gpus), "args": inference_args},
            "trainer": {"gpus": gpus, "args": args}}


def run_vf_rl(opts, spec: EnvSpec, out: Path) -> dict:
    """``vf-rl @ config --wait`` in real tmux; points from ``metrics.jsonl``."""
    import tomli_w

    from vf_rl.inference.communicator import free_port

    port = free_port()
    gpus = 1 if opts.device == "gpu" else 0
    config = vf_rl_config(opts, spec, out, port)
    path = out / "vf-rl.toml"
    path.write_text(tomli_w.dumps(config))
    # on the CPU: the trainer's and the server's memory (both read <output_dir>/resolved.toml)
    sampler = PeakSampler(gpus > 0, marker=str((out / "vf-rl" / "resolved.toml").resolve()) if not gpus else "")
    metrics = out / "vf-rl" / "metrics.jsonl"
    start = time.perf_counter()
    log = out / "vf-rl.log"
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "vf_rl.launcher.main", "@", str(path), "-s",
                                    f"learning-{port}", "--wait"], stdout=sink, stderr=subprocess.STDOUT,
                                   env=side_env(opts, out, "vf-rl"))
        launch_to_step1 = None
        while process.poll() is None:  # the launch-to-step-1 time, seen from outside
            if launch_to_step1 is None and metrics.exists() and '"reward"' in metrics.read_text():
                launch_to_step1 = time.perf_counter() - start
            time.sleep(0.5)
    wall = time.perf_counter() - start
    peak = sampler.stop()
    if process.returncode != 0:
        raise RuntimeError(f"vf-rl failed ({process.returncode}): {log.read_text()[-3000:]}")
    records = [json.loads(line) for line in (out / "vf-rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r and "timing/elapsed_s" in r]
    evals = {r["step"]: r["eval/reward"] for r in records if "eval/reward" in r}
    trainer_log = out / "vf-rl" / "logs" / "trainer.log"
    return {"wall_s": wall, "peak_gib": peak, "steps": [r["step"] for r in steps],
            "elapsed_s": [r["timing/elapsed_s"] for r in steps], "reward": [r["reward"] for r in steps],
            "wait_s": [r.get("timing/wait_s", 0.0) for r in steps], "evals": evals,
            "logp_diff": [r.get("logprob_diff/mean") for r in steps],
            "completion_tokens": [r.get("tokens/loss") for r in steps],
            "launch_to_step1_s": launch_to_step1, "settings": {"config": config},
            "compile_s": compile_seconds(trainer_log.read_text(errors="replace") if trainer_log.exists() else "")}


def compile_seconds(trainer_log: str) -> float | None:
    """The seconds of the trainer's compile before step 1 (``torch_compile``, ``trainer/speed/warmup.py``'s
    ``compiled in`` line) in a trainer log, None without one (not compiled, or the warm-up failed)."""
    found = re.search(r"torch_compile: compiled in ([0-9.]+) s", trainer_log)
    return float(found.group(1)) if found else None


# --- TRL --------------------------------------------------------------------------------------

TRL_SCRIPT = r'''
import asyncio, json, sys, time
from pathlib import Path
opts = json.loads(sys.argv[1])
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from vf_rl import load_environment
from vf_rl.orchestrator.samples import prompt_rows

env = load_environment(opts["env_id"], **opts["env_args"])
tokenizer = AutoTokenizer.from_pretrained(opts["model"])
rows = prompt_rows(env.get_dataset(), tokenizer, 512, opts["seed"])  # vf-rl's rows, in its order
eval_rows = prompt_rows(env.get_eval_dataset(opts["eval_examples"]), tokenizer, 512)

def columns(row):
    return {"prompt": row["prompt"], "answer": row.get("answer") or "", "info": json.dumps(row.get("info") or {}),
            "task": row.get("task") or "default"}

n = opts["prompts"] * (opts["steps"] + 1)
data = Dataset.from_list([columns(rows[i % len(rows)]) for i in range(n)])
row_of = {json.dumps(r["prompt"], sort_keys=True): r for r in [*rows, *eval_rows]}  # rollout_func gets prompts only

def rubric_reward(prompts, completions, answer, info, task, **kwargs):
    async def score(p, c, a, i, t):
        reward, _ = await env.rubric.score(prompt=p, completion=c, answer=a, state={}, info=json.loads(i), task=t)
        return reward
    async def all_():
        return await asyncio.gather(*(score(*x) for x in zip(prompts, completions, answer, info, task)))
    return list(asyncio.run(all_()))

# --- multi-turn environments: TRL's rollout_func runs the environment's own turn loop -----------------
from types import SimpleNamespace
from vf_rl.env_api import Rollout
from vf_rl.orchestrator.samples import rollout_to_samples

def template_ids(messages):
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]

class TurnClient:
    """The OpenAI client ``env.run_rollout`` posts its chat completions through (``client.post``,
    read as plain JSON: ``vf_rl.env_api.environment.post_json``), answered by TRL's generator: the
    environment's turn loop, replies and stop rules run unchanged, and each round of requests
    (every unfinished rollout waiting for its next turn) is one batched generate call.
    ``generate(list of prompt token ids) -> list of (completion ids, logprobs, truncated)``."""
    def __init__(self, generate):
        self.generate, self.pending = generate, []
    async def post(self, path, body, cast_to=None, options=None):
        if path != "/chat/completions":
            raise ValueError(f"TurnClient serves /chat/completions only, not {path}")
        ids = template_ids(body["messages"])
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, future))
        return SimpleNamespace(content=json.dumps(await future).encode())
    async def serve(self, tasks):
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0)
            if self.pending and len(self.pending) == sum(not t.done() for t in tasks):
                batch, self.pending = self.pending, []
                for (ids, future), (out, lps, cut) in zip(batch, self.generate([ids for ids, _ in batch])):
                    choice = {"token_ids": list(out), "logprobs": {"content": [{"logprob": x} for x in lps]},
                              "message": {"content": tokenizer.decode(out, skip_special_tokens=True)},
                              "finish_reason": "length" if cut else "stop"}
                    future.set_result({"prompt_token_ids": ids, "choices": [choice]})

def vllm_generate(trainer):
    def generate(prompt_ids):
        _, outs, logprobs, _ = trainer.vllm_generation.generate(prompts=prompt_ids, images=None, num_generations=1)
        return [(list(o), [lp[0] for lp in l], len(o) >= opts["max_tokens"] and o[-1] not in eos_ids)
                for o, l in zip(outs, logprobs)]
    return generate

def hf_generate(model):
    """Sampling with transformers (no vLLM: the CPU), log-probs from the sampling scores."""
    left = AutoTokenizer.from_pretrained(opts["model"], padding_side="left")
    def generate(prompt_ids):
        enc = left.pad({"input_ids": prompt_ids}, return_tensors="pt").to(model.device)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=opts["max_tokens"],
                                 output_scores=True, return_dict_in_generate=True, pad_token_id=left.pad_token_id)
        new = out.sequences[:, enc["input_ids"].shape[1]:]
        logps = torch.stack([torch.log_softmax(x.float(), -1) for x in out.scores], 1).gather(-1, new[..., None])[..., 0]
        result = []
        for ids, lps in zip(new.tolist(), logps.tolist()):
            end = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), None)
            result.append((ids[:end or len(ids)], lps[:end or len(ids)], end is None))
        return result
    return generate

eos_ids = {tokenizer.eos_token_id}

def run_turns(prompts, generate):
    """One rollout of the environment per prompt (message list), scored by its rubric."""
    async def run():
        client, semaphore = TurnClient(generate), asyncio.Semaphore(len(prompts))
        sampling = {"max_tokens": opts["max_tokens"], "temperature": 1.0}
        tasks = []
        for i, prompt in enumerate(prompts):
            row = row_of[json.dumps(prompt, sort_keys=True)]
            rollout = Rollout(example_id=i, prompt=prompt, answer=row.get("answer"), info=row.get("info") or {},
                              task=row.get("task"))
            tasks.append(asyncio.ensure_future(env.run_rollout(client, "policy", rollout, sampling, semaphore)))
        await client.serve(tasks)
        return [t.result() for t in tasks]
    done = asyncio.run(run())
    if all(r.error for r in done):  # this side's own plumbing, not the policy: stop rather than score nothing
        raise RuntimeError(f"every rollout of the batch failed, the first with: {done[0].error}")
    return done

def multi_turn_rollouts(prompts, trainer):
    """TRL's ``rollout_func``: the turns of each rollout as one completion, the environment's
    tokens masked out (``env_mask`` 0); the turns that extend one another (vf-rl's
    ``rollout_to_samples``: its first sample), the rollout's reward as an extra field."""
    generate = vllm_generate(trainer) if trainer.use_vllm else hf_generate(trainer.accelerator.unwrap_model(trainer.model))
    out = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "rollout_reward")}
    for r in run_turns(prompts, generate):
        if r.turns:
            sample = rollout_to_samples(r.turns, 0.0, 10 ** 9)[0]
            p = len(r.turns[0].prompt_ids)
            ids, mask, lps = sample.input_ids[p:], sample.loss_mask[p:], sample.sampling_logprobs[p:]
        else:  # the rollout failed before its first turn: one end token, reward 0
            p, ids, mask, lps = None, [tokenizer.eos_token_id], [1], [0.0]
        out["prompt_ids"].append(list(r.turns[0].prompt_ids) if r.turns else template_ids(r.prompt))
        out["completion_ids"].append(ids)
        out["env_mask"].append(mask)
        out["logprobs"].append(lps)
        out["rollout_reward"].append(r.reward)
    return out

def rollout_reward(prompts, completions, rollout_reward, **kwargs):
    return list(rollout_reward)

records, evals, clock = [], {}, {"start": None, "first_end": None, "eval_s": 0.0}
class Clock(TrainerCallback):
    """Step times (seconds since train begin, evaluation time left out) and the time budget."""
    def on_train_begin(self, args, state, control, **kw):
        clock["start"] = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter() - clock["eval_s"]
        if clock["first_end"] is None:
            clock["first_end"] = now
        elif now - clock["first_end"] >= opts["minutes"] * 60:
            control.should_training_stop = True
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "reward" in logs and "eval_reward" not in logs:
            records.append({"step": state.global_step, "reward": logs["reward"], "unix_s": time.time(),
                            "elapsed_s": time.perf_counter() - clock["eval_s"] - clock["start"],
                            # how far the generating server's log-probs are from the trainer's (stale weights);
                            # TRL's async trainer logs the mean of (server - trainer) log-prob as "kl"
                            "logp_diff": logs.get("sampling/sampling_logp_difference/mean", logs.get("kl")),
                            "completion_tokens": logs.get("completions/mean_length", 0.0) * batch})
            print("learning-record", json.dumps(records[-1]), flush=True)  # progress, kept in the side's log

batch = opts["prompts"] * opts["rollouts"]
micro = opts["trl_micro_batch"] or batch  # TRL generates per_device_train_batch_size * gradient_accumulation_steps
on_gpu = opts["device"] == "gpu"
lora = LoraConfig(r=opts["lora_rank"], lora_alpha=opts["lora_alpha"], lora_dropout=0.0, task_type="CAUSAL_LM",
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
multi_turn = opts["multi_turn"]

def grpo_trainer():
    """TRL's GRPOTrainer (CISPO), generating with vLLM (colocate or server) or transformers."""
    kwargs = dict(output_dir=opts["out"], per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
                  num_generations=opts["rollouts"], max_completion_length=opts["max_tokens"], temperature=1.0, top_p=1.0,
                  learning_rate=opts["lr"], lr_scheduler_type="constant", beta=0.0, loss_type="cispo", epsilon_high=8.0,
                  scale_rewards="none", max_grad_norm=1.0, gradient_checkpointing=False, max_steps=opts["steps"],
                  logging_steps=1, save_strategy="no", report_to="none", seed=opts["seed"], shuffle_dataset=False,
                  use_cpu=not on_gpu, bf16=on_gpu, generation_kwargs=opts["generation_kwargs"] or None,
                  **opts["trl_options"])
    if opts["trl_vllm"] != "none":
        kwargs |= dict(use_vllm=True, vllm_mode=opts["trl_vllm"])
        if opts["trl_vllm"] == "server":
            kwargs |= dict(vllm_server_base_url=opts["trl_server_url"], vllm_server_timeout=600)
        else:
            kwargs |= dict(vllm_gpu_memory_utilization=opts["vllm_memory"], vllm_max_model_length=opts["max_seq_len"] + 512)
    config = GRPOConfig(**kwargs)
    trainer = GRPOTrainer(model=opts["model"], reward_funcs=rollout_reward if multi_turn else rubric_reward, args=config,
                          train_dataset=data, processing_class=tokenizer,
                          peft_config=None if opts["full_weights"] else lora, callbacks=[Clock()],
                          rollout_func=multi_turn_rollouts if multi_turn else None)
    if opts["trl_vllm"] == "server":
        # TRL 1.16, server mode with LoRA: its generator yields views of the merged weights and unmerges after the
        # last one, while vLLM's packed NCCL broadcast concatenates the views only when the generator is exhausted,
        # so the server receives the base weights at every sync and never learns. A copy taken at each yield (while
        # merged) sends what TRL means to send; it costs one model's memory per sync.
        _walk = trainer.vllm_generation._iter_named_params
        trainer.vllm_generation._iter_named_params = lambda: ((name, p.clone()) for name, p in _walk())
    return trainer

def async_trainer():
    """TRL's asynchronous GRPO trainer against ``trl vllm-serve`` (its own loss and staleness bound).
    Its rollout worker is a spawned process that unpickles ``rubric_reward`` from this file."""
    from trl.chat_template_utils import add_response_schema, qwen3_template
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from trl.experimental.async_grpo import packing as tree
    sys.path.insert(0, opts["benchmarks_dir"])
    from learning import keep_published_adapters, varlen_flash_attn
    tree._flash_attn = lambda: SimpleNamespace(flash_attn_varlen_func=varlen_flash_attn)  # no hub download
    from trl.experimental.async_grpo import async_grpo_trainer
    keep_published_adapters(async_grpo_trainer)
    from vllm.distributed.weight_transfer import nccl_common, nccl_engine
    if not hasattr(nccl_engine.NCCLWeightTransferEngine, "trainer_init"):
        # vLLM 0.26 (the GPU machines'): the trainer's end of the NCCL group is nccl_common.trainer_init, which TRL
        # (below vLLM 0.28) calls as NCCLWeightTransferEngine.trainer_init; same arguments, same communicator
        nccl_engine.NCCLWeightTransferEngine.trainer_init = staticmethod(nccl_common.trainer_init)
    try:
        add_response_schema(tokenizer)
    except ValueError:  # a chat template TRL does not know (SmolLM2's ChatML): parse replies as Qwen3's ChatML
        tokenizer.response_template = qwen3_template
    config = AsyncGRPOConfig(
        output_dir=opts["out"], per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        token_budget=0, num_generations=opts["rollouts"], max_completion_length=opts["max_tokens"], temperature=1.0,
        top_p=1.0, learning_rate=opts["lr"], lr_scheduler_type="constant", max_grad_norm=1.0,
        gradient_checkpointing=False, max_steps=opts["steps"], logging_steps=1, save_strategy="no", report_to="none",
        seed=opts["seed"], bf16=True, vllm_server_base_url=opts["trl_server_url"], vllm_server_timeout=600,
        max_staleness=opts["async_max_staleness"])
    return AsyncGRPOTrainer(model=opts["model"], reward_funcs=rubric_reward, args=config, train_dataset=data,
                            processing_class=tokenizer, peft_config=lora, callbacks=[Clock()])

def held_out_reward() -> float:
    """Mean reward of eval_rollouts samples per held-out row (temperature 1, the same rows and
    rubric as vf-rl's evaluation), generated with transformers: GRPOTrainer.evaluate() scored
    0.006 on the CPU where plain sampling from the same model scored 0.11 (cause not found)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    model.eval()
    if multi_turn:  # the environment's turns, sampled as in training
        if trainer.use_vllm:
            trainer.vllm_generation.sync_weights()
        generate = vllm_generate(trainer) if trainer.use_vllm else hf_generate(model)
        done = run_turns([r["prompt"] for r in eval_rows for _ in range(opts["eval_rollouts"])], generate)
        model.train(was_training)
        return sum(r.reward for r in done) / len(done)
    left = AutoTokenizer.from_pretrained(opts["model"], padding_side="left")
    rewards = []
    for i in range(0, len(eval_rows), 16):
        chunk = eval_rows[i:i + 16]
        texts = [left.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in chunk]
        enc = left(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=opts["max_tokens"], num_return_sequences=opts["eval_rollouts"],
                                 pad_token_id=left.pad_token_id)
        texts = left.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        rows = [r for r in chunk for _ in range(opts["eval_rollouts"])]
        rewards += rubric_reward([r["prompt"] for r in rows], [[{"role": "assistant", "content": t}] for t in texts],
                                 [r.get("answer") or "" for r in rows], [json.dumps(r.get("info") or {}) for r in rows],
                                 [r.get("task") or "default" for r in rows])
    model.train(was_training)
    return sum(rewards) / len(rewards)

def evaluate(step):
    if opts["no_eval"]:
        return
    start = time.perf_counter()
    model = trainer.accelerator.unwrap_model(trainer.model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    attention = base.config._attn_implementation
    if is_async:  # the async trainer's tree attention needs its packed layout: generate with sdpa
        base.set_attn_implementation("sdpa")
    try:
        evals[step] = held_out_reward()
    finally:
        if is_async:
            base.set_attn_implementation(attention)
    clock["eval_s"] += time.perf_counter() - start
    print("learning-eval", json.dumps({"step": step, "reward": evals[step]}), flush=True)

if __name__ == "__main__":  # (the async trainer's rollout worker imports this file: no training there)
    is_async = opts["trl_options"].pop("async", False)
    trainer = async_trainer() if is_async else grpo_trainer()
    evaluate(0)
    clock["eval_s"] = 0.0  # before on_train_begin: not on the clock anyway
    trainer.train()
    evaluate(trainer.state.global_step)
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None
    Path(opts["out"], "trl.json").write_text(json.dumps({"records": records, "evals": evals,
                                                          "peak_allocated_gib": peak}))
'''


def visible_gpus() -> list[str]:
    """The GPU ids this benchmark may use: ``CUDA_VISIBLE_DEVICES`` when set (two runs side by
    side on one host, each on its own GPUs), else ``["0", "1"]``."""
    return [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",") if g.strip()]


def nvidia_smi(query: str) -> list[tuple[str, ...]]:
    """``nvidia-smi --query-gpu=<query>`` for the GPUs this process sees (``CUDA_VISIBLE_DEVICES``
    when set, else every GPU), one tuple of fields per GPU; empty without nvidia-smi or GPUs."""
    ids = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits",
                              *([f"--id={ids}"] if ids else [])], capture_output=True, text=True).stdout
    except OSError:
        return []
    fields = query.count(",") + 1
    rows = [tuple(f.strip() for f in line.rsplit(",", fields - 1)) for line in out.splitlines()]
    return [row for row in rows if len(row) == fields and row[-1].isdigit()]  # not a message line


def gpu_names() -> list[dict]:
    """``[{"name": str, "memory_total_mib": int}]`` of the GPUs this process sees, so that a
    result says which card its times and peaks come from."""
    return [{"name": name, "memory_total_mib": int(mib)} for name, mib in nvidia_smi("name,memory.total")]


def varlen_flash_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                      softmax_scale: float | None = None, causal: bool = True, window_size=(-1, -1), softcap=None):
    """``flash_attn_varlen_func`` as TRL's async trainer calls it (FlashAttention-3, which it loads
    from the Hugging Face hub), served by vf-rl's packed attention: torch's FlashAttention varlen
    kernel on a GPU in bf16/fp16, one ``scaled_dot_product_attention`` per segment elsewhere.

    Args:
        q: ``[Nq, Hq, D]``; k, v: ``[Nk, Hkv, D]`` (``Hq`` a multiple of ``Hkv``).
        cu_seqlens_q, cu_seqlens_k: ``[S + 1]`` int32 segment boundaries; a segment's queries are
            the last of its keys (causal, bottom-right aligned, as FlashAttention's ``causal``).
    Returns:
        ``[Nq, Hq, D]``.
    Raises:
        NotImplementedError: non-causal, sliding-window or soft-capped attention.
    """
    import torch

    from vf_rl.trainer.speed.attention import _layout_attention
    from vf_rl.trainer.speed.packing import PackedLayout

    if not causal or tuple(window_size) != (-1, -1) or softcap:
        raise NotImplementedError("varlen_flash_attn: causal attention without a window or softcap only")
    segments = []  # host copies, read only by the per-segment path: a GPU's varlen kernel needs no host sync
    if not (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)):
        bq, bk = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        segments = list(zip(bq, bq[1:], bk, bk[1:]))
    layout = PackedLayout(cu_seqlens_q, cu_seqlens_k, None, int(max_seqlen_q), int(max_seqlen_k), segments)
    heads_first = [x.transpose(0, 1)[None] for x in (q, k, v)]  # [1, H, N, D]
    return _layout_attention(*heads_first, layout, softmax_scale, 0.0)[0]


ASYNC_MAX_STALENESS = 4  # AsyncGRPOConfig's default, set explicitly: the server's adapter slots follow from it


def keep_published_adapters(trainer_module) -> None:
    """Keeps every adapter version TRL's async trainer publishes on disk (``trl.experimental.async_grpo.
    async_grpo_trainer``, passed in: importing it imports vLLM).

    TRL 1.16 deletes a version's directory one sync after it unloads that version from the server,
    while requests that name it can still wait in the server's queue (hundreds of rollouts, up to
    ``max_staleness`` versions back): vLLM then reloads the adapter from the deleted directory and
    its engine dies (``LoRAAdapterNotFoundError``, seen on an H200 on 2026-11-28). The module's ``rmtree`` skips
    published version directories (``.vllm_lora/<name>-v<N>``) and still removes staging ones
    (``.vllm_lora/.<name>-v<N>.tmp``) and every other path. A LoRA r8 adapter of a 135M model is
    ~5 MB per step on disk.
    """
    import shutil
    from types import SimpleNamespace

    def rmtree(path, *args, **kwargs):
        path = os.fspath(path)
        if os.path.basename(os.path.dirname(path)) != ".vllm_lora" or os.path.basename(path).startswith("."):
            shutil.rmtree(path, *args, **kwargs)

    trainer_module.shutil = SimpleNamespace(**{**vars(shutil), "rmtree": rmtree})  # the rest of shutil as it is


def served_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts (its choices: 1, 8, 16, 32, 64, 128, 256, 320,
    512) that holds an adapter of ``rank``, as TRL's ``round_lora_rank``. Not imported from TRL:
    importing its async trainer imports vLLM, which sets ``VLLM_LOGGING_LEVEL=ERROR`` (and more) in
    this process's environment, inherited by every side started after it."""
    return next(r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= rank)


def side_caches(opts, out: Path, side: str) -> dict[str, str]:
    """Environment variables that give one side's processes compile caches of their own under
    ``out/caches/<side>`` (``--caches cold``, the default): vLLM's torch.compile cache, Triton's kernel cache,
    inductor's. With shared caches a side started after another finds the kernels and graphs the
    first one compiled for the same model, and its launch-to-step-1 time reads shorter than on the
    fresh machine both are meant to start on. ``--caches shared``: nothing changes."""
    if getattr(opts, "caches", "cold") != "cold":
        return {}
    names = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
    return {var: str((out / "caches" / side / name).resolve()) for var, name in names.items()}


def start_trl_server(opts, out: Path, adapters: bool = False) -> subprocess.Popen:
    """``trl vllm-serve`` on the first visible GPU (TRL's own server, weight updates over NCCL) for
    ``--trl-vllm server``. ``adapters``: serve LoRA adapters loaded at run time, as TRL's async
    trainer asks for (it then syncs the adapter alone; it needs ``max_staleness + 2`` slots)."""
    from urllib.parse import urlparse

    url = urlparse(opts.trl_server_url)
    argv = [sys.executable, "-m", "trl.scripts.vllm_serve", "--model", opts.model, "--host", url.hostname,
            "--port", str(url.port), "--gpu_memory_utilization", "0.5", "--max_model_len", "2048"]
    if opts.enforce_eager:
        argv += ["--enforce_eager", "true"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible_gpus()[0], **side_caches(opts, out, "trl-vllm")}
    if adapters:  # passed through to `vllm serve`
        argv += ["--enable-lora", "--max-lora-rank", str(served_lora_rank(opts.lora_rank)),
                 "--max-loras", str(ASYNC_MAX_STALENESS + 2)]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    log = (out / "trl-vllm.log").open("w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def run_trl(opts, spec: EnvSpec, side: str, out: Path) -> dict:
    """TRL's GRPOTrainer in a subprocess. GPU: ``--trl-vllm server`` starts ``trl vllm-serve``
    on the first visible GPU and trains on the second; ``colocate`` and ``none`` use the first
    (:func:`visible_gpus`)."""
    trl_out = out / side
    trl_out.mkdir(parents=True, exist_ok=True)
    options = trl_options(side)
    args = {**vars(opts), "out": str(trl_out), "env_id": env_id(opts, spec), "env_args": spec.args,
            "max_seq_len": spec.max_seq_len, "generation_kwargs": trl_generation_kwargs(opts, spec),
            "trl_options": options, "multi_turn": spec.multi_turn, "benchmarks_dir": str(Path(__file__).parent),
            "async_max_staleness": ASYNC_MAX_STALENESS}
    # a file, not `python -c`: the async trainer's spawned rollout worker unpickles the reward function from it
    script = trl_out / "trl_side.py"
    script.write_text(TRL_SCRIPT)
    # a local model: no hub calls (TRL's telemetry); NCCL's rendezvous address without probing a public one (vLLM)
    env = {**side_env(opts, out, side), "VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP", "127.0.0.1")}
    if Path(opts.model).is_dir():
        env.setdefault("HF_HUB_OFFLINE", "1")
    server = None
    if opts.device == "gpu":
        from vf_rl.inference.communicator import free_port

        visible = visible_gpus()
        if opts.trl_vllm == "server" and len(visible) < 2:
            raise SystemExit(f"learning: --trl-vllm server needs two GPUs, CUDA_VISIBLE_DEVICES has {visible}")
        env["CUDA_VISIBLE_DEVICES"] = visible[1] if opts.trl_vllm == "server" else visible[0]
        # colocate runs vLLM with the external launcher: one torch.distributed process
        env |= {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port())}
        if opts.trl_vllm == "server":
            server = start_trl_server(opts, out, adapters=bool(options.get("async")))
    marker = f"learning-{side}-{os.getpid()}"
    sampler = PeakSampler(opts.device == "gpu", marker=marker)
    launched = time.time()
    start = time.perf_counter()
    log = trl_out / "trl.log"  # its progress (one "learning-record" line per step) survives a kill
    try:
        with log.open("w") as sink:
            result = subprocess.run([sys.executable, str(script), json.dumps(args, default=str), marker],
                                    stdout=sink, stderr=subprocess.STDOUT, env=env)
    finally:
        if server is not None:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
    wall = time.perf_counter() - start
    peak = sampler.stop()
    if result.returncode != 0:
        raise RuntimeError(f"{side} failed ({result.returncode}): {log.read_text()[-3000:]}")
    data = json.loads((trl_out / "trl.json").read_text())
    records = data["records"]
    return {"wall_s": wall, "peak_gib": peak, "steps": [r["step"] for r in records],
            "elapsed_s": [r["elapsed_s"] for r in records], "reward": [r["reward"] for r in records],
            "wait_s": None, "evals": {int(k): v for k, v in data["evals"].items()},
            "logp_diff": [r.get("logp_diff") for r in records],
            "completion_tokens": [r.get("completion_tokens") for r in records],
            "launch_to_step1_s": records[0]["unix_s"] - launched if records else None,
            "settings": {"trl_options": options, "trl_vllm": opts.trl_vllm,
                         "peak_allocated_gib": data["peak_allocated_gib"]}}


# --- results ----------------------------------------------------------------------------------

def points(run: dict) -> list[list]:
    """``[[seconds_since_step1, step, reward_mean, eval_reward_or_null], ...]``; the evaluation
    before training is step 0 at 0 s."""
    t0 = run["elapsed_s"][0]
    out = [[0.0, 0, None, run["evals"][0]]] if 0 in run["evals"] else []
    for step, t, reward in zip(run["steps"], run["elapsed_s"], run["reward"]):
        out.append([round(t - t0, 3), step, reward, run["evals"].get(step)])
    return out


def reward_by(pts: list[list], seconds: float, window_s: float = READING_WINDOW_S) -> float | None:
    """The training reward read at ``seconds`` after step 1: the mean over the steps finished in
    the ``window_s`` seconds up to then, and over at least the last 3 finished by then (a side whose
    steps are longer than the window). Each side's reading spans the same wall clock, not the same
    number of steps: one step's reward (16 prompts) moves by +-0.06 on its own, and a side with
    twice the steps per second would otherwise be read over half the time."""
    done = [p[2] for p in pts if p[2] is not None and p[0] <= seconds + 1e-6]
    recent = [p[2] for p in pts if p[2] is not None and seconds - window_s < p[0] <= seconds + 1e-6]
    chosen = recent if len(recent) >= 3 else done[-3:]
    return statistics.fmean(chosen) if chosen else None


def time_to_reach(pts: list[list], target: float) -> float | None:
    """First second (a step's end) at which :func:`reward_by` reaches ``target``."""
    for p in pts:
        if p[2] is not None and reward_by(pts, p[0]) >= target - 1e-9:
            return p[0]
    return None


def summarize(run: dict, pts: list[list], rollouts: int, warmup: int) -> dict:
    step_s = [b - a for a, b in zip(run["elapsed_s"], run["elapsed_s"][1:])][warmup:] or [float("nan")]
    median = statistics.median(step_s)
    evals = [p[3] for p in pts if p[3] is not None]
    waits = run["wait_s"]
    wait_fraction = None
    if waits and len(run["elapsed_s"]) > 1:
        pairs = list(zip(waits[1:], [b - a for a, b in zip(run["elapsed_s"], run["elapsed_s"][1:])]))[warmup:]
        wait_fraction = statistics.fmean(w / s for w, s in pairs if s > 0) if pairs else None
    trained_s = pts[-1][0] if pts else 0.0
    gaps = [g for g in run.get("logp_diff") or [] if g is not None]
    gap = statistics.median(gaps) if gaps else None
    tokens = [t for t in (run.get("completion_tokens") or [])[warmup + 1:] if t]  # the timed steps'
    step_tokens = statistics.median(tokens) if tokens else None
    return {"steps": len(run["reward"]), "trained_s": trained_s, "step_s_median": median,
            "completion_tokens_per_step": step_tokens,
            "tokens_trained_per_s": step_tokens / median if step_tokens and median == median else None,
            "sampler_logp_gap": gap, "invalid": invalid_reason(gap),
            "rollouts_per_s": rollouts / median if median == median else None, "wait_fraction": wait_fraction,
            "launch_to_step1_s": run["launch_to_step1_s"], "compile_s": run.get("compile_s"), "wall_s": run["wall_s"],
            **readings(pts, trained_s), "eval_before": evals[0] if evals else None,
            "eval_after": evals[-1] if len(evals) > 1 else None, "peak_gib": run["peak_gib"]}


def invalid_reason(gap: float | None) -> str | None:
    """Why a side is not a measurement (``None`` when it is): its sampler-trainer log-prob gap
    ``gap`` (nats per token, the median over its steps) above ``SAMPLER_GAP_NATS``."""
    if gap is None or gap <= SAMPLER_GAP_NATS:
        return None
    return (f"its sampler's log-probs differ from its trainer's by {gap:.2f} nats per token (median; at most "
            f"{SAMPLER_GAP_NATS} in a run that generates with the weights it trains)")


def readings(pts: list[list], trained_s: float) -> dict:
    """The training reward (:func:`reward_by`) at each of ``CHECKPOINTS_MIN`` that the run reached
    and at its end (``trained_s`` after step 1)."""
    return {"reward_at_min": {m: reward_by(pts, m * 60) for m in CHECKPOINTS_MIN if m * 60 <= trained_s + 30},
            "reward_final": reward_by(pts, trained_s)}


def fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def report(result: dict) -> str:
    """The markdown table of a result (``--json``'s contents)."""
    sides = result["sides"]
    invalid = {n: sides[n]["summary"].get("invalid") for n in sides if sides[n]["summary"].get("invalid")}
    trl_sides = [s for s in sides if s.startswith("trl") and s not in invalid]
    best = max(trl_sides, key=lambda s: sides[s]["summary"]["rollouts_per_s"] or 0) if trl_sides else None
    target = sides[best]["summary"]["reward_final"] if best else None
    rows = [("steps", "steps"), ("trained s after step 1", "trained_s"), ("s per step (median)", "step_s_median"),
            ("rollouts / s", "rollouts_per_s"), ("completion tokens per step", "completion_tokens_per_step"),
            ("completion tokens trained / s", "tokens_trained_per_s"), ("vf-rl waits for generation", "wait_fraction"),
            ("s from launch to the end of step 1", "launch_to_step1_s"),
            ("s of torch_compile before step 1", "compile_s"), ("peak GiB", "peak_gib"),
            ("held-out reward before", "eval_before"), ("held-out reward after", "eval_after"),
            ("final reward (last 30 s)", "reward_final"),
            ("sampler-trainer log-prob gap (nats/token)", "sampler_logp_gap")]
    names = list(sides)
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for minute in CHECKPOINTS_MIN:
        values = [sides[n]["summary"]["reward_at_min"].get(str(minute), sides[n]["summary"]["reward_at_min"].get(minute))
                  for n in names]
        if any(v is not None for v in values):
            lines.append(f"| reward at {minute} min | " + " | ".join(fmt(v) for v in values) + " |")
    for label, key in rows:
        lines.append(f"| {label} | " + " | ".join(fmt(sides[n]["summary"].get(key)) for n in names) + " |")
    if best and target is not None:
        reach = [time_to_reach(sides[n]["points"], target) for n in names]
        lines.append(f"| s to reach {best}'s final reward ({target:.3f}) | " + " | ".join(fmt(v) for v in reach) + " |")
        if "vf-rl" in sides:
            vf, peer = sides["vf-rl"]["summary"], sides[best]["summary"]
            ratio = (vf["rollouts_per_s"] or 0) / (peer["rollouts_per_s"] or float("inf"))
            lines.append(f"\nbest TRL side (most rollouts/s): {best}; vf-rl / {best} rollouts per second: {ratio:.2f}x")
    for name, why in invalid.items():
        lines.append(f"\nNOT A MEASUREMENT: {name}: {why}; left out of the comparison")
    return "\n".join(lines)


def merge_runs(results: list[dict]) -> dict:
    """One result from the runs of several ``--json`` files: the first run's settings, every run's
    sides in order. Raises ``ValueError`` when a side name repeats or the runs differ in
    environment, model, device, batch or ``max_tokens`` (their curves would not compare)."""
    merged = {"settings": dict(results[0]["settings"]), "sides": {}}
    same = ("env", "model", "device", "prompts", "rollouts", "max_tokens")
    for result in results:
        differ = [k for k in same if result["settings"].get(k) != merged["settings"].get(k)]
        if differ:
            raise ValueError(f"the runs differ in {', '.join(differ)}")
        for name, side in result["sides"].items():
            if name in merged["sides"]:
                raise ValueError(f"side {name!r} is in more than one run")
            merged["sides"][name] = side
    if len(results) > 1:
        merged["settings"]["sides"] = ",".join(merged["sides"])
        merged["settings"]["dates"] = [r["settings"].get("date") for r in results]
    return merged


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["settings"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, side in result["sides"].items():
        pts = side["points"]
        line, = ax.plot([p[0] for p in pts if p[2] is not None], [p[2] for p in pts if p[2] is not None],
                        marker=".", markersize=3, linewidth=1, label=f"{name} (training)")
        held = [(p[0], p[3]) for p in pts if p[3] is not None]
        if held:
            ax.plot(*zip(*held), marker="D", linestyle="--", color=line.get_color(), label=f"{name} (held-out)")
    ax.set_xlabel("seconds after step 1")
    ax.set_ylabel("reward")
    ax.set_title(f"{s['env']}, {Path(s['model']).name}, {s['prompts']}x{s['rollouts']} rollouts/step, "
                 f"max_tokens {s['max_tokens']}, {s['device']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=sorted(ENVS), default="reverse-text")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--model", default=default_model())
    p.add_argument("--minutes", type=float, default=8.0, help="wall clock per side after its step 1")
    p.add_argument("--steps", type=int, default=2000, help="most steps per side")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the per-step medians")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=128, help="vf-rl's micro_batch_size")
    p.add_argument("--trl-micro-batch", type=int, default=None, help="TRL's per_device_train_batch_size, gradient "
                   "accumulation making up the step (default: the environment's, alphabet-sort 32; else the whole "
                   "step, prompts x rollouts)")
    p.add_argument("--max-tokens", type=int, default=None, help="default: the environment's (reverse-text 128)")
    p.add_argument("--full-weights", action="store_true", help="train every weight on both sides (no LoRA)")
    p.add_argument("--no-eval", action="store_true", help="no held-out evaluation on either side (throughput runs)")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eval-examples", type=int, default=32)
    p.add_argument("--eval-rollouts", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=10 ** 6, help="vf-rl: also evaluate every N steps")
    p.add_argument("--shared", action="store_true", help="GPU: vLLM and the trainer on one GPU (vf-rl shared = true)")
    p.add_argument("--vllm-memory", type=float, default=0.3, help="GPU share for vLLM on a shared GPU (both sides)")
    p.add_argument("--enforce-eager", action="store_true", help="GPU: vLLM without CUDA graphs")
    p.add_argument("--caches", choices=["cold", "shared"], default="cold",
                   help="cold: each side compiles into caches of its own (vLLM, Triton, inductor), as on a fresh "
                        "machine; shared: the caches of the environment (a later side may find an earlier one's)")
    p.add_argument("--trl-vllm", choices=["none", "server", "colocate"], default=None,
                   help="TRL's generation (default: none on the CPU, colocate on a GPU)")
    p.add_argument("--trl-server-url", default="http://127.0.0.1:8001", help="with --trl-vllm server")
    p.add_argument("--sides", default="vf-rl,trl")
    p.add_argument("--vf-arg", action="append", default=[], help="KEY=VALUE: another [trainer.args] key for the "
                   "vf-rl side (a TOML value; repeatable), e.g. --vf-arg max_off_policy_steps=2")
    p.add_argument("--vllm-arg", action="append", default=[], help="KEY=VALUE: another [inference.args] key for the "
                   "vf-rl side's vf-vllm (e.g. api_server_count=4), repeatable")
    p.add_argument("--env-arg", action="append", default=[], help="KEY=VALUE: a load_environment argument for "
                   "every side, over the benchmark's own (a TOML value; repeatable), e.g. --env-arg few_shot=0")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="PNG of reward against seconds")
    p.add_argument("--from-json", type=Path, action="append", default=[],
                   help="print the table (and --plot) of an earlier --json; repeated, the sides of several runs "
                   "(e.g. one side per GPU of a host, run at once) in one table, plot and --json")
    opts = p.parse_args(argv)
    if opts.from_json:
        runs = []
        for path in opts.from_json:
            try:
                runs.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                p.error(f"--from-json {path}: {exc}")
            if not isinstance(runs[-1], dict) or not {"settings", "sides"} <= runs[-1].keys():
                p.error(f"--from-json {path}: not a learning.py --json result (no settings and sides)")
        try:
            result = merge_runs(runs)
        except ValueError as exc:
            p.error(f"--from-json: {exc}")
        for side in result["sides"].values():  # read as this version reads (an older run's summary may differ)
            side["summary"] |= readings(side["points"], side["summary"]["trained_s"])
        if opts.json:
            opts.json.write_text(json.dumps(result, indent=1))
    else:
        spec = ENVS[opts.env]
        spec = replace(spec, args={**spec.args, **toml_pairs(opts.env_arg, "--env-arg")})
        opts.max_tokens = opts.max_tokens or spec.max_tokens
        spec = seq_len_for(spec, opts.max_tokens)
        opts.trl_vllm = opts.trl_vllm or ("colocate" if opts.device == "gpu" else "none")
        sides = opts.sides.split(",")
        step = opts.prompts * opts.rollouts
        if opts.trl_micro_batch is not None and (opts.trl_micro_batch < 1 or step % opts.trl_micro_batch):
            p.error(f"--trl-micro-batch must divide the step's {step} rollouts, got {opts.trl_micro_batch}")
        opts.trl_micro_batch = opts.trl_micro_batch or default_trl_micro_batch(spec, step)
        for side in sides:
            if side != "vf-rl":
                try:
                    options = trl_options(side)
                except ValueError as exc:
                    p.error(str(exc))
                if options.get("async") and (opts.device != "gpu" or opts.trl_vllm != "server" or spec.multi_turn):
                    p.error(f"--sides trl-async: TRL's async trainer needs --device gpu and --trl-vllm server, and a "
                            f"single-turn environment (--env {opts.env}, --device {opts.device}, --trl-vllm "
                            f"{opts.trl_vllm})")
        out = opts.out or Path(tempfile.mkdtemp(prefix="vf-rl-learning-"))
        out.mkdir(parents=True, exist_ok=True)
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()}
        settings |= {"env_args": spec.args, "max_seq_len": spec.max_seq_len, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                                    time.gmtime())}
        if opts.device == "gpu":
            settings["gpus"] = gpu_names()
            # vf-rl's trainer applies liger-kernel with torch_compile = false when it is installed
            from vf_rl.config.cache import package_version

            settings["liger_kernel"] = package_version("liger-kernel")
        result = {"settings": settings, "sides": {}}
        for side in sides:
            print(f"learning: running {side} ...", flush=True)
            run = run_vf_rl(opts, spec, out) if side == "vf-rl" else run_trl(opts, spec, side, out)
            pts = points(run)
            result["sides"][side] = {"rollouts_per_step": opts.prompts * opts.rollouts, "max_tokens": opts.max_tokens,
                                     "points": pts, "peak_gib": run["peak_gib"], "settings": run["settings"],
                                     "summary": summarize(run, pts, opts.prompts * opts.rollouts, opts.warmup)}
            if opts.json:  # after each side, so a later side's failure keeps the earlier ones
                opts.json.write_text(json.dumps(result, indent=1))
    s = result["settings"]
    adapter = "full weights" if s.get("full_weights") else f"LoRA r{s['lora_rank']}/{s['lora_alpha']}"
    print(f"\n{s['env']}: {s['prompts']} prompts x {s['rollouts']} rollouts, max_tokens {s['max_tokens']}, {adapter}, "
          f"lr {s['lr']}, {s['minutes']} min per side after step 1, "
          f"device {s['device']}")
    print(report(result))
    if opts.plot:
        plot(result, opts.plot)
    return 3 if any(side["summary"].get("invalid") for side in result["sides"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
