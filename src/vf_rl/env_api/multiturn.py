"""Multi-turn environments: the environment answers each model turn until it is done."""

from __future__ import annotations

import inspect
from typing import Any

import openai

from vf_rl.env_api.environment import Environment, Rollout
from vf_rl.env_api.parsers import Messages


def context_too_long(exc: Exception) -> bool:
    """Whether a server error says the prompt exceeds the model's context (vLLM 0.26-0.33:
    "Input length (N) exceeds model's maximum context length (M)", or "maximum context length")."""
    text = str(exc).lower()
    return "maximum context length" in text or "exceeds model" in text


class MultiTurnEnv(Environment):
    """An environment that replies to the model until ``is_completed`` or ``max_turns``.

    Subclasses implement ``env_response(messages, state)`` returning the messages to append
    (verifiers' classic ``(messages, state)`` tuple is accepted too) and may override
    ``is_completed(messages, state)`` and ``setup_state(state)``.

    ``state`` is a dict shared by the hooks and the reward functions: ``turn`` (model turns
    so far), ``answer``, ``info``, ``prompt``, plus whatever the environment stores.

    A rollout ends as truncated when a model turn is cut at ``max_tokens``, or when the history
    no longer fits the server's context (vf-rl sets vLLM's ``max_model_len`` to ``max_seq_len``).

    Args:
        max_turns: most model turns per rollout (>= 1).
    """

    def __init__(self, max_turns: int = 10, **kwargs: Any):
        super().__init__(**kwargs)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns

    async def setup_state(self, state: dict) -> dict:
        return state

    async def is_completed(self, messages: Messages, state: dict, **kwargs: Any) -> bool:
        return False

    async def env_response(self, messages: Messages, state: dict, **kwargs: Any):
        raise NotImplementedError

    @staticmethod
    async def _maybe_await(value):
        return await value if inspect.isawaitable(value) else value

    async def generate(self, client, model: str, rows: list[dict], rollouts_per_example: int,
                       sampling_args: dict, max_concurrent: int = 1024, timeout: float | None = None,
                       on_done=None) -> list[Rollout]:
        """As :meth:`Environment.generate`. A group's first model turn (the same prompt
        ``rollouts_per_example`` times) is one request with ``n`` children
        (:class:`~.group_sampling.MultiTurnGroups`); later turns, whose histories differ, are one
        chat completion per rollout. Every turn is a chat completion instead when a subclass
        overrides ``rollout`` or ``turn_args`` (tools), or the sampling arguments have no group
        request (:func:`~.group_sampling.group_request_args`)."""
        from vf_rl.env_api.group_sampling import MultiTurnGroups, group_request_args

        split = group_request_args(self, client, sampling_args, rollouts_per_example)
        if (split is None or type(self).rollout is not MultiTurnEnv.rollout
                or type(self).turn_args is not MultiTurnEnv.turn_args):
            return await super().generate(client, model, rows, rollouts_per_example, sampling_args,
                                          max_concurrent, timeout, on_done)
        return await MultiTurnGroups(self, *split).generate(client, model, rows, rollouts_per_example,
                                                            sampling_args, max_concurrent, timeout, on_done)

    async def init_state(self, rollout: Rollout) -> dict:
        """Set up ``rollout.state`` before the first turn (``turn`` 0, ``answer``, ``info``,
        ``prompt``, then :meth:`setup_state`) and return it."""
        state = rollout.state
        state.update(turn=0, answer=rollout.answer, info=rollout.info, prompt=rollout.prompt)
        rollout.state = await self._maybe_await(self.setup_state(state)) or state
        return rollout.state

    async def rollout(self, client, model: str, rollout: Rollout, sampling_args: dict,
                      first_turn: tuple[dict, Any, bool] | None = None) -> None:
        """Run the rollout's turns in place (``completion``, ``turns``, ``state``, ``is_truncated``).

        Args:
            first_turn: the first model call's ``(assistant message, turn, truncated)``, as
                :meth:`call_model` returns it, when it was sampled already (group sampling);
                the state is then set up already (:meth:`init_state`).
        """
        messages = [dict(m) for m in rollout.prompt]
        state = rollout.state if first_turn is not None else await self.init_state(rollout)
        while first_turn is not None or not await self._maybe_await(self.is_completed(messages, state)):
            if first_turn is not None:
                (message, turn, truncated), first_turn = first_turn, None
            else:
                try:
                    message, turn, truncated = await self.call_model(client, model, messages,
                                                                     self.turn_args(sampling_args))
                except openai.BadRequestError as exc:  # the history outgrew the server's max_model_len (= max_seq_len)
                    if not rollout.turns or not context_too_long(exc):
                        raise
                    rollout.is_truncated = True
                    break
            messages.append(message)
            rollout.turns.append(turn)
            state["turn"] += 1
            if truncated:
                rollout.is_truncated = True
                break
            if state["turn"] >= self.max_turns or await self._maybe_await(self.is_completed(messages, state)):
                break
            reply = await self._maybe_await(self.env_response(messages, state))
            if isinstance(reply, tuple):  # verifiers' classic (messages, state)
                reply, new_state = reply
                state.update(new_state or {})
            if isinstance(reply, dict):
                reply = [reply]
            messages.extend(dict(m) for m in reply)
        rollout.completion = messages[len(rollout.prompt):]

    def turn_args(self, sampling_args: dict) -> dict:
        """Sampling arguments of one model call (ToolEnv adds its tools)."""
        return sampling_args
