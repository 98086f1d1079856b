"""The policy loss: a plain function from one micro batch's tensors to per-token losses.

A loss is ``loss_fn(inputs: LossInputs, args: RLConfig) -> LossOutput``: it returns each
token's loss ``[B, T]`` and its statistics. The trainer (:func:`micro_batch_loss`) does what every
loss needs, the same for built-in and custom losses: it keeps the loss-mask tokens, adds
``beta`` times the KL to the reference policy (logged as ``kl_ref`` whenever ``beta > 0``) and
divides by N, the loss tokens of the whole global batch (DAPO's token-level normalisation), so
micro batches and processes add up to the batch mean. Pick a built-in with ``loss_type``
(registered by their options in ``config/choices.py``), name your own as ``loss_type = "module:function"``, or pass
``RLTrainer(..., loss_fn=...)``; ``examples/custom_loss.py`` writes one in a few lines.

Statistics convention (``LossOutput.stats``): each value is a 0-d tensor. A key ending in
``/max`` is a maximum (the trainer logs the largest over micro batches); every other key is a
**sum over this micro batch's loss tokens**, which the trainer adds up over the step's micro
batches and logs divided by the step's loss tokens, i.e. as a mean per trained token. Keys are
logged as given (``importance_ratio``, ``clipped/high_fraction``...).

Built-ins, for every completion token t with advantage A (see ``advantage.py``):

    r_t = exp(logp_trainer(t) - logp_sampling(t))            importance ratio

``cispo`` (default): ``loss_t = -r_t * A`` on the tokens kept, where r_t carries no gradient
through the weight (``-r_t * A`` differentiates to ``-r_t * A * grad logp``: the CISPO estimator,
MiniMax-M1, arXiv:2506.13585), and tokens whose ratio leaves ``[mask_ratio_low,
mask_ratio_high]`` are dropped instead of clipped, as verifiers' RLTrainer and prime-rl do.

``dapo``: the PPO/GRPO clipped surrogate ``-min(r_t * A, clip(r_t, 1 - epsilon_low, 1 +
epsilon_high) * A)`` (Schulman et al. arXiv:1707.06347; GRPO, arXiv:2402.03300) with DAPO's
asymmetric clip-higher (arXiv:2503.14476).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from vf_rl.config.choices import builtin_functions
from vf_rl.config.rules import resolve_function

if TYPE_CHECKING:
    from vf_rl.config.rl_config import RLConfig


@dataclass
class LossInputs:
    """One micro batch, on the training device. ``B`` rows, ``T`` positions (the completion
    part of the rows: column ``t`` is the ``t``-th position from the first trained one).

    Attributes:
        trainer_logprobs: ``[B, T]`` float32, log-probs of the taken tokens under the policy
            being trained (requires grad).
        sampling_logprobs: ``[B, T]`` float32, what the inference server reported when it
            sampled them (NaN on trained tokens it did not sample, e.g. environment replies
            with ``mask_env_responses = false``; any value off the loss mask).
        advantages: ``[B]`` float32, each row's rollout advantage.
        loss_mask: ``[B, T]`` bool, the tokens trained on.
        entropy: ``[B, T]`` float32, the policy's entropy at each position (nats, no grad).
        ref_logprobs: ``[B, T]`` float32, the same tokens' log-probs under the reference policy
            (no grad); only when ``beta > 0``, else ``None``. The trainer adds the KL term
            itself (:func:`micro_batch_loss`); a loss may read it for its own statistics.
    """

    trainer_logprobs: torch.Tensor
    sampling_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    entropy: torch.Tensor
    ref_logprobs: torch.Tensor | None = None


@dataclass
class LossOutput:
    """``per_token``: ``[B, T]`` float, each token's loss (carries the gradient); values off the
    loss mask are ignored. ``stats``: 0-d detached tensors under the convention in the module
    docstring."""

    per_token: torch.Tensor
    stats: dict[str, torch.Tensor]


LossFn = Callable[[LossInputs, "RLConfig"], LossOutput]


def log_importance_ratio(inputs: LossInputs) -> torch.Tensor:
    """``[B, T]`` ``log r_t = logp_trainer - logp_sampling``, 0 off the loss mask and where the
    token was not sampled (ratio 1). Carries the gradient of ``trainer_logprobs``."""
    sampling = torch.where(torch.isnan(inputs.sampling_logprobs), inputs.trainer_logprobs.detach(),
                           inputs.sampling_logprobs)  # no `if .any()`: a branch on a GPU value syncs
    return (inputs.trainer_logprobs - sampling).masked_fill(~inputs.loss_mask, 0.0)


def policy_stats(inputs: LossInputs, log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics every loss should report (sums over loss tokens, see the convention):
    ``importance_ratio``; ``mismatch_kl`` (``r - log r - 1``, the k3 estimator of
    KL(sampler || trainer), Schulman 2020); ``entropy``; ``logprob_diff/mean`` and
    ``logprob_diff/max`` (``|log r|``: kernel/sync mismatch plus the step between sampling and
    training)."""
    mask = inputs.loss_mask
    with torch.no_grad():
        log_ratio = log_ratio.detach()
        ratio = torch.exp(log_ratio)
        diff = log_ratio.abs()
        return {
            "importance_ratio": ratio.masked_fill(~mask, 0.0).sum(),
            "mismatch_kl": (ratio - log_ratio - 1.0).masked_fill(~mask, 0.0).sum(),
            "entropy": inputs.entropy.masked_fill(~mask, 0.0).sum(),
            "logprob_diff/mean": diff.sum(),
            "logprob_diff/max": diff.max() if diff.numel() else diff.new_zeros(()),
        }


