"""The plain log-probs of a padded micro batch: one forward and ``selective_logprobs`` on its
logits, with nothing chunked, packed or compiled. The tests hold the trainer's fast paths against it."""

from __future__ import annotations

import torch

from vf_rl.trainer.speed.logprobs import selective_logprobs


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
