"""The reference policy for the KL penalty (``beta > 0``; ``loss.micro_batch_loss`` adds it).

With LoRA the reference is the base model itself: the adapter is switched off for one no-grad
forward (peft's ``disable_adapter()`` context), so no second copy is held. With full weights
it is a frozen copy of the initial model made when the trainer starts: one more model's worth of
memory on every trainer process (not supported with DeepSpeed ZeRO-3, whose weights are sharded).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in eval mode with no parameter requiring grad (same device/dtype)."""
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return ref


@torch.no_grad()
def reference_logprobs(model: torch.nn.Module, ref_model: torch.nn.Module | None,
                       forward: Callable[[torch.nn.Module], torch.Tensor]) -> torch.Tensor:
    """The micro batch's log-probs ``[B, T]`` float32 under the reference policy, without grad:
    ``forward(m)`` computes them under model ``m`` exactly as the trained policy's are computed
    (padded or packed, ``speed/logprobs.micro_batch_logprobs``).

    Args:
        model: the trained model, unwrapped (a peft model when ``ref_model`` is ``None``).
        ref_model: the frozen copy (full weights), or ``None`` for LoRA's adapter-off forward.
    Raises:
        ValueError: ``ref_model`` is ``None`` and ``model`` has no ``disable_adapter``.
    """
    if ref_model is not None:
        return forward(ref_model)
    if not hasattr(model, "disable_adapter"):
        raise ValueError("beta > 0 without LoRA needs a frozen reference copy (ref_model)")
    with model.disable_adapter():
        return forward(model)
