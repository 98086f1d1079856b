"""The policy-gradient loss: token-level CISPO with importance-ratio masking.

The loss is pure tensors in, tensors out, so that it can be read, tested and swapped on its
own; ``policy_logprobs`` is the one forward pass it needs.

For every completion token t with advantage A (the rollout's reward minus its group's mean):

    r_t   = exp(logp_trainer(t) - logp_sampling(t))          importance ratio
    keep  = loss_mask_t and mask_ratio_low <= r_t <= mask_ratio_high
    loss  = sum_t keep * (-r_t * A) / N                       N = loss tokens in the global batch

The gradient of ``-r_t * A`` is ``-r_t * A * grad logp_trainer(t)``: the CISPO estimator
(MiniMax-M1, arXiv:2506.13585: a stop-gradient importance weight times the log-prob
gradient), with tokens whose ratio leaves ``[mask_ratio_low, mask_ratio_high]`` dropped
instead of clipped, as verifiers' RLTrainer and prime-rl do. Normalising by the token count
of the whole batch (not per sequence) is DAPO's token-level normalisation
(arXiv:2503.14476).
"""

from __future__ import annotations

import torch


def cispo_loss(trainer_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, advantages: torch.Tensor,
               loss_mask: torch.Tensor, loss_normalizer: float, mask_ratio_low: float = 0.125,
               mask_ratio_high: float = 8.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level CISPO loss for one micro batch.

    Args:
        trainer_logprobs: ``[B, T]`` float, log-probs of the taken tokens under the policy
            being trained (requires grad).
        sampling_logprobs: ``[B, T]`` float, log-probs the inference server reported when it
            sampled the tokens (any value where ``loss_mask`` is 0; NaN marks trained tokens
            that were not sampled, e.g. environment replies, whose ratio is then 1).
        advantages: ``[B, T]`` or ``[B]`` float, the rollout advantage (broadcast over T).
        loss_mask: ``[B, T]`` bool/int, 1 on completion tokens that are trained on.
        loss_normalizer: number of loss tokens this process accounts for (global count /
            world size), so that summing micro batches and averaging over processes gives
            the mean over the global batch. Must be > 0.
        mask_ratio_low, mask_ratio_high: tokens with a ratio outside this range are dropped.

    Returns:
        ``(loss, stats)``: the scalar loss (this micro batch's share), and detached sums over
        loss tokens for logging: ``tokens``, ``importance_ratio_sum``, ``mismatch_kl_sum``
        (``r - log r - 1``, the k3 estimator of KL(sampler || trainer)), ``masked_low``,
        ``masked_high``.
    """
    if loss_normalizer <= 0:
        raise ValueError(f"loss_normalizer must be > 0, got {loss_normalizer}")
    mask = loss_mask.bool()
    # no `if not_sampled.any()`: a Python branch on a GPU value would make the host wait
    sampling_logprobs = torch.where(torch.isnan(sampling_logprobs), trainer_logprobs.detach(), sampling_logprobs)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(trainer_logprobs)
    log_ratio = (trainer_logprobs - sampling_logprobs).masked_fill(~mask, 0.0)
    ratio = torch.exp(log_ratio)
    low, high = ratio < mask_ratio_low, ratio > mask_ratio_high
    keep = mask & ~low & ~high
    loss = (-ratio * advantages).masked_fill(~keep, 0.0).sum() / loss_normalizer
    with torch.no_grad():
        stats = {
            "tokens": mask.sum().float(),
            "importance_ratio_sum": ratio.masked_fill(~mask, 0.0).sum(),
            "mismatch_kl_sum": (ratio - log_ratio - 1.0).masked_fill(~mask, 0.0).sum(),
            "masked_low": (low & mask).sum().float(),
            "masked_high": (high & mask).sum().float(),
        }
    return loss, stats


def selective_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``token_ids`` under ``softmax(logits / temperature)``, and the entropy.

    Computed as ``logit(token) - logsumexp(logits)`` one row at a time, so that no full
    ``[B, T, V]`` log-softmax (or its float32 copy) is ever held: the backward pass keeps only
    the logits themselves (one float32 ``[T, V]`` copy per row when ``temperature != 1`` or the
    logits are bf16). Same idea as TRL's ``selective_log_softmax``.

    Args:
        logits: ``[B, T, V]`` float, the model's logits at positions that *predict* the tokens
            (i.e. already shifted: ``logits[:, t]`` predicts ``token_ids[:, t]``).
        token_ids: ``[B, T]`` long.
        temperature: the sampling temperature (> 0). vf-vllm reports log-probs after
            temperature scaling (``--logprobs-mode processed_logprobs``), so this matches.
    Returns:
        ``(logprobs [B, T] float32, entropy [B, T] float32)``; entropy is computed without
        grad (nats).
    """
    logprobs, entropies = [], []
    for row, ids in zip(logits, token_ids):
        row = row.float()
        if temperature != 1.0:
            row = row / temperature
        lse = torch.logsumexp(row, dim=-1)
        logprobs.append(row.gather(-1, ids[:, None]).squeeze(-1) - lse)
        with torch.no_grad():
            entropies.append(lse - (torch.softmax(row, dim=-1) * row).sum(-1))
    return torch.stack(logprobs), torch.stack(entropies)


def policy_logprobs(model: torch.nn.Module, micro_batch: dict[str, torch.Tensor], start: int,
                    temperature: float = 1.0, logits_to_keep: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward ``model`` on a micro batch and take the log-probs of its tokens from ``start`` on.

    Only positions ``start - 1`` onwards go through the LM head (transformers'
    ``logits_to_keep``), so the ``[B, T, V]`` logits cover completions, not prompts; no KV
    cache is built (``use_cache=False``).

    Args:
        model: a causal LM (``logits_to_keep`` must be one of its forward's arguments when
            ``logits_to_keep`` is true; all current transformers decoder models have it).
        micro_batch: ``input_ids`` and ``attention_mask`` ``[B, L]`` long
            (batching.micro_batches), on the model's device.
        start: the first position with a trained token, ``1 <= start < L``
            (batching.first_trained_position).
        temperature: see :func:`selective_logprobs`.
    Returns:
        ``(logprobs [B, L - start], entropy [B, L - start])``: column ``i`` is token ``start + i``.
    """
    ids = micro_batch["input_ids"]
    keep = ids.shape[1] - start + 1  # the logit at start - 1 predicts token start; the last predicts nothing
    kwargs = {"logits_to_keep": keep} if logits_to_keep else {}
    logits = model(input_ids=ids, attention_mask=micro_batch["attention_mask"], use_cache=False, **kwargs).logits
    return selective_logprobs(logits[:, -keep:-1], ids[:, start:], temperature)
