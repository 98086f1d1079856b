"""Several environments in one run (``[[env]]`` tables with a ``weight``).

Each batch's prompts are split between the environments by weight: the exact shares
``n * w_i / sum(w)`` rounded down, the remaining prompts given one at a time to environments
drawn in proportion to their remainders by a ``random.Random`` seeded with ``(seed, step)`` (so
over many steps each environment gets its weight's share). Each environment then takes its next
rows in order, wrapping around. Both are pure functions of the step: a resumed run takes the
same rows (``batches.jsonl``).
"""

from __future__ import annotations

import asyncio
import math
import random

from vf_rl.env_api.environment import Environment, Rollout

ENV_KEY = "env"
"""The row key naming the environment a row (and its rollouts) belongs to."""


class EnvMixture(Environment):
    """Environments sampled by weight per batch; rows carry their environment's name under ``"env"``.

    Args:
        envs: name -> environment (names are used in metrics: ``env/<name>/reward``).
        weights: name -> positive weight.
        seed: seeds the per-step rounding (see the module docstring).
    Raises:
        ValueError: no environment, or a weight that is missing or not positive.
    """

    def __init__(self, envs: dict[str, Environment], weights: dict[str, float], seed: int = 0):
        if not envs or set(weights) != set(envs) or any(w <= 0 for w in weights.values()):
            raise ValueError(f"env: every environment needs a positive weight, got {weights}")
        self.envs, self.weights, self.seed = envs, weights, seed
        self._counts: list[list[int]] = []  # per step: prompts per environment (cached, pure)
        self._n = 0

    def get_dataset(self, n: int = -1) -> list[dict]:
        return [{**row, ENV_KEY: name} for name, env in self.envs.items() for row in env.get_dataset(n)]

    def get_eval_dataset(self, n: int = -1) -> list[dict]:
        """``n`` eval rows of every environment (all with ``n = -1``)."""
        return [{**row, ENV_KEY: name} for name, env in self.envs.items() for row in env.get_eval_dataset(n)]

    def counts(self, step: int, n: int) -> list[int]:
        """Prompts of batch ``step`` per environment (in ``envs`` order), summing to ``n``."""
        total = sum(self.weights.values())
        exact = [n * self.weights[name] / total for name in self.envs]
        counts = [math.floor(x) for x in exact]
        remainders = [x - c for x, c in zip(exact, counts)]
        rng = random.Random(f"{self.seed}:mixture:{step}")
        for _ in range(n - sum(counts)):
            i = rng.choices(range(len(counts)), weights=[r + 1e-12 for r in remainders])[0]  # never all 0
            counts[i] += 1
            remainders[i] = 0.0
        return counts

    def rows_for_step(self, rows: list[dict], step: int, n: int) -> list[dict]:
        """The ``n`` rows of batch ``step`` out of ``rows`` (each with ``"env"``), environment by
        environment, each continuing where the previous steps left it."""
        if self._n != n:
            self._counts, self._n = [], n
        while len(self._counts) <= step:
            self._counts.append(self.counts(len(self._counts), n))
        out = []
        for i, name in enumerate(self.envs):
            mine = [row for row in rows if row[ENV_KEY] == name]
            if not mine:
                raise ValueError(f"env: environment {name!r} has no training rows (after filtering by max_prompt_len)")
            start = sum(c[i] for c in self._counts[:step])
            out += [mine[(start + j) % len(mine)] for j in range(self._counts[step][i])]
        return out

    async def generate(self, client, model: str, rows: list[dict], rollouts_per_example: int, sampling_args: dict,
                       max_concurrent: int = 1024, timeout: float | None = None, on_done=None) -> list[Rollout]:
        """Each environment rolls out its own rows (concurrently); rollouts in the order of ``rows``."""
        names = list(dict.fromkeys(row[ENV_KEY] for row in rows))
        results = await asyncio.gather(*(
            self.envs[name].generate(client, model, [r for r in rows if r[ENV_KEY] == name], rollouts_per_example,
                                     sampling_args, max_concurrent, timeout=timeout, on_done=on_done)
            for name in names))
        groups = {name: [res[i:i + rollouts_per_example] for i in range(0, len(res), rollouts_per_example)]
                  for name, res in zip(names, results)}
        return [r for row in rows for r in groups[row[ENV_KEY]].pop(0)]
