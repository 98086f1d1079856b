"""Advantages: a plain function from a batch's rewards, group by group, to one number per rollout.

An advantage function is ``advantage_fn(inputs: AdvantageInputs) -> torch.Tensor`` (``[G, R]``
float32). Pick a built-in with ``advantage_type`` (registered in ``config/choices.py``), name your own as
``advantage_type = "module:function"``, or pass ``RLTrainer(..., advantage_fn=...)``. The
orchestrator calls it once per batch, after scoring, and every token of a rollout's completion
is trained with that rollout's advantage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from vf_rl.config.choices import builtin_functions
from vf_rl.config.rules import resolve_function


@dataclass
class AdvantageInputs:
    """One batch's rollouts, ``G`` groups (prompts) of ``R`` rollouts (``rollouts_per_example``).

    Attributes:
        rewards: ``[G, R]`` float32, each rollout's reward (0 for a failed rollout).
        completion_tokens: ``[G, R]`` int64, tokens the model generated in each rollout (all turns).
        is_truncated: ``[G, R]`` bool, the rollout was cut off at ``max_tokens`` or is longer than ``max_seq_len``.
    """

    rewards: torch.Tensor
    completion_tokens: torch.Tensor
    is_truncated: torch.Tensor


AdvantageFn = Callable[[AdvantageInputs], torch.Tensor]


def group_mean(inputs: AdvantageInputs) -> torch.Tensor:
    """``[G, R]``: reward minus the mean reward of its group (verifiers' RLTrainer, prime-rl;
    Dr. GRPO, arXiv:2503.20783, argues against dividing by the std)."""
    return inputs.rewards - inputs.rewards.mean(dim=1, keepdim=True)


def group_mean_std(inputs: AdvantageInputs, eps: float = 1e-4) -> torch.Tensor:
    """``[G, R]``: ``(reward - group mean) / (group std + eps)``, GRPO's advantage
    (DeepSeekMath, arXiv:2402.03300; population std). A group whose rewards are all equal gets 0."""
    centered = group_mean(inputs)
    return centered / (inputs.rewards.std(dim=1, keepdim=True, unbiased=False) + eps)


def get_advantage(name: str) -> AdvantageFn:
    """The advantage function called ``name``: a built-in (its option in ``config/choices.py``
    names its function) or ``"module:function"``.

    Raises:
        ConfigError: naming ``advantage_type``, when it cannot be found.
    """
    return resolve_function("advantage_type", name, builtin_functions("advantage"))


def compute_advantages(advantage_fn: AdvantageFn, rollouts: list, rollouts_per_example: int) -> list[float]:
    """Advantages of ``rollouts`` (grouped contiguously, ``rollouts_per_example`` per prompt),
    one float per rollout in the same order.

    Raises:
        ValueError: ``len(rollouts)`` is not a multiple of ``rollouts_per_example``, or the
            function returned a tensor of another shape.
    """
    if rollouts_per_example < 1 or len(rollouts) % rollouts_per_example:
        raise ValueError(f"{len(rollouts)} rollouts cannot be split into groups of {rollouts_per_example}")
    shape = (len(rollouts) // rollouts_per_example, rollouts_per_example)
    inputs = AdvantageInputs(
        rewards=torch.tensor([r.reward for r in rollouts], dtype=torch.float32).view(shape),
        completion_tokens=torch.tensor([sum(len(t.completion_ids) for t in r.turns) for r in rollouts],
                                       dtype=torch.long).view(shape),
        is_truncated=torch.tensor([bool(r.is_truncated) for r in rollouts]).view(shape))
    advantages = advantage_fn(inputs)
    if tuple(advantages.shape) != shape:
        raise ValueError(f"the advantage function returned shape {tuple(advantages.shape)}, expected {shape}")
    return advantages.flatten().tolist()