def kl_per_token(inputs: LossInputs) -> torch.Tensor | None:
    """``[B, T]`` k3 estimate of KL(policy || reference) per token, 0 off the loss mask (Schulman
    2020, "Approximating KL divergence"; as in GRPO, arXiv:2402.03300): with ``d = logp_ref -
    logp_trainer``, ``k3 = exp(d) - d - 1 >= 0``. ``None`` without reference log-probs."""
    if inputs.ref_logprobs is None:
        return None
    d = (inputs.ref_logprobs - inputs.trainer_logprobs).masked_fill(~inputs.loss_mask, 0.0)
    return torch.exp(d) - d - 1.0


def micro_batch_loss(loss_fn: LossFn, inputs: LossInputs, args: RLConfig,
                     normalizer: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """What the trainer backpropagates for one micro batch, for any loss:
    ``(sum of loss_fn's per-token losses on the loss mask + beta * sum k3) / normalizer``.

    Args:
        normalizer: the global batch's loss tokens / trainer processes (> 0), so that summing
            micro batches and averaging processes gives the batch mean.
    Returns:
        ``(loss, stats)``: the 0-d loss and the loss function's statistics, plus ``kl_ref``
        (the summed k3) when ``inputs.ref_logprobs`` is given (``beta > 0``).
    Raises:
        ValueError: ``normalizer`` is not positive, or ``loss_fn`` returned ``per_token`` of
            another shape than the loss mask (e.g. an already reduced loss).
    """
    if normalizer <= 0:
        raise ValueError(f"loss_normalizer must be > 0, got {normalizer}")
    out = loss_fn(inputs, args)
    shape = tuple(getattr(out.per_token, "shape", ()))
    if shape != tuple(inputs.loss_mask.shape):
        raise ValueError(f"{getattr(loss_fn, '__name__', 'loss_fn')}: LossOutput.per_token must be [B, T] = "
                         f"{tuple(inputs.loss_mask.shape)} (per-token losses: the trainer masks, normalises and "
                         f"adds beta * KL), got shape {shape}")
    total, stats = out.per_token.masked_fill(~inputs.loss_mask, 0.0).sum(), dict(out.stats)
    k3 = kl_per_token(inputs)
    if k3 is not None:
        k3 = k3.sum()
        total = total + args.beta * k3
        stats["kl_ref"] = k3.detach()
    return total / normalizer, stats


def cispo_loss(inputs: LossInputs, args: RLConfig) -> LossOutput:
    """Token-level CISPO with importance-ratio masking (``args.mask_ratio_low``/``high``).

    Extra stats: ``masked/low_fraction``, ``masked/high_fraction``, ``tokens/masked_fraction``.
    """
    log_ratio = log_importance_ratio(inputs)
    ratio = torch.exp(log_ratio)
    mask = inputs.loss_mask
    low, high = (ratio < args.mask_ratio_low) & mask, (ratio > args.mask_ratio_high) & mask
    per_token = (-ratio * inputs.advantages[:, None]).masked_fill(low | high, 0.0)
    stats = policy_stats(inputs, log_ratio)
    stats |= {"masked/low_fraction": low.sum().float(), "masked/high_fraction": high.sum().float(),
              "tokens/masked_fraction": (low | high).sum().float()}
    return LossOutput(per_token, stats)


def dapo_loss(inputs: LossInputs, args: RLConfig) -> LossOutput:
    """Token-level clipped surrogate with clip-higher (``args.epsilon_low``/``epsilon_high``).

    Extra stats: ``clipped/low_fraction``, ``clipped/high_fraction`` (tokens whose gradient
    the clip removed).
    """
    log_ratio = log_importance_ratio(inputs)
    ratio, advantages = torch.exp(log_ratio), inputs.advantages[:, None]
    clipped_ratio = ratio.clamp(1.0 - args.epsilon_low, 1.0 + args.epsilon_high)
    per_token = -torch.minimum(ratio * advantages, clipped_ratio * advantages)
    mask = inputs.loss_mask
    stats = policy_stats(inputs, log_ratio)
    with torch.no_grad():
        stats |= {"clipped/low_fraction": ((ratio < 1.0 - args.epsilon_low) & (advantages < 0) & mask).sum().float(),
                  "clipped/high_fraction": ((ratio > 1.0 + args.epsilon_high) & (advantages > 0) & mask).sum().float()}
    return LossOutput(per_token, stats)


def get_loss(name: str) -> LossFn:
    """The loss called ``name``: a built-in (its option in ``config/choices.py`` names its function)
    or ``"module:function"``.

    Raises:
        ValueError: naming ``loss_type``, when the name or module cannot be found.
    """
    return resolve_function("loss_type", name, builtin_functions("loss"))
