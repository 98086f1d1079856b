"""A new policy loss in one short file: GSPO's sequence-level importance ratio (arXiv:2507.18071).

From a config (this directory on PYTHONPATH):   [trainer.args] loss_type = "custom_loss:gspo_loss"
From Python:                                    RLTrainer(model, env, args, loss_fn=gspo_loss)
"""

import torch

from vf_rl.algorithm.loss import LossInputs, LossOutput, log_importance_ratio, policy_stats


def gspo_loss(inputs: LossInputs, args) -> LossOutput:
    """GSPO-token: every token of a sequence gets the sequence's ratio s = exp(mean log r_t) [B, 1]
    as its value and its own log-prob's gradient, clipped to [1 - epsilon_low, 1 + epsilon_high].
    Returns per-token losses: the trainer masks them, adds beta * KL and divides by the batch's
    loss tokens, as for the built-ins."""
    mask = inputs.loss_mask  # [B, T] bool
    log_ratio = log_importance_ratio(inputs)  # [B, T], 0 off the mask
    tokens = mask.sum(dim=1, keepdim=True).clamp(min=1)  # [B, 1]
    sequence_log_ratio = (log_ratio.sum(dim=1, keepdim=True) / tokens).detach()  # [B, 1]
    ratio = torch.exp(sequence_log_ratio + log_ratio - log_ratio.detach())  # [B, T]: value s, gradient of log p_t
    advantages = inputs.advantages[:, None]  # [B, 1]
    clipped = ratio.clamp(1 - args.epsilon_low, 1 + args.epsilon_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)  # [B, T]
    stats = policy_stats(inputs, log_ratio)  # importance_ratio, mismatch_kl, entropy, logprob_diff
    stats["sequence_ratio"] = ratio.detach().masked_fill(~mask, 0.0).sum()  # logged as a mean per token
    return LossOutput(per_token, stats)
