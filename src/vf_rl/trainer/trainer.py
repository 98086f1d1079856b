"""RLTrainer: asynchronous group-advantage CISPO on a ``transformers.Trainer``.

One optimizer step ``n`` (``training_step``):
    1. take batch ``n`` from the orchestrator (generated with the weights of step ``n - 1``);
    2. push the current weights to the inference server (skipped if unchanged);
    3. submit batch ``n + 1``, which generates while we train;
    4. for each micro batch: forward, log-probs of the sampled tokens at the sampling
       temperature, CISPO loss, backward. ``Trainer`` then clips, steps and schedules.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, Trainer, TrainerCallback

from vf_rl.config.rl_config import RLConfig
from vf_rl.envs import Environment
from vf_rl.inference.client import InferenceClient

from .batching import micro_batches, shard
from .loss import cispo_loss, selective_logprobs
from .orchestrator import Batch, Orchestrator
from .weights import export_weights


def load_model(model: str, args: RLConfig) -> PreTrainedModel:
    """Load a causal LM (hub id or local directory) for training: bf16 on GPU when
    ``args.bf16``, float32 otherwise; sdpa attention unless flash-attn is installed."""
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype, attn_implementation="sdpa")


def apply_lora(model: PreTrainedModel, args: RLConfig):
    """Wrap ``model`` in a peft LoRA model built from the ``lora_*`` arguments."""
    from peft import LoraConfig, get_peft_model

    config = args.lora_config or LoraConfig(
        r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules, modules_to_save=args.lora_modules_to_save,
        use_rslora=args.lora_use_rslora, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


class _StepsDataset(torch.utils.data.Dataset):
    """Placeholder data for ``Trainer``'s loop: one item per process per step. Real batches
    come from the orchestrator."""

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        return {"step": i}


class _RunCallback(TrainerCallback):
    """Always save the final step; write ``metrics.jsonl`` and a console line per log."""

    def __init__(self, trainer: "RLTrainer"):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= state.max_steps:
            control.should_save = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
        path = Path(args.output_dir) / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if "reward" in logs:
            print(f"Step {state.global_step}/{state.max_steps}: reward={logs['reward']:.3f} "
                  f"(std {logs.get('reward/std', 0):.3f}) loss={logs.get('loss', 0):.4f} "
                  f"entropy={logs.get('entropy', 0):.3f} importance_ratio={logs.get('importance_ratio', 0):.3f} "
                  f"gen={logs.get('timing/generation_s', 0):.1f}s wait={logs.get('timing/wait_s', 0):.1f}s "
                  f"train={logs.get('timing/train_s', 0):.1f}s sync={logs.get('timing/sync_s', 0):.1f}s", flush=True)


class RLTrainer(Trainer):
    """Asynchronous RL trainer (one step off-policy) for vf-rl environments.

    Args:
        model: a hub id, a local model directory, or a loaded ``PreTrainedModel``.
        env: the environment whose training rows and rubric are used.
        args: :class:`RLConfig`.
        processing_class: the tokenizer (loaded from ``model`` if omitted).

    The inference server (vf-vllm) must serve the same base model at
    ``args.vllm_server_host:vllm_server_port``; ``train()`` waits for it up to
    ``vllm_server_timeout`` seconds.
    """

    def __init__(self, model: str | PreTrainedModel, env: Environment, args: RLConfig,
                 processing_class=None, **kwargs):
        model_id = model if isinstance(model, str) else model.config._name_or_path
        if isinstance(model, str):
            model = load_model(model, args)
        if args.gradient_checkpointing:
            model.config.use_cache = False
        tokenizer = processing_class or AutoTokenizer.from_pretrained(model_id)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if args.use_lora:
            model = apply_lora(model, args)
        self.served_model_name = kwargs.pop("served_model_name", model_id)
        super().__init__(model=model, args=args, processing_class=tokenizer, data_collator=lambda items: {},
                         train_dataset=_StepsDataset(args.max_steps * args.micro_batch_size * args.world_size),
                         **kwargs)
        self.env = env
        self.add_callback(_RunCallback(self))
        self.inference = InferenceClient(args.vllm_server_host, args.vllm_server_port, args.vllm_server_timeout)
        self.orchestrator: Orchestrator | None = None
        self._synced_step = 0  # the server holds the weights of this optimizer step
        self._step_metrics: dict[str, float] = {}
        self._rows = self._training_rows(env.get_dataset(), tokenizer)

    def _training_rows(self, dataset: Dataset, tokenizer) -> list[dict]:
        """Rows whose templated prompt fits ``max_prompt_len`` tokens, shuffled once by ``seed``."""
        rows = [row for row in dataset if len(tokenizer.apply_chat_template(
            row["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)) <= self.args.max_prompt_len]
        if self.args.shuffle_dataset:
            random.Random(self.args.seed).shuffle(rows)
        return rows

    # --- the loop ---------------------------------------------------------------------------

    def train(self, *args, **kwargs):
        """Wait for the inference server, start the orchestrator, then run ``Trainer.train``."""
        if self.is_world_process_zero():
            print(f"Waiting for vf-vllm at {self.inference.base_url} ...", flush=True)
        self.inference.wait_until_ready(self.args.vllm_server_timeout)
        a = self.args
        self.orchestrator = Orchestrator(
            self.env, self._rows, f"{self.inference.base_url}/v1", self.served_model_name, a.batch_size,
            a.rollouts_per_example, a.sampling_args(), a.max_seq_len, a.max_concurrent, a.generation_timeout,
            a.mask_truncated_completions, a.zero_truncated_completions, a.mask_env_responses)
        try:
            return super().train(*args, **kwargs)
        finally:
            self.orchestrator.close()

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        step = self.state.global_step
        start = time.perf_counter()
        batch = self.orchestrator.get(step)  # waits if generation is behind training
        wait_s = time.perf_counter() - start
        start = time.perf_counter()
        if self._synced_step != step:
            self.sync_weights(step)
        sync_s = time.perf_counter() - start
        if step + 1 < self.args.max_steps:
            self.orchestrator.submit(step + 1)
        start = time.perf_counter()
        loss, stats = self._train_on_batch(model, batch)
        self._step_metrics = {**batch.metrics, **stats, "timing/wait_s": wait_s, "timing/sync_s": sync_s,
                              "timing/train_s": time.perf_counter() - start}
        self._log_samples(batch)
        return loss

    def _train_on_batch(self, model, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        a = self.args
        world, rank = a.world_size, a.process_index
        loss_tokens = sum(sum(s.loss_mask[1:]) for s in batch.samples)
        normalizer = max(loss_tokens, 1) / world
        mine = shard(batch.samples, world, rank, a.micro_batch_size)
        totals = {"tokens": 0.0, "importance_ratio_sum": 0.0, "mismatch_kl_sum": 0.0, "masked_low": 0.0,
                  "masked_high": 0.0, "entropy_sum": 0.0}
        total_loss = torch.zeros((), device=a.device)
        model.train()
        for mb in micro_batches(mine, a.micro_batch_size, self.processing_class.pad_token_id):
            mb = {k: v.to(a.device) for k, v in mb.items()}
            with self.compute_loss_context_manager():
                logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
                logprobs, entropy = selective_logprobs(logits[:, :-1], mb["input_ids"][:, 1:], a.temperature)
                mask = mb["loss_mask"][:, 1:]
                loss, stats = cispo_loss(logprobs, mb["sampling_logprobs"][:, 1:], mb["advantages"], mask,
                                         normalizer, a.mask_ratio_low, a.mask_ratio_high)
            self.accelerator.backward(loss)
            total_loss += loss.detach()
            for k, v in stats.items():
                totals[k] += float(v)
            totals["entropy_sum"] += float(entropy.masked_fill(~mask, 0.0).sum())
        n = max(totals["tokens"], 1.0)
        metrics = {"importance_ratio": totals["importance_ratio_sum"] / n,
                   "mismatch_kl": totals["mismatch_kl_sum"] / n, "entropy": totals["entropy_sum"] / n,
                   "masked/low_fraction": totals["masked_low"] / n, "masked/high_fraction": totals["masked_high"] / n,
                   "tokens/loss": totals["tokens"]}
        return total_loss, metrics

    # --- weight sync ------------------------------------------------------------------------

    def sync_weights(self, step: int) -> None:
        """Push the current weights (LoRA merged in) to the inference server."""
        if self.is_world_process_zero():
            path = Path(self.args.output_dir) / "weights"
            export_weights(self.accelerator.unwrap_model(self.model), path)
            self.inference.update_weights(str(path.resolve()))
        self.accelerator.wait_for_everyone()
        self._synced_step = step

    # --- logging ------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs and self._step_metrics:
            logs = {**logs, **self._step_metrics}
            self._step_metrics = {}
        super().log(logs, *args, **kwargs)

    def _log_samples(self, batch: Batch) -> None:
        if not self.is_world_process_zero() or batch.step % max(int(self.args.logging_steps), 1) or batch.step % 5:
            return
        r = batch.rollouts[0]
        prompt = r.prompt[-1]["content"] if r.prompt else ""
        completion = r.completion[-1]["content"] if r.completion else (r.error or "")
        print(f"=== Step {batch.step} Sample ===\nPrompt: {prompt}\nCompletion: {completion}\nReward: {r.reward:.3f}",
              flush=True)
