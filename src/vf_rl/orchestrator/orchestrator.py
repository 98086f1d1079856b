"""Orchestrator: generates training batches in a background thread, one step ahead.

The trainer calls ``submit(n + 1)`` and then trains on batch ``n`` while the orchestrator's
own asyncio loop runs batch ``n + 1``'s rollouts against the inference server. A batch is
fully determined by its step number (which dataset rows it uses), so generation can be
re-done for any step, e.g. after a resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Callable, Protocol

from vf_rl.algorithm.advantage import AdvantageFn, compute_advantages, group_mean
from vf_rl.config.sections import OrchestratorConfig
from vf_rl.env_api import Environment, Rollout
from vf_rl.env_api.errors import AllRolloutsFailed
from vf_rl.inference.client import ENGINE_DEAD, openai_client, request_count
from vf_rl.orchestrator.filtering import DifficultyFilter
from vf_rl.orchestrator.metrics import env_metrics, rollout_metrics
from vf_rl.orchestrator.samples import Sample, exceeds_max_seq_len, rollout_to_samples
from vf_rl.orchestrator.watch import EVAL, orchestrator_watch
from vf_rl.watchdog import Limits, Watch, wait_watched

SERVER_ERRORS = ("APIConnectionError", ENGINE_DEAD)
"""What a rollout's error names when the server could not answer it: unreachable (it died or
restarts), or its engine died (the server then stops and is restarted)."""


class WeightsLost(Exception):
    """The weight update a batch was to be generated with failed, so the batch was not generated."""


def weights_lost_line(step: int) -> str:
    """The line that says the batch of step ``step`` (0-based; the line counts from 1, as the trainer
    does) is generated late, with the current weights."""
    return (f"[orchestrator] batch {step + 1}: the weight update it was to be generated with failed; it is generated "
            "when the trainer takes it, with the current weights")


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
        server_errors: rollouts that failed because the server could not be reached.
        advantages: each rollout's advantage, in the order of ``rollouts`` (empty when not computed).
    """

    step: int
    samples: list[Sample]
    rollouts: list[Rollout]
    metrics: dict[str, float] = field(default_factory=dict)
    row_ids: list = field(default_factory=list)
    server_errors: int = 0
    advantages: list[float] = field(default_factory=list)


def batch_rows(rows: list[dict], step: int, prompts_per_batch: int) -> list[dict]:
    """The rows of batch ``step``: ``rows[step * prompts_per_batch:][:prompts_per_batch]``,
    wrapping around the end of ``rows``."""
    start = step * prompts_per_batch
    return [rows[(start + i) % len(rows)] for i in range(prompts_per_batch)]


def report_progress(future: Future, progress: Callable[[], int], total: int,
                    on_progress: Callable[[int, int], None] | None, watch: Watch | None = None) -> None:
    """Until ``future`` is done, call ``on_progress(progress(), total)`` about once a second, and
    once more at the end if it was called at all (a batch ready at once prints nothing), and
    ``watch.check()`` as often.

    Raises:
        Stalled: from the watch (``vf_rl.watchdog``).
    """
    waited = False
    while (on_progress is not None or watch is not None) and not future.done():
        try:
            future.result(timeout=1.0)
        except FutureTimeout:
            if watch is not None:
                watch.check()
            if on_progress is not None:
                on_progress(progress(), total)
                waited = True
        except Exception:
            break  # the caller raises it
    if waited:
        on_progress(progress(), total)


