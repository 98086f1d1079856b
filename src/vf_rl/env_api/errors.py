"""Where a failed rollout broke: every rollout error is filed under one kind and explained in one line.

A failed rollout scores 0 and trains nothing; its ``error`` says what happened (the exception
and the causes behind it) and its ``error_kind`` where, one of :data:`KINDS`:

- ``model``: the call to the model server failed (connection, HTTP error such as vLLM's 400
  for a request it refuses, a response without token ids);
- ``tool``: a tool the environment exposes could not be run;
- ``parser``: a model's output could not be parsed (a tool call, a parser of the environment);
- ``reward``: a reward function raised;
- ``timeout``: the rollout did not finish within ``generation_timeout``;
- ``environment``: anything else the environment's own code raised.

The metrics count each kind (``errors/<kind>``, :func:`vf_rl.orchestrator.metrics.rollout_metrics`).
"""

from __future__ import annotations

import asyncio

KINDS = ("model", "tool", "parser", "reward", "timeout", "environment")

# verifiers' exception names (classic ``verifiers.errors``, v1 ``verifiers.v1.errors``) -> kind;
# the first name of an error's chain found here decides.
VERIFIERS_KINDS = {
    "ModelError": "model", "InvalidModelResponseError": "model", "EmptyModelResponseError": "model",
    "OverlongPromptError": "model", "ProviderError": "model",
    "ToolParseError": "parser", "ToolCallError": "tool", "ToolError": "tool", "ToolsetError": "tool",
    "InfraError": "environment", "SandboxError": "environment", "EnvError": "environment",
    "HarnessError": "environment", "InterceptionError": "environment", "TunnelError": "environment",
}


class RewardFunctionError(Exception):
    """A reward function raised; the message names the function and the original error, which
    is the ``__cause__``."""

    def __init__(self, name: str, exc: BaseException):
        super().__init__(f"reward function {name} raised {describe(exc)}")
        self.kind = "parser" if raised_in_parser(exc) else "reward"


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` followed by its causes (``__cause__``, then ``__context__``
    of an exception raised while handling another), e.g. ``APIConnectionError: Connection
    error. (caused by ConnectError: All connection attempts failed)``; an exception without a
    message is its type's name."""
    if isinstance(exc, asyncio.TimeoutError) and not str(exc):
        return "TimeoutError: the rollout did not finish within the time allowed (generation_timeout)"
    if isinstance(exc, RewardFunctionError):  # its message names the function and the error
        return str(exc)
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    cause, seen = exc.__cause__ or exc.__context__, {id(exc)}
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text += f" (caused by {type(cause).__name__}: {cause})" if str(cause) else f" (caused by {type(cause).__name__})"
        cause = cause.__cause__ or cause.__context__
    return text


def raised_in_parser(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside a method of a vf-rl :class:`~vf_rl.env_api.parsers.Parser`."""
    from vf_rl.env_api.parsers import Parser

    tb = exc.__traceback__
    while tb is not None:
        if isinstance(tb.tb_frame.f_locals.get("self"), Parser):
            return True
        tb = tb.tb_next
    return False


def kind_of(exc: BaseException) -> str:
    """The kind (:data:`KINDS`) of an exception raised while rolling out or scoring."""
    import httpx
    import openai

    if hasattr(exc, "kind") and exc.kind in KINDS:
        return exc.kind
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, (openai.OpenAIError, httpx.HTTPError, ModelServerError)):
        return "model"
    names = [type(e).__name__ for e in type(exc).__mro__]
    return next((VERIFIERS_KINDS[n] for n in names if n in VERIFIERS_KINDS), "environment")


def kind_of_names(names: list[str], message: str = "") -> str:
    """The kind of an error a ``verifiers`` rollout recorded, from its chain of exception type
    names (outermost first) and its message (v1 reports a failing ``@reward`` as a
    ``TaskError`` whose message starts with ``scoring``)."""
    for name in names:
        if name == "TaskError":
            return "reward" if "scoring" in message.split(":", 1)[0] else "environment"
        if name in VERIFIERS_KINDS:
            return VERIFIERS_KINDS[name]
        if name in ("TimeoutError", "APITimeoutError"):
            return "timeout"
        if name.startswith("API") or name in ("ConnectError", "ReadTimeout", "RemoteProtocolError"):
            return "model"
    return "environment"


class ModelServerError(RuntimeError):
    """The model server answered, but not with what a rollout needs (no token ids or log-probs)."""


class AllRolloutsFailed(RuntimeError):
    """Every rollout of a batch failed: training cannot go on; the message names the first error
    and its kind."""
