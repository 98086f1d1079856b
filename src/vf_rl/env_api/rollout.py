"""A rollout and its turns, as the server tokenised and sampled them, and the request helpers that
fill them: the prompt as messages, the sampling arguments merged, one JSON request to the server."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vf_rl.env_api.errors import ModelServerError, describe, kind_of
from vf_rl.env_api.parsers import Messages


@dataclass
class Turn:
    """One model call of a rollout, exactly as the server tokenised and sampled it.

    Attributes:
        prompt_ids: the full templated prompt, ``len = P`` token ids.
        completion_ids: the sampled tokens (the final stop token included), ``len = C``.
        completion_logprobs: log-probability of each sampled token under the sampling
            policy as the server reported it, ``len = C`` floats (nats).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]

    @classmethod
    def served(cls, prompt_ids, completion_ids, logprobs) -> Turn:
        """The turn a server's reply describes: its prompt and sampled token ids and the sampled
        tokens' log-probs, as the reply gave them (``None`` where it gave none).

        Raises:
            ModelServerError: no token ids or log-probs (not vf-vllm, or vLLM < 0.10), or not one
                log-prob per sampled token."""
        if prompt_ids is None or completion_ids is None or logprobs is None:
            raise ModelServerError("the inference server returned no token ids/logprobs; is it vf-vllm (vLLM >= 0.10)?")
        if len(logprobs) != len(completion_ids):
            raise ModelServerError(f"server returned {len(completion_ids)} token ids but {len(logprobs)} logprobs")
        return cls(list(prompt_ids), list(completion_ids), [float(x) for x in logprobs])


async def post_json(client, path: str, body: dict, options: dict | None = None) -> dict:
    """POST ``body`` through an ``openai.AsyncOpenAI`` client's own ``post`` (its connection pool,
    retries and ``openai`` errors; ``options``: request options such as ``headers``) and read the
    reply as plain JSON, not as ``openai``'s typed objects: those cost the orchestrator about as much
    CPU per request as the server's own work (``docs/benchmarks.md``).

    Raises:
        openai.APIError: the request failed (after the client's retries)."""
    import httpx

    response = await client.post(path, body=body, cast_to=httpx.Response, **({"options": options} if options else {}))
    return json.loads(response.content)


@dataclass
class Rollout:
    """One rollout of one dataset row: messages, the turns behind them, and its score."""

    example_id: int
    prompt: Messages
    answer: Any = None
    info: dict = field(default_factory=dict)
    task: str | None = None
    completion: Messages = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    state: dict = field(default_factory=dict)
    is_truncated: bool = False
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    error_kind: str | None = None


def merge_sampling_args(env: dict, given: dict) -> dict:
    """An environment's sampling defaults ``env`` merged with the run's ``given`` arguments.

    Precedence: what the user set > the environment's > vf-rl's built-in defaults (the keys
    ``given.defaults`` names, :class:`SamplingArgs`); a plain dict ``given`` counts as all set by
    the user. ``extra_body`` merges key by key the same way."""
    defaults = getattr(given, "defaults", frozenset())

    def layer(values: dict, keep) -> dict:
        return {k: v for k, v in values.items() if keep(k)}

    top = {**layer(given, lambda k: k != "extra_body" and k in defaults),
           **layer(env, lambda k: k != "extra_body"),
           **layer(given, lambda k: k != "extra_body" and k not in defaults)}
    given_extra, env_extra = given.get("extra_body") or {}, env.get("extra_body") or {}
    extra = {**layer(given_extra, lambda k: f"extra_body.{k}" in defaults), **env_extra,
             **layer(given_extra, lambda k: f"extra_body.{k}" not in defaults)}
    return {**top, **({"extra_body": extra} if extra else {})}


def prompt_messages(prompt: str | Messages) -> Messages:
    """A row's ``prompt`` as chat messages: a plain string is one user message (as verifiers
    reads it), a message list is copied."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


def row_info(info: Any) -> dict:
    """A row's ``info`` as a dict: verifiers accepts a dict or its JSON text (``Info | str``);
    ``None`` or ``""`` is ``{}``.

    Raises:
        ValueError: text that is not a JSON object.
    """
    if isinstance(info, str):
        info = json.loads(info) if info.strip() else {}
        if not isinstance(info, dict):
            raise ValueError(f"a row's info must be a JSON object, got {type(info).__name__}")
    return dict(info or {})


def set_error(rollout: Rollout, exc: BaseException) -> None:
    """Record ``exc`` as the rollout's error (its message and causes, :func:`~.errors.describe`)
    and where it came from (``error_kind``, :func:`~.errors.kind_of`), with reward 0 (training
    goes on without it)."""
    rollout.error, rollout.error_kind, rollout.reward = describe(exc), kind_of(exc), 0.0