class OrchestratorInterface(Protocol):
    """What the trainer asks of an orchestrator, whether a thread in its process
    (:class:`Orchestrator`) or a process of its own (``process.OrchestratorProcess``)."""

    def set_active(self, servers) -> None:
        """Send rollouts only to these servers (indices into the server list)."""

    def submitted(self, step: int) -> bool:
        """Whether batch ``step`` is being generated or waits to be taken."""

    def submit(self, step: int, policy_step: int | None = None, after: Future | None = None) -> None:
        """Start generating batch ``step`` (with the weights of ``policy_step``, once ``after`` is done)."""

    def wait(self, step: int, on_progress: Callable[[int, int], None] | None = None) -> "Batch":
        """Wait for batch ``step`` and take it."""

    def progress(self, step: int) -> int:
        """Rollouts of batch ``step`` finished so far."""

    def state(self, step: int | None) -> dict:
        """How the orchestrator stands while batch ``step`` is waited for (the watchdog's look)."""

    def wait_idle(self) -> None:
        """Wait until no batch is being generated."""

    def run(self, rows: list[dict], rollouts_per_example: int) -> list[Rollout]:
        """Roll out ``rows`` now (evaluation), ``rollouts_per_example`` each."""

    def close(self) -> None:
        """Stop generating and release what the orchestrator holds."""


INTERFACE = tuple(name for name in vars(OrchestratorInterface) if not name.startswith("_"))
"""The methods of :class:`OrchestratorInterface`: what the orchestrator's process serves."""


