"""The reference policy for the KL penalty (``beta > 0``; ``loss.kl_penalty``).

With LoRA the reference is the base model itself: the adapter is switched off for one no-grad
forward (peft's ``disable_adapter()`` context), so no second copy is held. With full weights
it is a frozen copy of the initial model made when the trainer starts: one more model's worth of
memory on every trainer process (not supported with DeepSpeed ZeRO-3, whose weights are sharded).
"""

from __future__ import annotations

import copy

import torch

from .loss import policy_logprobs


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in eval mode with no parameter requiring grad (same device/dtype)."""
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return ref


@torch.no_grad()
def reference_logprobs(model: torch.nn.Module, ref_model: torch.nn.Module | None, micro_batch: dict[str, torch.Tensor],
                       start: int, temperature: float, logits_to_keep: bool) -> torch.Tensor:
    """``[B, L - start]`` float32 log-probs of the micro batch's tokens from ``start`` on under the
    reference policy (as :func:`loss.policy_logprobs`, without grad).

    Args:
        model: the trained model, unwrapped (a peft model when ``ref_model`` is ``None``).
        ref_model: the frozen copy (full weights), or ``None`` for LoRA's adapter-off forward.
    Raises:
        ValueError: ``ref_model`` is ``None`` and ``model`` has no ``disable_adapter``.
    """
    if ref_model is not None:
        return policy_logprobs(ref_model, micro_batch, start, temperature, logits_to_keep)[0]
    if not hasattr(model, "disable_adapter"):
        raise ValueError("beta > 0 without LoRA needs a frozen reference copy (ref_model)")
    with model.disable_adapter():
        return policy_logprobs(model, micro_batch, start, temperature, logits_to_keep)[0]
