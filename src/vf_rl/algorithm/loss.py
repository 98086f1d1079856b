"""The policy loss: a plain function from one micro batch's tensors to per-token losses.

A loss is ``loss_fn(inputs: LossInputs, args: RLConfig) -> LossOutput``: it returns each
token's loss ``[B, T]`` and its statistics. The trainer (:func:`micro_batch_loss`) does what every
loss needs, the same for built-in and custom losses: it keeps the loss-mask tokens, adds
``beta`` times the KL to the reference policy (logged as ``kl_ref`` whenever ``beta > 0``) and
divides by N, the loss tokens of the whole global batch (DAPO's token-level normalisation), so
micro batches and processes add up to the batch mean. A loss that aggregates otherwise (per
sequence, by a constant) also returns each token's weight (``LossOutput.weight``, from the
batch's totals in ``LossInputs.totals``): the trainer then sums ``weight * (loss + beta * KL)``.
Pick a built-in with ``loss_type`` (registered by their options in ``config/choices.py``), name
your own as ``loss_type = "module:function"``, or pass ``RLTrainer(..., loss_fn=...)``;
``examples/custom_loss.py`` writes one in a few lines.

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
asymmetric clip-higher (arXiv:2503.14476), over the batch's tokens.

TRL's ``GRPOTrainer`` loss types, the same surrogate aggregated as TRL's ``_compute_loss`` does, for a
batch of S samples (those with loss tokens), sample i with |o_i| loss tokens, N loss tokens in all:
``grpo``: ``1/S sum_i 1/|o_i| sum_t loss_it`` (GRPO, arXiv:2402.03300); ``dr_grpo``: ``1/(S * L)
sum_it loss_it``, L = ``max_tokens`` (Dr. GRPO, arXiv:2503.20783); ``bnpo``: the token mean over
each trainer process's share, averaged over processes; ``gspo``: the surrogate of the sequence ratio
``s_i = exp(1/|o_i| sum_t log r_it)`` per sample, aggregated as ``grpo`` (GSPO, arXiv:2507.18071).
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
        totals: the step's whole batch (:class:`BatchTotals`); ``None``: this micro batch is the
            whole batch, on one process (:func:`batch_totals`).
    """

    trainer_logprobs: torch.Tensor
    sampling_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    entropy: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    totals: BatchTotals | None = None


@dataclass(frozen=True)
class BatchTotals:
    """Counts over the step's whole batch, for a loss whose aggregation is not the batch's token
    mean (a loss sees one micro batch at a time). Host ints.

    Attributes:
        loss_tokens: N, the loss tokens of the whole batch (every process).
        samples: S, the batch's samples with at least one loss token (every process).
        process_loss_tokens: this process's share of N.
        processes: trainer processes P (the trainer divides each micro batch by N / P).
    """

    loss_tokens: int
    samples: int
    process_loss_tokens: int
    processes: int = 1


