"""Rubric: a weighted sum of reward functions.

Reward functions follow verifiers' convention: plain or ``async`` callables that take
keyword arguments among ``prompt``, ``completion``, ``answer``, ``state``, ``info``, ``task``
and ``parser`` (and ``**kwargs`` to receive them all) and return a float.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable

from vf_rl.env_api.errors import RewardFunctionError
from vf_rl.env_api.parsers import Parser

RewardFunc = Callable[..., Any]


class Rubric:
    """Weighted reward functions.

    Args:
        funcs: reward functions (sync or async).
        weights: one weight per function (default 1.0 each).
        parser: passed to every function as ``parser=``.

    Raises:
        ValueError: if ``weights`` and ``funcs`` differ in length.
    """

    def __init__(self, funcs: list[RewardFunc] | None = None, weights: list[float] | None = None,
                 parser: Parser | None = None):
        self.funcs = list(funcs or [])
        self.weights = list(weights) if weights is not None else [1.0] * len(self.funcs)
        if len(self.weights) != len(self.funcs):
            raise ValueError(f"Rubric: {len(self.funcs)} funcs but {len(self.weights)} weights")
        self.parser = parser or Parser()

    def add_reward_func(self, func: RewardFunc, weight: float = 1.0) -> None:
        self.funcs.append(func)
        self.weights.append(weight)

    @staticmethod
    async def _call(func: RewardFunc, kwargs: dict[str, Any]) -> float:
        params = inspect.signature(func).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        try:
            result = func(**kwargs)
            if inspect.isawaitable(result):
                result = await result
            return float(result)
        except Exception as exc:
            raise RewardFunctionError(getattr(func, "__name__", type(func).__name__), exc) from exc

    async def score(self, *, prompt, completion, answer=None, state=None, info=None,
                    task=None) -> tuple[float, dict[str, float]]:
        """Score one rollout.

        Returns:
            ``(reward, per_function)``: the weighted sum, and each function's unweighted
            value keyed by the function's ``__name__``.
        Raises:
            RewardFunctionError: a reward function raised (the rollout records it as its error,
                kind ``reward``, or ``parser`` when it was raised inside a parser).
        """
        kwargs = dict(prompt=prompt, completion=completion, answer=answer, state=state or {},
                      info=info or {}, task=task, parser=self.parser)
        values = await asyncio.gather(*(self._call(f, dict(kwargs)) for f in self.funcs))
        per_func = {getattr(f, "__name__", f"func{i}"): v for i, (f, v) in enumerate(zip(self.funcs, values))}
        reward = sum(w * v for w, v in zip(self.weights, values))
        return reward, per_func
