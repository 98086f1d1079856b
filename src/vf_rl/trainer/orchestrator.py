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
import time
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Callable

from vf_rl.envs import Environment, Rollout
from vf_rl.inference.client import openai_client
from vf_rl.metrics import rollout_metrics

from .advantage import AdvantageFn, compute_advantages, group_mean
from .batching import Sample, rollout_to_samples


@dataclass
class Batch:
    """Everything the trainer needs for one step.

    Attributes:
        step: the optimizer step this batch is for (0-based).
        samples: training samples of all processes (``>= batch_size`` for multi-turn).
        rollouts: the scored rollouts, grouped by prompt.
        metrics: ``reward``, ``reward/std``, ``reward/<func>``, ``advantage/absmean``,
            ``tokens/completion``, ``errors/rate``, ``timing/generation_s``...
        row_ids: the dataset index of each prompt of the batch.
    """

    step: int
    samples: list[Sample]
    rollouts: list[Rollout]
    metrics: dict[str, float] = field(default_factory=dict)
    row_ids: list = field(default_factory=list)


class Orchestrator:
    """Generates batches for the trainer in a background thread.

    Args (keyword-only after ``rows``):
        env: the environment.
        rows: training rows (dicts with ``prompt``, ``answer``...), already shuffled/filtered.
        base_url: the OpenAI-compatible server, e.g. ``http://127.0.0.1:8000/v1``.
        model_name: the model name the server serves.
        batch_size: rollouts per batch; ``batch_size // rollouts_per_example`` rows each.
        rollouts_per_example: rollouts per prompt (the group size).
        sampling_args: chat-completion arguments (see ``RLConfig.sampling_args``).
        max_seq_len: samples are cut to this many tokens.
        advantage_fn: from rewards to advantages (``advantage.py``).
        max_concurrent: most rollouts in flight.
        generation_timeout: seconds allowed for one batch; rollouts still running then are
            counted as errors.
        request_timeout: seconds allowed for one request to the server.
        mask_truncated_completions: truncated completions get no loss tokens.
        zero_truncated_completions: truncated completions get reward 0.
        mask_env_responses: environment-written tokens get no loss (multi-turn).
    """

    def __init__(self, env: Environment, rows: list[dict], *, base_url: str, model_name: str, batch_size: int,
                 rollouts_per_example: int, sampling_args: dict, max_seq_len: int,
                 advantage_fn: AdvantageFn = group_mean, max_concurrent: int = 1024, generation_timeout: float = 600.0,
                 request_timeout: float = 600.0, mask_truncated_completions: bool = False,
                 zero_truncated_completions: bool = False, mask_env_responses: bool = True, api_key: str = "vf-rl"):
        if not rows:
            raise ValueError("the environment has no training rows (after filtering by max_prompt_len)")
        self.env, self.rows, self.model_name = env, rows, model_name
        self.batch_size, self.rollouts_per_example = batch_size, rollouts_per_example
        self.prompts_per_batch = batch_size // rollouts_per_example
        self.sampling_args, self.max_seq_len, self.advantage_fn = sampling_args, max_seq_len, advantage_fn
        self.max_concurrent, self.generation_timeout = max_concurrent, generation_timeout
        self.mask_truncated, self.zero_truncated = mask_truncated_completions, zero_truncated_completions
        self.mask_env_responses = mask_env_responses
        self._futures: dict[int, Future] = {}
        self._done: dict[int, int] = {}  # step -> rollouts finished so far (progress)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vf-rl-orchestrator", daemon=True)
        self._thread.start()
        self.client = self._call(self._make_client(base_url, api_key, request_timeout))

    async def _make_client(self, base_url: str, api_key: str, request_timeout: float):
        return openai_client(base_url, api_key, request_timeout)

    def _call(self, coro, timeout: float | None = None):
        """Run ``coro`` on the orchestrator's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    def rows_for_step(self, step: int) -> list[dict]:
        """The dataset rows of batch ``step``: the next ``prompts_per_batch`` rows, wrapping around."""
        start = step * self.prompts_per_batch
        return [self.rows[(start + i) % len(self.rows)] for i in range(self.prompts_per_batch)]

    def submitted(self, step: int) -> bool:
        """Whether batch ``step`` is being generated or waits to be taken."""
        return step in self._futures

    def submit(self, step: int) -> None:
        """Start generating batch ``step`` in the background (no-op if already submitted)."""
        if step not in self._futures:
            self._futures[step] = asyncio.run_coroutine_threadsafe(self._generate(step), self._loop)

    def wait(self, step: int, on_progress: Callable[[int, int], None] | None = None) -> Batch:
        """Wait for batch ``step`` (submitting it first if needed) and take it.

        Args:
            on_progress: called with ``(finished, total)`` rollouts about once a second while
                the batch is not ready, and once more when it is, if it was called before.
        Raises:
            RuntimeError: every rollout of the batch failed.
            TimeoutError: the environment did not return within ``generation_timeout`` + 60 s.
        """
        self.submit(step)
        future = self._futures[step]
        waited = False
        while on_progress is not None and not future.done():
            try:
                future.result(timeout=1.0)
            except FutureTimeout:
                on_progress(self._done.get(step, 0), self.batch_size)
                waited = True
            except Exception:
                break  # raised below
        if waited:
            on_progress(self._done.get(step, 0), self.batch_size)
        del self._futures[step]
        try:
            return future.result(timeout=self.generation_timeout + 60)  # generate() itself stops at the timeout
        except FutureTimeout:
            raise TimeoutError(f"batch {step}: the environment did not return within generation_timeout "
                               f"({self.generation_timeout:.0f} s) + 60 s") from None

    def wait_idle(self) -> None:
        """Block until no batch is being generated (results stay available to ``wait``)."""
        for future in list(self._futures.values()):
            try:
                future.result()
            except Exception:
                pass  # wait() re-raises it for the step that needs it

    def run(self, rows: list[dict], rollouts_per_example: int) -> list[Rollout]:
        """Roll out ``rows`` now (blocking), outside the training batches: for evaluation."""
        return self._call(self.env.generate(self.client, self.model_name, rows, rollouts_per_example,
                                            self.sampling_args, self.max_concurrent, timeout=self.generation_timeout))

    async def _generate(self, step: int) -> Batch:
        start = time.perf_counter()
        rows = self.rows_for_step(step)
        self._done[step] = 0

        def on_done(_rollout):
            self._done[step] += 1

        rollouts = await self.env.generate(self.client, self.model_name, rows, self.rollouts_per_example,
                                           self.sampling_args, self.max_concurrent, timeout=self.generation_timeout,
                                           on_done=on_done)
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
        advantages = compute_advantages(self.advantage_fn, rollouts, self.rollouts_per_example)
        samples = []
        for i, (rollout, advantage) in enumerate(zip(rollouts, advantages)):
            if rollout.error or (self.mask_truncated and rollout.is_truncated):
                continue
            samples += rollout_to_samples(rollout.turns, advantage, self.max_seq_len, self.mask_env_responses,
                                          group=i // self.rollouts_per_example)
        completion_tokens = sum(len(t.completion_ids) for r in rollouts for t in r.turns)
        metrics = {**rollout_metrics(rollouts, self.rollouts_per_example), "timing/generation_s": generation_s,
                   "advantage/absmean": statistics.fmean(abs(a) for a in advantages),
                   "throughput/generation_tokens_per_s": completion_tokens / max(generation_s, 1e-9)}
        return Batch(step, samples, rollouts, metrics, [row.get("row_id") for row in rows])

    def close(self) -> None:
        """Cancel pending batches and stop the background loop."""
        for future in self._futures.values():
            future.cancel()
        self._call(self.client.close(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
