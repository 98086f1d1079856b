"""Rollouts group by group: :class:`GroupRunner` (every row's group as one call, a bounded number
at a time, errors per group), and :class:`GroupSampler`, one request per group's shared prompt: a
single-turn group (:class:`SingleTurnGroups`) or a multi-turn group's first turn
(:class:`MultiTurnGroups`).

A single-turn environment asks the same prompt ``r`` times. Sent as ``r`` chat completions, vLLM's
API server renders and tokenizes the prompt ``r`` times, schedules ``r`` requests, and the client
parses ``r`` responses with a log-prob object per token: the request path, not the GPU, bounds the
rollouts per second of a small model (``docs/benchmarks.md``). Here the prompt is rendered and
tokenized once by the server's own chat template (``POST /tokenize``, cached per prompt), and the
group is one ``POST /v1/completions`` with the prompt's token ids and ``n = r`` (vLLM samples the
``r`` children from one prefill), read as plain JSON: token ids, the sampled tokens' log-probs
(``logprobs: 0``) and the text, the same fields the chat path reads.

Only sampling arguments with the same meaning in both APIs take this path
(:func:`completion_args`); anything chat-only (tools, response formats...) keeps the chat path.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from typing import Any

from vf_rl.env_api.parsers import Messages
from vf_rl.env_api.rollout import Rollout, Turn, merge_sampling_args, post_json, prompt_messages, row_info, set_error

COMPLETION_KEYS = frozenset({"max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
                             "frequency_penalty", "logit_bias", "user"})
"""Top-level chat-completion arguments that ``/v1/completions`` takes with the same meaning."""

TEMPLATE_KEYS = frozenset({"chat_template", "chat_template_kwargs"})
"""``extra_body`` keys that shape the rendered prompt: they go to ``/tokenize``, not to sampling."""


def completion_args(sampling_args: dict) -> tuple[dict, dict] | None:
    """Split chat-completion ``sampling_args`` into ``(completion arguments, template arguments)``
    for a group request, or ``None`` when some argument has no completion equivalent.

    ``max_completion_tokens`` becomes ``max_tokens``; ``extra_body`` keys go to the completion
    request (vLLM's sampling extensions: ``top_k``, ``min_p``, ``repetition_penalty``...) except
    :data:`TEMPLATE_KEYS`, which go to ``/tokenize``."""
    args = dict(sampling_args)
    if "max_completion_tokens" in args:
        args["max_tokens"] = args.pop("max_completion_tokens")
    extra = dict(args.pop("extra_body", None) or {})
    if not set(args) <= COMPLETION_KEYS:
        return None
    template = {k: extra.pop(k) for k in list(extra) if k in TEMPLATE_KEYS}
    return {**args, **extra}, template


def group_request_args(env, client, sampling_args: dict, r: int) -> tuple[dict, dict, dict] | None:
    """``(completion arguments, template arguments, rendered-prompt cache)`` for sampling
    ``env``'s groups of ``r`` as one request each, or ``None`` when they cannot be: an argument
    without a completion equivalent (:func:`completion_args`), or greedy decoding with ``r > 1``
    (vLLM takes ``n > 1`` only when sampling). The cache is the environment's, per server."""
    split = completion_args(merge_sampling_args(env.sampling_args, sampling_args))
    if split is None or (r > 1 and split[0].get("temperature") == 0):
        return None
    cache = env.__dict__.setdefault("_prompt_ids", {}).setdefault(str(client.base_url), {})
    return (*split, cache)


class GroupSampler:
    """Samples groups through one server's ``/tokenize`` and ``/v1/completions``.

    Args:
        client: an ``openai.AsyncOpenAI`` for the server's ``/v1`` root (its connection pool,
            timeout and retries are used; responses are read as raw JSON).
        cache: rendered prompt -> token ids, kept by the caller across calls.
    """

    def __init__(self, client, cache: dict[str, list[int]]):
        self.client = client
        self.root = str(client.base_url).rstrip("/").removesuffix("/v1")
        self._prompt_ids = cache

    async def prompt_ids(self, model: str, messages: Messages, template_args: dict) -> list[int]:
        """The token ids of ``messages`` rendered by the server's chat template with the
        generation prompt added, as its chat route would render them (cached per prompt)."""
        key = json.dumps([messages, template_args], sort_keys=True)
        if key not in self._prompt_ids:
            body = {"model": model, "messages": messages, "add_generation_prompt": True, **template_args}
            self._prompt_ids[key] = (await post_json(self.client, f"{self.root}/tokenize", body))["tokens"]
        return self._prompt_ids[key]

    async def sample(self, model: str, messages: Messages, n: int, args: dict, template_args: dict) -> list:
        """``n`` completions of one prompt: ``(assistant message, turn, truncated)`` each (the turn
        an ``environment.Turn``), in the server's choice order.

        Raises:
            ModelServerError: the server returned no token ids or log-probs (not vLLM >= 0.10), or
                a number of log-probs that differs from the number of tokens.
            openai.APIError: the request failed (after the client's retries).
        """
        prompt = await self.prompt_ids(model, messages, template_args)
        body = {**args, "model": model, "prompt": prompt, "n": n, "logprobs": 0, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "skip_special_tokens": args.get("skip_special_tokens", False)}
        choices = sorted((await post_json(self.client, "/completions", body))["choices"], key=lambda c: c["index"])
        results = []
        for choice in choices:
            turn = Turn.served(prompt, choice.get("token_ids"), (choice.get("logprobs") or {}).get("token_logprobs"))
            results.append(({"role": "assistant", "content": choice["text"]}, turn, choice["finish_reason"] == "length"))
        return results


def error_rollouts(row: dict, index: int, r: int, exc: BaseException) -> list[Rollout]:
    """``r`` rollouts of ``row`` that all failed with ``exc`` (reward 0, no turns); a bare
    ``asyncio.TimeoutError`` is reported as the ``generation_timeout`` it is."""
    rollouts = []
    for _ in range(r):
        rollout = Rollout(example_id=index, prompt=prompt_messages(row["prompt"]), answer=row.get("answer"),
                          info=row_info(row.get("info")), task=row.get("task"))
        set_error(rollout, exc)
        rollouts.append(rollout)
    return rollouts


class GroupRunner:
    """The ``generate`` of both verifiers adapters and of :class:`SingleTurnGroups`: every row's
    group of rollouts runs as one call (:meth:`_run_group`), a bounded number of groups at a
    time, all inside :meth:`_serving`; a group that raises or runs past the deadline becomes
    error rollouts."""

    def _start(self, client, model: str, sampling_args: dict) -> Any:
        """Per-``generate`` context handed to :meth:`_run_group` (e.g. the package's client)."""
        raise NotImplementedError

    def _serving(self):
        """An async context manager held around one ``generate`` (none by default)."""
        return contextlib.nullcontext()

    async def _run_group(self, context: Any, row: dict, index: int, r: int) -> list[Rollout]:
        """``r`` rollouts of ``row`` (its position ``index`` in the call's rows)."""
        raise NotImplementedError

    async def _group(self, context: Any, row: dict, index: int, r: int, semaphore: asyncio.Semaphore,
                     deadline: float | None, on_done) -> list[Rollout]:
        """One :meth:`_run_group`; past ``deadline`` (the event loop's clock) or on any exception
        every rollout of the group is an error with reward 0."""
        async with semaphore:
            try:
                left = None if deadline is None else max(deadline - asyncio.get_running_loop().time(), 0.0)
                rollouts = await asyncio.wait_for(self._run_group(context, row, index, r), left)
            except Exception as exc:  # the whole group failed: errors, training goes on
                rollouts = error_rollouts(row, index, r, exc)
        if on_done is not None:
            for rollout in rollouts:
                on_done(rollout)
        return rollouts

    async def generate(self, client, model: str, rows: list[dict], rollouts_per_example: int,
                       sampling_args: dict, max_concurrent: int = 1024,
                       timeout: float | None = None, on_done=None) -> list[Rollout]:
        """Roll out every row ``rollouts_per_example`` times, one group call per row.

        Args:
            client: vf-rl's ``openai.AsyncOpenAI`` for the vf-vllm server.
            model: the served model name.
            rows: dataset rows (dicts with ``prompt``, ``answer``, ``info``, ``example_id``).
            sampling_args: chat-completion arguments, merged over the environment's own;
                token ids and sampling log-probs are always requested.
            max_concurrent: rollouts in flight at once (whole groups are started).
            timeout: seconds allowed for the whole call (``None``: unlimited); groups not
                finished by then are errors.
            on_done: called with each rollout as its group finishes.
        Returns:
            ``len(rows) * rollouts_per_example`` rollouts grouped per row; each model call of a
            rollout is one :class:`Turn` with vLLM's token ids and sampling log-probs. A
            rollout whose rollout, reward function or group raised has ``error`` set and reward 0.
        """
        context = self._start(client, model, sampling_args)
        if inspect.isawaitable(context):
            context = await context
        semaphore = asyncio.Semaphore(max(1, max_concurrent // max(1, rollouts_per_example)))
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        async with self._serving():
            groups = await asyncio.gather(*(
                self._group(context, row, i, rollouts_per_example, semaphore, deadline, on_done)
                for i, row in enumerate(rows)))
        return [rollout for group in groups for rollout in group]


class GroupRequests(GroupRunner):
    """A :class:`GroupRunner` whose groups share one sampling request per prompt.

    Args:
        env: the environment (its ``rubric`` scores, its ``new_rollouts`` shapes the rollouts).
        args, template_args, cache: from :func:`group_request_args`.
    """

    def __init__(self, env, args: dict, template_args: dict, cache: dict[str, list[int]]):
        self.env, self.args, self.template_args, self.cache = env, args, template_args, cache


class SingleTurnGroups(GroupRequests):
    """A single-turn environment's groups, each sampled with one request (:class:`GroupSampler`)
    and scored rollout by rollout (a reward function's error is that rollout's alone)."""

    def _start(self, client, model: str, sampling_args: dict) -> tuple[GroupSampler, str]:
        return GroupSampler(client, self.cache), model

    async def _run_group(self, context: tuple[GroupSampler, str], row: dict, index: int, r: int) -> list[Rollout]:
        sampler, model = context
        rollouts = self.env.new_rollouts([row], r)
        samples = await sampler.sample(model, rollouts[0].prompt, r, self.args, self.template_args)
        for rollout, (message, turn, truncated) in zip(rollouts, samples):
            rollout.example_id = index
            rollout.completion, rollout.turns, rollout.is_truncated = [message], [turn], truncated
        await asyncio.gather(*(self._score(rollout) for rollout in rollouts))
        return rollouts

    async def _score(self, rollout: Rollout) -> None:
        try:
            await self.env.score(rollout)
        except Exception as exc:
            set_error(rollout, exc)


class MultiTurnGroups(GroupRequests):
    """A multi-turn environment's groups: the first model turn of a group's rollouts (one prompt)
    is one request with ``n`` children (:class:`GroupSampler`), then each rollout goes on alone
    (``env.rollout`` with that first turn: a chat completion per later turn) and is scored; a
    later turn's or a reward function's error is that rollout's alone. ``env`` is a
    ``MultiTurnEnv`` that uses its own ``rollout`` and ``turn_args``."""

    def _start(self, client, model: str, sampling_args: dict) -> tuple:
        chat_args = merge_sampling_args(self.env.sampling_args, sampling_args)
        return GroupSampler(client, self.cache), client, model, chat_args

    async def _run_group(self, context: tuple, row: dict, index: int, r: int) -> list[Rollout]:
        sampler, client, model, chat_args = context
        rollouts = self.env.new_rollouts([row], r)
        for rollout in rollouts:
            rollout.example_id = index
            await self.env.init_state(rollout)
        prompt = [dict(m) for m in rollouts[0].prompt]
        opens = [not await self.env._maybe_await(self.env.is_completed(prompt, x.state)) for x in rollouts]
        samples = iter(await sampler.sample(model, prompt, sum(opens), self.args, self.template_args)
                       if any(opens) else [])
        await asyncio.gather(*(self._finish(client, model, x, chat_args, next(samples) if open_ else None)
                               for x, open_ in zip(rollouts, opens)))
        return rollouts

    async def _finish(self, client, model: str, rollout: Rollout, chat_args: dict, first_turn) -> None:
        try:
            if first_turn is not None:
                await self.env.rollout(client, model, rollout, chat_args, first_turn=first_turn)
            else:  # done before any turn
                rollout.completion = []
            await self.env.score(rollout)
        except Exception as exc:
            set_error(rollout, exc)