@dataclass
class LossOutput:
    """``per_token``: ``[B, T]`` float, each token's loss (carries the gradient); values off the
    loss mask are ignored. ``stats``: 0-d detached tensors under the convention in the module
    docstring. ``weight``: float, broadcastable to ``[B, T]`` (``[B, 1]``: one per sample), no
    gradient: each token's weight in the batch loss, which is ``sum_t weight_t * (loss_t + beta *
    KL_t) / N`` over the batch's loss tokens; ``None``: 1, the token mean."""

    per_token: torch.Tensor
    stats: dict[str, torch.Tensor]
    weight: torch.Tensor | None = None


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
    """What the trainer backpropagates for one micro batch, for any loss: ``sum over the loss
    mask of weight * (loss_fn's per-token loss + beta * k3) / normalizer`` (weight 1 unless the
    loss returns one).

    Args:
        normalizer: the global batch's loss tokens / trainer processes (> 0), so that summing
            micro batches and averaging processes gives the batch mean.
    Returns:
        ``(loss, stats)``: the 0-d loss and the loss function's statistics, plus ``kl_ref``
        (the summed k3, unweighted) when ``inputs.ref_logprobs`` is given (``beta > 0``).
    Raises:
        ValueError: ``normalizer`` is not positive, or ``loss_fn`` returned ``per_token`` of
            another shape than the loss mask (e.g. an already reduced loss), or a ``weight``
            that does not broadcast to it.
    """
    if normalizer <= 0:
        raise ValueError(f"loss_normalizer must be > 0, got {normalizer}")
    out = loss_fn(inputs, args)
    name, mask_shape = getattr(loss_fn, "__name__", "loss_fn"), tuple(inputs.loss_mask.shape)
    shape = tuple(getattr(out.per_token, "shape", ()))
    if shape != mask_shape:
        raise ValueError(f"{name}: LossOutput.per_token must be [B, T] = {mask_shape} (per-token losses: the trainer "
                         f"masks, normalises and adds beta * KL), got shape {shape}")
    per_token, stats = out.per_token, dict(out.stats)
    k3 = kl_per_token(inputs)
    if k3 is not None:
        per_token = per_token + args.beta * k3
        stats["kl_ref"] = k3.sum().detach()
    if out.weight is not None:
        try:
            ok = torch.broadcast_shapes(tuple(out.weight.shape), mask_shape) == mask_shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"{name}: LossOutput.weight must broadcast to [B, T] = {mask_shape}, "
                             f"got shape {tuple(out.weight.shape)}")
        per_token = per_token * out.weight.detach()
    return per_token.masked_fill(~inputs.loss_mask, 0.0).sum() / normalizer, stats


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


def clipped_surrogate(ratio: torch.Tensor, inputs: LossInputs, args: RLConfig) -> tuple[torch.Tensor, dict]:
    """PPO's clipped surrogate ``-min(r * A, clip(r, 1 - epsilon_low, 1 + epsilon_high) * A)``
    ``[B, T]`` for ratios ``[B, T]`` (or ``[B, 1]``, one per sample), and the statistics
    ``clipped/low_fraction`` and ``clipped/high_fraction`` (loss tokens whose gradient the clip removed)."""
    advantages, mask = inputs.advantages[:, None], inputs.loss_mask
    clipped_ratio = ratio.clamp(1.0 - args.epsilon_low, 1.0 + args.epsilon_high)
    per_token = -torch.minimum(ratio * advantages, clipped_ratio * advantages).expand(mask.shape)
    with torch.no_grad():
        stats = {"clipped/low_fraction": ((ratio < 1.0 - args.epsilon_low) & (advantages < 0) & mask).sum().float(),
                 "clipped/high_fraction": ((ratio > 1.0 + args.epsilon_high) & (advantages > 0) & mask).sum().float()}
    return per_token, stats


def batch_totals(inputs: LossInputs) -> BatchTotals:
    """``inputs.totals``, or this micro batch's own counts (host reads) when it is the whole batch."""
    if inputs.totals is not None:
        return inputs.totals
    tokens = int(inputs.loss_mask.sum())
    return BatchTotals(tokens, int(inputs.loss_mask.any(dim=1).sum()), tokens)


def sample_mean_weight(inputs: LossInputs) -> torch.Tensor:
    """``[B, 1]`` float32 ``(N / S) / |o_i|``: each sample's tokens weigh ``1 / |o_i|`` and the
    samples ``1 / S``, so the batch loss ``sum_it w_i * loss_it / N`` is the mean over samples of
    their token means (TRL's ``grpo``)."""
    totals, mask = batch_totals(inputs), inputs.loss_mask
    tokens = mask.sum(dim=1, keepdim=True).clamp(min=1).float()
    return (totals.loss_tokens / max(totals.samples, 1)) / tokens


def dapo_loss(inputs: LossInputs, args: RLConfig) -> LossOutput:
    """Token-level clipped surrogate with clip-higher (``args.epsilon_low``/``epsilon_high``),
    the batch's token mean.

    Extra stats: ``clipped/low_fraction``, ``clipped/high_fraction`` (tokens whose gradient
    the clip removed).
    """
    log_ratio = log_importance_ratio(inputs)
    per_token, clip_stats = clipped_surrogate(torch.exp(log_ratio), inputs, args)
    return LossOutput(per_token, policy_stats(inputs, log_ratio) | clip_stats)


