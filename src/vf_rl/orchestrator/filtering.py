"""Online difficulty filtering: drop groups that carry no gradient and refill the batch.

With a group-relative advantage (``advantage.py``), a group whose rollouts all score the same
has advantage 0 on every token: it costs a full forward/backward and contributes nothing. DAPO's
dynamic sampling (Yu et al. 2025, arXiv:2503.14476, section 3.2) drops such groups and keeps
generating until the batch is full of groups with reward spread. Here:

    round 0: the step's own rows plus ``ceil(P * (oversampling_factor - 1))`` extra rows;
    each later round (at most ``max_filter_rounds`` in all): enough extra rows for the groups
    still missing, at the keep rate seen so far (at least 1/4).

A group is kept when its reward std (population) is above ``difficulty_threshold`` (+1e-6) and
its mean reward lies within ``[difficulty_min_reward, difficulty_max_reward]`` when those are
set. Extra rows are drawn by a ``random.Random`` seeded with ``(seed, step, round)``: the rows a
step *may* use are a pure function of the step, so a resumed run asks for the same candidates.
A batch still short after the last round is filled with dropped groups (trained on as without
filtering) and says so in one line on stderr, instead of looping.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from dataclasses import dataclass
from typing import Awaitable, Callable

from vf_rl.config.sections import FilteringConfig
from vf_rl.env_api import Rollout

STD_EPS = 1e-6
"""Reward spread below this counts as none (float noise of rewards that are equal)."""


@dataclass(frozen=True)
class DifficultyFilter(FilteringConfig):
    """Which groups a batch keeps, and how many more rows to generate when it is short: the run
    config's filtering section (``FilteringConfig``: its keys) with the rules that use them.

    Attributes:
        threshold: groups with reward std ``<= threshold + STD_EPS`` are dropped.
        min_reward, max_reward: groups whose mean reward is outside these bounds are dropped
            (``None``: no bound).
        oversampling_factor: round 0 generates this many times the batch's groups (>= 1).
        max_rounds: generation rounds per batch (>= 1).
        seed: seeds the draw of extra rows (with the step and round).
    """

    def keep(self, rewards: list[float]) -> bool:
        """Whether a group with these rewards (one per rollout) is trained on."""
        if statistics.pstdev(rewards) <= self.threshold + STD_EPS:
            return False
        mean = statistics.fmean(rewards)
        if self.min_reward is not None and mean < self.min_reward:
            return False
        return self.max_reward is None or mean <= self.max_reward

    def extra_rows(self, rows: list[dict], step: int, round_index: int, n: int) -> list[dict]:
        """``n`` rows drawn (with replacement) from ``rows`` by an RNG seeded with
        ``(seed, step, round_index)``: the same rows every time for the same arguments."""
        return random.Random(f"{self.seed}:{step}:{round_index}").choices(rows, k=n) if n > 0 else []

    async def fill(self, step: int, step_rows: list[dict], group_size: int, draw: Callable[[int, int], list[dict]],
                   generate: Callable[[list[dict]], Awaitable[list[Rollout]]]
                   ) -> tuple[list[dict], list[Rollout], dict[str, float]]:
        """Generate groups until ``len(step_rows)`` of them are kept (or ``max_rounds`` ran out).

        Args:
            step: the batch's step (for the message).
            step_rows: the step's own rows; the batch needs this many groups.
            group_size: rollouts per row (``rollouts_per_example``).
            draw: ``(round_index, n) -> n`` extra rows (deterministic, see :meth:`extra_rows`).
            generate: rows -> their scored rollouts, ``group_size`` per row in row order.
        Returns:
            ``(rows, rollouts, metrics)``: the batch's rows and rollouts (grouped as ``generate``
            returns them) and ``filter/filtered_fraction`` (dropped / generated groups),
            ``filter/extra_rollouts`` (rollouts generated beyond the batch), ``filter/rounds``,
            ``filter/generated_reward`` (mean reward of every rollout generated: unbiased by
            the filter, unlike the batch's ``reward``).
        """
        needed = len(step_rows)
        candidates = step_rows + draw(0, math.ceil(needed * self.oversampling_factor) - needed)
        kept: list[tuple[dict, list[Rollout]]] = []
        dropped: list[tuple[dict, list[Rollout]]] = []
        generated: list[Rollout] = []
        rounds = 0
        while candidates:
            rollouts = await generate(candidates)
            generated += rollouts
            rounds += 1
            for i, row in enumerate(candidates):
                group = rollouts[i * group_size:(i + 1) * group_size]
                (kept if self.keep([r.reward for r in group]) else dropped).append((row, group))
            missing = needed - len(kept)
            if missing <= 0 or rounds >= self.max_rounds:
                break
            rate = max(len(kept) / (len(kept) + len(dropped)), 0.25)
            candidates = draw(rounds, math.ceil(missing / rate))
        groups = len(kept) + len(dropped)
        if len(kept) < needed:
            print(f"[orchestrator] batch {step + 1}: only {len(kept)}/{needed} groups had reward spread after "
                  f"{rounds} round(s) ({groups} groups generated); the rest are groups the filter dropped "
                  "(raise max_filter_rounds or oversampling_factor, or lower difficulty_threshold)",
                  file=sys.stderr, flush=True)
            kept += dropped[:needed - len(kept)]
        kept = kept[:needed]
        metrics = {"filter/filtered_fraction": len(dropped) / groups,
                   "filter/extra_rollouts": float((groups - needed) * group_size), "filter/rounds": float(rounds),
                   "filter/generated_reward": statistics.fmean(r.reward for r in generated)}
        return [row for row, _ in kept], [r for _, group in kept for r in group], metrics
