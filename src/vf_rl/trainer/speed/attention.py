"""Attention inside each sample of a packed row (``packing.PackedLayout``), registered in
transformers' ``AttentionInterface`` as ``"vf_rl_packed"``.

Segment ``s`` has queries ``q[cu_q[s]:cu_q[s+1]]`` and keys ``k[key_index][cu_k[s]:cu_k[s+1]]``,
causal with the last query aligned to the last key (FlashAttention's bottom-right convention).
On a CUDA device in bf16/fp16 it runs ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention
varlen, torch >= 2.10), a custom op that traces into a compiled decoder layer (``torch_compile``):
each layer stays one graph, where a graph break around attention doubled the compiled regions a
pass enters, host time that bounds small models' steps (docs/benchmarks.md). Elsewhere
one ``scaled_dot_product_attention`` per segment, always run eagerly.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from vf_rl.trainer.speed.packing import PackedLayout

ATTN_IMPLEMENTATION = "vf_rl_packed"


def _varlen():
    """``(varlen_attn, its parameter names)`` on torch >= 2.10, else ``(None, ())``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, ()
    return varlen_attn, tuple(inspect.signature(varlen_attn).parameters)


_VARLEN, _VARLEN_PARAMS = _varlen()


def _expand_kv(x: torch.Tensor, groups: int, dim: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=dim)


def segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                      scaling: float | None, dropout: float = 0.0) -> torch.Tensor:
    """Attention of a packed row, one ``scaled_dot_product_attention`` per segment.

    Args:
        query: ``[1, Hq, N, D]``; key, value: ``[1, Hkv, K, D]`` (already gathered by
            ``layout.key_index``), ``Hq`` a multiple of ``Hkv``.
    Returns:
        ``[1, N, Hq, D]`` (transformers' attention-output layout).
    """
    groups = query.shape[1] // key.shape[1]
    outs = []
    for q0, q1, k0, k1 in layout.segments:
        q, k, v = query[:, :, q0:q1], key[:, :, k0:k1], value[:, :, k0:k1]
        k, v = _expand_kv(k, groups, 1), _expand_kv(v, groups, 1)
        lq, lk = q1 - q0, k1 - k0
        if lq == lk:
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling)
        else:  # bottom-right causal: query i sees keys <= i + (lk - lq)
            mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
        outs.append(o)
    return torch.cat(outs, dim=2).transpose(1, 2)


def _varlen_attention(query, key, value, layout: PackedLayout, scaling):
    q = query[0].transpose(0, 1)  # [N, Hq, D]
    k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)  # [K, Hkv, D]
    kwargs = {"scale": scaling}
    if "is_causal" in _VARLEN_PARAMS:  # torch 2.10-2.11
        kwargs["is_causal"] = True
    else:
        kwargs["window_size"] = (-1, 0)
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in _VARLEN_PARAMS:
            kwargs["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = _expand_kv(k, groups, 1), _expand_kv(v, groups, 1)
    # the kernel takes the longest segments as upper bounds (its grid: a block per 128 tokens of
    # them, per segment and head). Compiled, the layout's exact host ints would compile the layer
    # again per value: the row's lengths (symbolic sizes) stand for them, capped by the layout's
    # run-wide bound where it has one (a symbolic min: no guard, no recompile)
    if not torch.compiler.is_compiling():
        max_q, max_k = layout.max_q, layout.max_k
    elif layout.bound:
        max_q, max_k = torch.sym_min(layout.bound, q.shape[0]), torch.sym_min(layout.bound, k.shape[0])
    else:
        max_q, max_k = q.shape[0], k.shape[0]
    out = _VARLEN(q, k, v, layout.cu_q, layout.cu_k, max_q, max_k, **kwargs)
    return out.unsqueeze(0)


def packed_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             vf_rl_packing: PackedLayout | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention function ``"vf_rl_packed"``.

    With ``vf_rl_packing`` (a :class:`PackedLayout`, passed through the model's forward
    kwargs): segment attention as in the module docstring; ``query`` ``[1, Hq, N, D]``, key
    and value ``[1, Hkv, N, D]`` with RoPE already applied. Without it: transformers' ``sdpa``
    attention (so any other forward of the model behaves as with ``attn_implementation="sdpa"``).

    Returns:
        ``(attn_output [B, N, Hq, D], None)``.
    """
    if vf_rl_packing is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return _layout_attention(query, key, value, vf_rl_packing, scaling, dropout if module.training else 0.0), None


def _layout_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                      scaling: float | None, dropout: float) -> torch.Tensor:
    """The packed branch of :func:`packed_attention_forward`: ``query`` ``[1, Hq, N, D]``, key and
    value ``[1, Hkv, N, D]``; returns ``[1, N, Hq, D]``. The key gather and the varlen kernel (one
    custom op with a fake kernel) trace into a compiled layer; the per-segment fallback runs eagerly."""
    if layout.key_index is not None:
        key, value = key[:, :, layout.key_index], value[:, :, layout.key_index]
    if varlen_applies(query, dropout):
        return _varlen_attention(query, key, value, layout, scaling)
    return _segment_attention_eager(query, key, value, layout, scaling, dropout)


def varlen_applies(query: torch.Tensor, dropout: float = 0.0) -> bool:
    """Whether packed attention runs the varlen kernel (torch >= 2.10, CUDA, bf16/fp16, no
    dropout) rather than one ``scaled_dot_product_attention`` per segment."""
    return _VARLEN is not None and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and not dropout


@torch.compiler.disable
def _segment_attention_eager(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                             scaling: float | None, dropout: float) -> torch.Tensor:
    """:func:`segment_attention`, always run eagerly: inside a compiled decoder layer
    (``torch_compile``) its loop over the layout's host segment list would be unrolled and
    guarded on, and every micro batch of a new shape would compile the layer again."""
    return segment_attention(query, key, value, layout, scaling, dropout)


def _packed_mask(attention_mask=None, **kwargs):
    """Mask function for ``"vf_rl_packed"`` forwards without a layout: none without a 2-D mask
    (sdpa is then causal), transformers' sdpa mask for padded batches. (Packed forwards pass a
    4-D mask, which transformers hands through without calling this.)"""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(attention_mask=attention_mask, **kwargs)


def register_attention() -> str:
    """Register ``"vf_rl_packed"`` with transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, packed_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _packed_mask)
    return ATTN_IMPLEMENTATION