def grpo_loss(inputs: LossInputs, args: RLConfig) -> LossOutput:
    """TRL's ``loss_type="grpo"`` (GRPO, arXiv:2402.03300): the clipped surrogate of ``dapo``
    (``r_t = exp(logp_t - logp_old_t)``), averaged over each sample's loss tokens, then over the
    batch's S samples: ``1/S sum_i 1/|o_i| sum_t loss_it``, ``beta * KL_t`` inside the sum as in
    TRL. Returned as per-token losses and weights ``(N / S) / |o_i|`` (:func:`sample_mean_weight`).
    Stats as ``dapo_loss``."""
    out = dapo_loss(inputs, args)
    return LossOutput(out.per_token, out.stats, sample_mean_weight(inputs))


def dr_grpo_loss(inputs: LossInputs, args: RLConfig) -> LossOutput:
    """TRL's ``loss_type="dr_grpo"`` (Dr. GRPO, arXiv:2503.20783): the clipped surrogate summed
    over the batch's tokens and divided by a constant, ``S * L``: ``1/(S L) sum_it loss_it``, with L
    = ``args.max_tokens`` (TRL's ``max_completion_length``; unset: ``max_seq_len``), so no sample's
    length scales its tokens. Returned as per-token losses and the weight ``(N / S) / L`` (0-d).
    Stats as ``dapo_loss``."""
    out, totals = dapo_loss(inputs, args), batch_totals(inputs)
    length = args.max_tokens or args.max_seq_len
    weight = inputs.loss_mask.new_tensor(totals.loss_tokens / max(totals.samples, 1) / length, dtype=torch.float32)
    return LossOutput(out.per_token, out.stats, weight)


def bnpo_loss(inputs: LossInputs, args: RLConfig) -> LossOutput:
    """TRL's ``loss_type="bnpo"``: the clipped surrogate's token mean over the local batch, the
    mean of those over trainer processes: ``1/P sum_p 1/n_p sum_(t in p) loss_t``, n_p the loss
    tokens of process p. The local batch is each process's share of the step (TRL's with
    ``gradient_accumulation_steps = 1``): micro batches are formed by a token budget for speed,
    which must not change what a step computes. On one process this is ``dapo``'s token mean.
    Returned as per-token losses and the weight ``(N / P) / n_p`` (0-d). Stats as ``dapo_loss``."""
    out, totals = dapo_loss(inputs, args), batch_totals(inputs)
    share = totals.loss_tokens / totals.processes / max(totals.process_loss_tokens, 1)
    return LossOutput(out.per_token, out.stats, inputs.loss_mask.new_tensor(share, dtype=torch.float32))


def gspo_loss(inputs: LossInputs, args: RLConfig) -> LossOutput:
    """GSPO (Zheng et al., arXiv:2507.18071; TRL's ``importance_sampling_level="sequence"``
    with ``loss_type="grpo"``): the sequence ratio ``s_i = exp(1/|o_i| sum_t log r_it)`` (the
    geometric mean of the token ratios, with its gradient through every token), the clipped
    surrogate ``-min(s_i A_i, clip(s_i, 1 - epsilon_low, 1 + epsilon_high) A_i)`` per sample,
    averaged over the batch's S samples as ``grpo``. The paper clips at 3e-4 / 4e-4 (v2, section 5.1).

    Extra stats: ``sequence_ratio`` (s_i on each of its loss tokens), ``clipped/*`` as ``dapo_loss``.
    """
    log_ratio = log_importance_ratio(inputs)
    tokens = inputs.loss_mask.sum(dim=1, keepdim=True).clamp(min=1)
    ratio = torch.exp(log_ratio.sum(dim=1, keepdim=True) / tokens)  # [B, 1]
    per_token, clip_stats = clipped_surrogate(ratio, inputs, args)
    stats = policy_stats(inputs, log_ratio) | clip_stats
    stats["sequence_ratio"] = (ratio.detach() * inputs.loss_mask).sum()
    return LossOutput(per_token, stats, sample_mean_weight(inputs))


def get_loss(name: str) -> LossFn:
    """The loss called ``name``: a built-in (its option in ``config/choices.py`` names its function)
    or ``"module:function"``.

    Raises:
        ValueError: naming ``loss_type``, when the name or module cannot be found.
    """
    return resolve_function("loss_type", name, builtin_functions("loss"))