async def _cancel_tasks() -> None:
    """Cancel every other task of the running loop and wait until they have ended."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Orchestrator:
    """Generates batches for the trainer in a background thread (:class:`OrchestratorInterface`).

    Args:
        env: the environment.
        rows: training rows (dicts with ``prompt``, ``answer``...), already shuffled/filtered.
        config: the orchestrator's section of the run config (``OrchestratorConfig.from_args``).
        base_url: the OpenAI-compatible server, e.g. ``http://127.0.0.1:8000/v1``, or a list of
            several: each group of rollouts goes to the active server with the fewest rollouts
            in flight (a group stays on one server, so its prompt is cached once).
        model_name: the model name the server serves.
        advantage_fn: from rewards to advantages (``algorithm/advantage.py``).
        difficulty_filter: drop groups without reward spread and refill (``filtering.py``);
            default the one ``config.filtering`` asks for.
    """

    def __init__(self, env: Environment, rows: list[dict], *, config: OrchestratorConfig, base_url: str | list[str],
                 model_name: str, advantage_fn: AdvantageFn = group_mean,
                 difficulty_filter: DifficultyFilter | None = None, api_key: str = "vf-rl"):
        if not rows:
            raise ValueError("the environment has no training rows (after filtering by max_prompt_len)")
        c = config
        self.env, self.rows, self.model_name, self.config = env, rows, model_name, c
        self.batch_size, self.rollouts_per_example = c.batch_size, c.rollouts_per_example
        self.prompts_per_batch = c.batch_size // c.rollouts_per_example
        self.sampling_args, self.max_seq_len, self.advantage_fn = c.sampling_args, c.max_seq_len, advantage_fn
        self.max_concurrent, self.generation_timeout = c.max_concurrent, c.generation_timeout
        self.mask_truncated, self.zero_truncated = c.mask_truncated_completions, c.zero_truncated_completions
        self.mask_env_responses = c.mask_env_responses
        self.difficulty_filter = difficulty_filter or (DifficultyFilter(**vars(c.filtering)) if c.filtering else None)
        self._futures: dict[int, Future] = {}
        self._done: dict[int, int] = {}  # step -> rollouts finished so far (progress); EVAL: the evaluation's
        self._totals: dict[int, int] = {EVAL: 0}  # step -> rollouts asked for
        self._policy_step: int | None = None  # the weights the server holds (the last batch's policy_step)
        self.limits: Limits | None = Limits.of(c)  # the trainer's waits on this orchestrator (watch.py)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vf-rl-orchestrator", daemon=True)
        self._thread.start()
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self._counts = [request_count() for _ in urls]  # requests in flight and answered, per server
        self.clients = [self._call(self._make_client(url, api_key, c.request_timeout, count))
                        for url, count in zip(urls, self._counts)]
        self.active = set(range(len(self.clients)))  # servers with the current weights, answering
        self._in_flight = [0] * len(self.clients)

    async def _make_client(self, base_url: str, api_key: str, request_timeout: float, count=None):
        return openai_client(base_url, api_key, request_timeout, count)

    def set_active(self, servers) -> None:
        """Send rollouts only to these servers (indices): the trainer calls it after each
        weight sync with the servers that got the weights."""
        self.active = set(servers)

    def _call(self, coro, timeout: float | None = None):
        """Run ``coro`` on the orchestrator's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    def rows_for_step(self, step: int) -> list[dict]:
        """The dataset rows of batch ``step`` (:func:`batch_rows`; several environments: split by
        weight, ``env_api/mixture.py``)."""
        if hasattr(self.env, "rows_for_step"):
            return self.env.rows_for_step(self.rows, step, self.prompts_per_batch)
        return batch_rows(self.rows, step, self.prompts_per_batch)

    def submitted(self, step: int) -> bool:
        """Whether batch ``step`` is being generated or waits to be taken."""
        return step in self._futures

    def submit(self, step: int, policy_step: int | None = None, after: Future | None = None) -> None:
        """Start generating batch ``step`` in the background (no-op if already submitted).

        Args:
            policy_step: the optimizer step whose weights the server holds (default ``step``);
                ``step - policy_step`` is logged as ``off_policy/staleness``.
            after: a ``concurrent.futures.Future`` to wait for first (a weight update still
                being pushed). If it fails, the batch is not generated then (rollouts from the
                weights before it would be further off-policy than the run allows) but when
                :meth:`wait` takes it, after the trainer has handled the push's error (waited for
                the restarted server and pushed the current weights).
        """
        if step not in self._futures:
            self._policy_step = step if policy_step is None else policy_step
            staleness = step - (step if policy_step is None else policy_step)
            self._totals[step] = self.batch_size
            self._futures[step] = asyncio.run_coroutine_threadsafe(self._generate(step, staleness, after), self._loop)

    def wait(self, step: int, on_progress: Callable[[int, int], None] | None = None) -> Batch:
        """Wait for batch ``step`` (submitting it first if needed) and take it.

        Args:
            on_progress: called with ``(finished, total)`` rollouts about once a second while
                the batch is not ready, and once more when it is, if it was called before.
        Raises:
            RuntimeError: every rollout of the batch failed.
            TimeoutError: the environment did not return within ``generation_timeout`` + 60 s.
            Stalled: no progress for ``stall_timeout`` s (``vf_rl.watchdog``).
        """
        self.submit(step)
        try:
            return self._take(step, on_progress)
        except WeightsLost:
            print(weights_lost_line(step), file=sys.stderr, flush=True)
            self.submit(step)
            return self._take(step, on_progress)

    def _take(self, step: int, on_progress: Callable[[int, int], None] | None) -> Batch:
        future = self._futures[step]
        report_progress(future, lambda: self.progress(step), self.batch_size, on_progress,
                        self.watch(step, f"batch {step + 1}"))
        try:
            return future.result(timeout=self.generation_timeout + 60)  # generate() itself stops at the timeout
        except FutureTimeout:
            raise TimeoutError(f"batch {step + 1}: the environment did not return within generation_timeout "
                               f"({self.generation_timeout:.0f} s) + 60 s") from None
        finally:
            self._futures.pop(step, None)  # taken (in flight until then: state() shows it)

    def progress(self, step: int) -> int:
        """Rollouts of batch ``step`` finished so far."""
        return self._done.get(step, 0)

    def state(self, step: int | None) -> dict:
        """How the orchestrator stands while batch ``step`` (``watch.EVAL``: the evaluation;
        ``None``: every batch in flight) is waited for: ``step``, ``done`` and ``total`` rollouts,
        the ``batches`` in flight, the ``policy_step`` whose weights the server holds, and per
        server its ``url``, requests ``in_flight``, ``answered`` so far and ``quiet_s`` (seconds
        since the last answer)."""
        batches, done, totals = sorted(self._futures.copy()), self._done.copy(), self._totals.copy()
        steps = batches if step is None else [step]
        return {"step": step, "done": sum(done.get(s, 0) for s in steps),
                "total": sum(totals.get(s, self.batch_size) for s in steps),
                "batches": batches, "policy_step": self._policy_step,
                "servers": [{"url": str(client.base_url).rstrip("/"), "in_flight": count.in_flight,
                             "answered": count.answered, "quiet_s": count.quiet_s()}
                            for client, count in zip(self.clients, self._counts)]}

    def watch(self, step: int, what: str) -> Watch | None:
        """The watch of a wait on this orchestrator for ``what`` (``watch.py``)."""
        return orchestrator_watch(lambda: self.state(step), what, self.limits)

    def wait_idle(self) -> None:
        """Block until no batch is being generated (results stay available to ``wait``).

        Raises:
            Stalled: a batch made no progress for ``stall_timeout`` s."""
        watch = self.watch(None, "the batches in flight (before an evaluation)")
        for future in list(self._futures.values()):
            report_progress(future, lambda: 0, self.batch_size, None, watch)

    def run(self, rows: list[dict], rollouts_per_example: int) -> list[Rollout]:
        """Roll out ``rows`` now (blocking), outside the training batches: for evaluation.

        Raises:
            Stalled: no progress for ``stall_timeout`` s."""
        self._done[EVAL], self._totals[EVAL] = 0, len(rows) * rollouts_per_example

        def on_done(_rollout):
            self._done[EVAL] += 1

        future = asyncio.run_coroutine_threadsafe(self._rollouts(rows, rollouts_per_example, on_done), self._loop)
        try:
            rollouts, _ = wait_watched(future, self.watch(EVAL, "the evaluation's rollouts"))
        except BaseException:
            future.cancel()
            raise
        return rollouts

    async def _rollouts(self, rows: list[dict], rollouts_per_example: int, on_done=None) -> tuple[list, list[int]]:
        """Every row's group on one active server, the least loaded first. Returns the rollouts
        in row order and the server each rollout went to."""
        servers = sorted(self.active) or list(range(len(self.clients)))
        assigned: dict[int, list[int]] = {s: [] for s in servers}
        for i in range(len(rows)):
            server = min(servers, key=lambda s: self._in_flight[s])
            assigned[server].append(i)
            self._in_flight[server] += rollouts_per_example

        async def on_server(server: int, indices: list[int]) -> list[Rollout]:
            try:
                return await self.env.generate(self.clients[server], self.model_name, [rows[i] for i in indices],
                                               rollouts_per_example, self.sampling_args, self.max_concurrent,
                                               timeout=self.generation_timeout, on_done=on_done)
            finally:
                self._in_flight[server] -= rollouts_per_example * len(indices)

        parts = await asyncio.gather(*(on_server(s, idx) for s, idx in assigned.items() if idx))
        by_row: dict[int, tuple[int, list[Rollout]]] = {}
        for (server, indices), part in zip([(s, i) for s, i in assigned.items() if i], parts):
            for k, i in enumerate(indices):
                by_row[i] = server, part[k * rollouts_per_example:(k + 1) * rollouts_per_example]
        rollouts = [r for i in range(len(rows)) for r in by_row[i][1]]
        return rollouts, [by_row[i][0] for i in range(len(rows)) for _ in range(rollouts_per_example)]

    async def _generate(self, step: int, staleness: int = 0, after: Future | None = None) -> Batch:
        if after is not None:
            try:
                await asyncio.wrap_future(after)
            except Exception:  # the trainer handles the push's error; this batch is not generated
                raise WeightsLost(step) from None
        start = time.perf_counter()
        rows = self.rows_for_step(step)
        self._done[step] = 0

        def on_done(_rollout):
            self._done[step] += 1

        server_of: dict[int, int] = {}  # id(rollout) -> the server it went to

        async def generate(rows: list[dict]) -> list[Rollout]:
            rollouts, servers = await self._rollouts(rows, self.rollouts_per_example, on_done=on_done)
            server_of.update({id(r): s for r, s in zip(rollouts, servers)})
            for r in rollouts:  # a rollout the trainer must cut at max_seq_len is truncated too
                if not r.error and exceeds_max_seq_len(r.turns, self.max_seq_len):
                    r.is_truncated = True
                if self.zero_truncated and r.is_truncated:
                    r.reward = 0.0
            return rollouts

        filter_metrics = {}
        if self.difficulty_filter is None:
            rollouts = await generate(rows)
        else:
            def draw(round_index: int, n: int) -> list[dict]:
                return self.difficulty_filter.extra_rows(self.rows, step, round_index, n)

            rows, rollouts, filter_metrics = await self.difficulty_filter.fill(step, rows, self.rollouts_per_example,
                                                                                draw, generate)
        servers = [server_of.get(id(r), 0) for r in rollouts]
        generation_s = time.perf_counter() - start
        errors = [r for r in rollouts if r.error]
        unreachable = [bool(r.error and any(name in r.error for name in SERVER_ERRORS)) for r in rollouts]
        lost = {s for s, gone in zip(servers, unreachable) if gone}
        server_errors = sum(unreachable)
        if len(self.clients) > 1:  # a server that could not be reached gets no rollouts until the next sync
            self.active -= lost
        if len(errors) == len(rollouts) and not server_errors:
            raise AllRolloutsFailed(f"every rollout of batch {step + 1} failed; the first ({errors[0].error_kind} "
                                    f"error): {errors[0].error}")
        for (kind, cause), count in Counter((r.error_kind, r.error) for r in errors).items():  # each cause once
            print(f"[orchestrator] batch {step + 1}: {count}/{len(rollouts)} rollouts failed (reward 0, no loss; "
                  f"{kind} error): {cause}", file=sys.stderr, flush=True)
        advantages = compute_advantages(self.advantage_fn, rollouts, self.rollouts_per_example)
        samples = []
        for i, (rollout, advantage) in enumerate(zip(rollouts, advantages)):
            if rollout.error or (self.mask_truncated and rollout.is_truncated):
                continue
            samples += rollout_to_samples(rollout.turns, advantage, self.max_seq_len, self.mask_env_responses,
                                          group=i // self.rollouts_per_example)
        completion_tokens = sum(len(t.completion_ids) for r in rollouts for t in r.turns)
        metrics = {**rollout_metrics(rollouts, self.rollouts_per_example), **filter_metrics,
                   **env_metrics(rows, rollouts, self.rollouts_per_example),
                   "off_policy/staleness": float(staleness),
                   "timing/generation_s": generation_s,
                   "advantage/absmean": statistics.fmean(abs(a) for a in advantages),
                   "throughput/generation_tokens_per_s": completion_tokens / max(generation_s, 1e-9)}
        if len(self.clients) > 1:
            metrics |= {f"servers/{s}/rollouts": float(servers.count(s)) for s in range(len(self.clients))}
            metrics["servers/active"] = float(len(self.active))
        return Batch(step, samples, rollouts, metrics, [row.get("row_id") for row in rows], server_errors,
                     [float(a) for a in advantages])

    def close(self) -> None:
        """Cancel pending batches and stop the background loop."""
        for future in self._futures.values():
            future.cancel()
        with contextlib.suppress(Exception):  # every task of the loop ended, its error taken (none left pending)
            self._call(_cancel_tasks(), timeout=10)
        for client in self.clients:
            with contextlib.suppress(Exception):  # a stopped server: its requests are cancelled, not awaited
                self._call(client.close(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
