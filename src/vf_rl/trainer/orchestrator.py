"""Orchestrator: generates training batches in a background thread, one step ahead.

The trainer calls ``submit(n + 1)`` and then trains on batch ``n`` while the orchestrator's
own asyncio loop runs batch ``n + 1``'s rollouts against the inference server. A batch is
fully determined by its step number (which dataset rows it uses), so generation can be
re-done for any step, e.g. after a resume.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
from collections import Counter
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from openai import AsyncOpenAI

from vf_rl.envs import Environment, Rollout
from vf_rl.inference.client import openai_client
from vf_rl.metrics import rollout_metrics

from .batching import Sample, group_advantages, rollout_to_samples


@dataclass
class Batch:
    """Everything the trainer needs for one step.

    Attributes:
        step: the optimizer step this batch is for (0-based).
        samples: training samples of all processes (``>= batch_size`` for multi-turn).
        rollouts: the scored rollouts, grouped by prompt.
        metrics: ``reward``, ``reward/std``, ``reward/<func>``, ``advantage/absmean``,
            ``tokens/completion``, ``errors/rate``, ``timing/generation_s``...
    """

    step: int
    samples: list[Sample]
    rollouts: list[Rollout]
    metrics: dict[str, float] = field(default_factory=dict)
    row_ids: list = field(default_factory=list)


class Orchestrator:
    """Generates batches for the trainer in a background thread.

    Args:
        env: the environment.
        rows: training rows (dicts with ``prompt``, ``answer``...), already shuffled/filtered.
        base_url: the OpenAI-compatible server, e.g. ``http://127.0.0.1:8000/v1``.
        model_name: the model name the server serves.
        batch_size: rollouts per batch; ``batch_size // rollouts_per_example`` rows each.
        rollouts_per_example: group size.
        sampling_args: chat-completion arguments (see ``RLConfig.sampling_args``).
        max_seq_len: samples are cut to this many tokens.
        max_concurrent: most rollouts in flight.
        generation_timeout: seconds allowed for one batch.
        mask_truncated_completions: truncated completions get no loss tokens.
        mask_env_responses: environment-written tokens get no loss (multi-turn).
        zero_truncated_completions: truncated completions get reward 0.
    """

    def __init__(self, env: Environment, rows: list[dict], base_url: str, model_name: str, batch_size: int,
                 rollouts_per_example: int, sampling_args: dict, max_seq_len: int, max_concurrent: int = 1024,
                 generation_timeout: float = 600.0, mask_truncated_completions: bool = False,
                 zero_truncated_completions: bool = False, mask_env_responses: bool = True, api_key: str = "vf-rl"):
        if not rows:
            raise ValueError("the environment has no training rows (after filtering by max_prompt_len)")
        self.env, self.rows = env, rows
        self.model_name = model_name
        self.batch_size, self.group_size = batch_size, rollouts_per_example
        self.prompts_per_batch = batch_size // rollouts_per_example
        self.sampling_args, self.max_seq_len = sampling_args, max_seq_len
        self.max_concurrent, self.generation_timeout = max_concurrent, generation_timeout
        self.mask_truncated, self.zero_truncated = mask_truncated_completions, zero_truncated_completions
        self.mask_env_responses = mask_env_responses
        self.futures: dict[int, Future] = {}
        self.done: dict[int, int] = {}  # step -> rollouts finished so far (progress)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vf-rl-orchestrator", daemon=True)
        self.thread.start()
        self.client = asyncio.run_coroutine_threadsafe(self._make_client(base_url, api_key), self.loop).result()

    async def _make_client(self, base_url: str, api_key: str) -> AsyncOpenAI:
        return openai_client(base_url, api_key, self.generation_timeout)

    def rows_for_step(self, step: int) -> list[dict]:
        """The dataset rows of batch ``step``: the next ``prompts_per_batch`` rows, wrapping around."""
        start = step * self.prompts_per_batch
        return [self.rows[(start + i) % len(self.rows)] for i in range(self.prompts_per_batch)]

    def submit(self, step: int) -> None:
        """Start generating batch ``step`` in the background (no-op if already submitted)."""
        if step not in self.futures:
            self.futures[step] = asyncio.run_coroutine_threadsafe(self._generate(step), self.loop)

    def wait_idle(self) -> None:
        """Block until no batch is being generated (results stay available to ``get``)."""
        for future in list(self.futures.values()):
            try:
                future.result(timeout=self.generation_timeout + 60)
            except Exception:
                pass  # get() re-raises it for the step that needs it

    def progress(self, step: int) -> tuple[int, int]:
        """``(finished, total)`` rollouts of batch ``step``."""
        return self.done.get(step, 0), self.batch_size

    def run(self, rows: list[dict], rollouts_per_example: int) -> list:
        """Roll out ``rows`` now (blocking), outside the training batches: for evaluation."""
        coro = self.env.generate(self.client, self.model_name, rows, rollouts_per_example, self.sampling_args,
                                 self.max_concurrent, timeout=self.generation_timeout)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=self.generation_timeout + 60)

    def get(self, step: int) -> Batch:
        """Wait for batch ``step`` (submitting it first if needed) and return it.

        Raises:
            TimeoutError: generation took longer than ``generation_timeout``.
            RuntimeError: every rollout of the batch failed.
        """
        self.submit(step)
        try:
            return self.futures.pop(step).result(timeout=self.generation_timeout + 60)
        except TimeoutError:
            raise TimeoutError(f"generating batch {step} took over {self.generation_timeout:.0f} s "
                               "(generation_timeout); is the inference server overloaded or stuck?") from None

    async def _generate(self, step: int) -> Batch:
        start = time.perf_counter()
        rows = self.rows_for_step(step)
        self.done[step] = 0

        def on_done(_rollout):
            self.done[step] += 1

        rollouts = await self.env.generate(self.client, self.model_name, rows, self.group_size, self.sampling_args,
                                           self.max_concurrent, timeout=self.generation_timeout, on_done=on_done)
        generation_s = time.perf_counter() - start
        errors = [r for r in rollouts if r.error]
        if len(errors) == len(rollouts):
            raise RuntimeError(f"every rollout of batch {step} failed; first error: {errors[0].error}")
        for cause, count in Counter(r.error for r in errors).items():  # each distinct cause once per batch
            print(f"[orchestrator] batch {step}: {count}/{len(rollouts)} rollouts failed (reward 0, no loss): {cause}",
                  file=sys.stderr, flush=True)
        if self.zero_truncated:
            for r in rollouts:
                if r.is_truncated:
                    r.reward = 0.0
        advantages = group_advantages([r.reward for r in rollouts], self.group_size)
        samples = []
        for rollout, advantage in zip(rollouts, advantages):
            if rollout.error or (self.mask_truncated and rollout.is_truncated):
                continue
            samples += rollout_to_samples(rollout.turns, advantage, self.max_seq_len, self.mask_env_responses)
        metrics = {**rollout_metrics(rollouts, self.group_size), "timing/generation_s": generation_s,
                   "advantage/absmean": statistics.fmean(abs(a) for a in advantages)}
        completion_tokens = sum(len(t.completion_ids) for r in rollouts for t in r.turns)
        metrics["throughput/generation_tokens_per_s"] = completion_tokens / max(generation_s, 1e-9)
        return Batch(step, samples, rollouts, metrics, [row.get("row_id") for row in rows])

    def close(self) -> None:
        """Cancel pending batches and stop the background loop."""
        for future in self.futures.values():
            future.cancel()
        asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
