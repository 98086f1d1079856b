"""Padding-free micro batches, shared-prompt forwards and chunked LM-head log-probs.

Three pieces, used by ``RLTrainer._train_on_batch`` when ``padding_free`` is on:

1. **Packing** (:func:`plan_micro_batches`, :func:`pack_samples`, :func:`packed_micro_batch`):
   samples are grouped greedily in batch order into micro batches of at most a token budget
   (``micro_batch_tokens``, default ``micro_batch_size`` x the batch's mean sample length:
   :func:`default_token_budget`). A micro batch whose packed row saves at least
   ``PACK_MIN_SAVING`` of its padded tokens (:func:`should_pack`) is laid end to end in ONE row
   of ``N`` real tokens (no padding): ``position_ids`` restart at 0 for every sample, and
   attention stays inside each sample (:func:`packed_attention_forward`). Others run as plain
   padded rows (:func:`padded_micro_batch`, :func:`padded_policy_logprobs`), where the model's
   own attention kernel is faster.
2. **Shared prompts** (``share_prompts``): consecutive samples of one group (``Sample.group``,
   same first ``Sample.prompt_len`` tokens: the rollouts of one example) put that prompt in the
   row once; each completion continues at position ``prompt_len`` and attends to the one copy
   of the prompt's keys/values plus its own tokens. The prompt's hidden states are the same as
   in a per-sample forward (a causal prompt never sees its completion), and the gradients of
   every completion flow into the single prompt copy, so log-probs and gradients equal the
   plain forward's (tests/test_packing.py).
3. **Chunked log-probs** (:func:`chunked_logprobs`): ``log softmax(h W^T / tau)[y]`` and the
   entropy from the final hidden states ``h`` ``[M, H]`` and the LM-head weight ``W``
   ``[V, H]``, ``chunk`` rows at a time: no float32 ``[M, V]`` tensor; the bf16 ``[M, V]``
   logits are kept for the backward pass when small (``LOGPROB_KEEP_BYTES``), else recomputed
   chunk by chunk there.

Attention (:func:`packed_attention_forward`, registered in transformers' ``AttentionInterface``
as ``"vf_rl_packed"``): a micro batch is a list of *segments*; segment ``s`` has queries
``q[cu_q[s]:cu_q[s+1]]`` and keys ``k[key_index][cu_k[s]:cu_k[s+1]]`` (for a plain sample the
keys are its own tokens; for a completion sharing a prompt, the prompt's keys then its own),
causal with the last query aligned to the last key (FlashAttention's bottom-right convention).
On a CUDA device in bf16/fp16 it runs ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention
varlen, torch >= 2.10); elsewhere one ``scaled_dot_product_attention`` per segment.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .batching import Sample

ATTN_IMPLEMENTATION = "vf_rl_packed"
LOGPROB_CHUNK_BYTES = 256 * 2**20
"""Float32 logits per chunk of :func:`chunked_logprobs` (rows = this / (4 * vocab))."""
LOGPROB_KEEP_BYTES = 2**30
""":func:`chunked_logprobs` keeps the ``[M, V]`` logits (in the weight's dtype) for the backward
pass instead of recomputing them when they take at most this many bytes (what a padded forward
holds anyway); larger ones are recomputed chunk by chunk."""
PACK_MIN_SAVING = 0.1
"""A micro batch runs as one packed row only when that removes at least this share of the
tokens its padded ``[B, L]`` form would forward (padding, or prompts computed once); otherwise
it runs padded (:func:`plan_micro_batches`): same log-probs and gradients, and the plain
attention kernel is faster where packing saves little."""


# --- packing ---------------------------------------------------------------------------------


def _shares_prompt(sample: Sample, prev: Sample | None, share_prompts: bool) -> bool:
    """Whether ``sample`` can reuse ``prev``'s prompt: same group, same prompt tokens, and the
    prompt holds no trained token (``loss_mask`` 0 on positions ``1 .. prompt_len - 1``)."""
    if not share_prompts or prev is None or sample.group < 0 or sample.group != prev.group:
        return False
    p = sample.prompt_len
    return (0 < p < len(sample.input_ids) and p == prev.prompt_len and p < len(prev.input_ids)
            and sample.input_ids[:p] == prev.input_ids[:p] and not any(sample.loss_mask[1:p]))


def pack_samples(samples: list[Sample], token_budget: int, share_prompts: bool = False,
                 max_samples: int | None = None) -> list[list[Sample]]:
    """Split ``samples`` (in order) into micro batches of at most ``token_budget`` real tokens
    (and at most ``max_samples`` samples, when given).

    A sample costs ``len(input_ids)`` tokens, or ``len(input_ids) - prompt_len`` when it
    shares the prompt of the sample before it in the same micro batch (``share_prompts``). A
    sample longer than the budget gets a micro batch of its own.

    Raises:
        ValueError: ``token_budget`` is not positive.
    """
    if token_budget <= 0:
        raise ValueError(f"micro_batch_tokens must be positive, got {token_budget}")
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    used = 0
    for s in samples:
        shared = _shares_prompt(s, current[-1] if current else None, share_prompts)
        cost = len(s.input_ids) - (s.prompt_len if shared else 0)
        if current and (used + cost > token_budget or (max_samples and len(current) >= max_samples)):
            batches.append(current)
            current, used, cost = [], 0, len(s.input_ids)
        current.append(s)
        used += cost
    if current:
        batches.append(current)
    return batches


def pack_for_rank(samples: list[Sample], world_size: int, rank: int, token_budget: int,
                  share_prompts: bool = False, max_samples: int | None = None) -> list[list[Sample]]:
    """This process's packed micro batches: samples dealt round-robin (process ``rank`` gets
    ``rank, rank + world_size, ...``, so a group's rollouts stay next to each other), packed,
    then padded with empty micro batches (one token, no loss) to the largest count over the
    processes, so every process runs the same number of forward/backward passes (DDP, ZeRO-3)."""
    packs = [pack_samples(samples[r::world_size], token_budget, share_prompts, max_samples) for r in range(world_size)]
    most = max(len(p) for p in packs)
    return packs[rank] + [[Sample([0], [0], [0.0], 0.0)] for _ in range(most - len(packs[rank]))]


def default_token_budget(samples: list[Sample], micro_batch_size: int) -> int:
    """The token budget per pass when ``micro_batch_tokens`` is unset: ``micro_batch_size`` x the
    batch's mean sample length (``ceil``), i.e. the real tokens of an average padded micro batch,
    so a pass never holds more activations than the padded path's average micro batch, while
    shared prompts (counted once) let more rollouts into it."""
    if not samples:
        return max(micro_batch_size, 1)
    return micro_batch_size * -(-sum(len(s.input_ids) for s in samples) // len(samples))


def packed_tokens(samples: list[Sample], share_prompts: bool = False) -> int:
    """Tokens of ``samples`` as one packed row (a shared prompt once), as :func:`packed_micro_batch`."""
    total, prev = 0, None
    for s in samples:
        total += len(s.input_ids) - (s.prompt_len if _shares_prompt(s, prev, share_prompts) else 0)
        prev = s
    return total


def should_pack(samples: list[Sample], share_prompts: bool = False, min_saving: float = PACK_MIN_SAVING) -> bool:
    """Whether ``samples`` run as one packed row (True) or padded ``[B, L]`` rows (False): pack
    when the packed row has at most ``1 - min_saving`` of the padded form's ``B * L`` tokens."""
    padded = len(samples) * max(len(s.input_ids) for s in samples)
    return packed_tokens(samples, share_prompts) <= (1.0 - min_saving) * padded


def plan_micro_batches(samples: list[Sample], world_size: int, rank: int, micro_batch_size: int,
                       micro_batch_tokens: int | None, share_prompts: bool, pad_token_id: int) -> list[dict]:
    """This process's micro batches of a batch (host tensors), for ``padding_free``.

    Samples are packed greedily by a token budget (``micro_batch_tokens``, else
    :func:`default_token_budget` of the whole batch, the same on every process; see
    :func:`pack_for_rank`); each micro batch then runs packed (:func:`packed_micro_batch`) when
    :func:`should_pack`, else padded (:func:`padded_micro_batch`). Both forms have ``tokens``
    (real tokens forwarded) and ``loss_mask``/``sampling_logprobs`` ``[B, T]`` starting at the
    first trained column; :func:`micro_batch_logprobs` runs either.
    """
    budget = micro_batch_tokens or default_token_budget(samples, micro_batch_size)
    packs = pack_for_rank(samples, world_size, rank, budget, share_prompts)
    return [packed_micro_batch(p, share_prompts) if should_pack(p, share_prompts) else
            padded_micro_batch(p, pad_token_id) for p in packs]


def padded_micro_batch(samples: list[Sample], pad_token_id: int) -> dict:
    """``samples`` as right-padded ``[B, L]`` rows (host tensors).

    Returns:
        ``input_ids`` ``[B, L]``; ``attention_mask`` ``[B, L]``, or None when no row is padded
        (then attention is plainly causal: no mask to build); ``keep`` (positions from ``start
        - 1`` on, for ``logits_to_keep``); ``targets``, ``loss_mask``, ``sampling_logprobs``
        ``[B, T]`` from ``start`` (the first trained position, ``T = L - start``);
        ``advantages`` ``[B]``; ``tokens`` (real tokens).
    """
    from .batching import first_trained_position, micro_batches

    mb = micro_batches(samples, len(samples), pad_token_id)[0]
    start = first_trained_position(mb["loss_mask"])
    lengths = {len(s.input_ids) for s in samples}
    return {"input_ids": mb["input_ids"], "attention_mask": mb["attention_mask"] if len(lengths) > 1 else None,
            "keep": mb["input_ids"].shape[1] - start + 1, "targets": mb["input_ids"][:, start:],
            "loss_mask": mb["loss_mask"][:, start:], "sampling_logprobs": mb["sampling_logprobs"][:, start:],
            "advantages": mb["advantages"], "tokens": sum(len(s.input_ids) for s in samples)}


def first_trained(sample: Sample) -> int:
    """The first position ``>= 1`` whose token is trained (``len(input_ids)`` if none)."""
    return next((i for i in range(1, len(sample.loss_mask)) if sample.loss_mask[i]), len(sample.input_ids))


@dataclass
class PackedLayout:
    """Where each segment of a packed row attends (see the module docstring).

    Attributes:
        cu_q: ``[S + 1]`` int32, segment boundaries of the queries in the packed row.
        cu_k: ``[S + 1]`` int32, segment boundaries of the gathered keys.
        key_index: ``[K]`` long, packed-row position of each gathered key, or None when the
            keys are the row itself (no shared prompts: ``cu_k == cu_q``).
        max_q: longest query segment (host int).
        max_k: longest key segment (host int).
        segments: host copy, ``(q_start, q_end, k_start, k_end)`` per segment.
    """

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    key_index: torch.Tensor | None
    max_q: int
    max_k: int
    segments: list[tuple[int, int, int, int]]

    def to(self, device) -> PackedLayout:
        def move(t):
            return None if t is None else t.to(device, non_blocking=True)

        return PackedLayout(move(self.cu_q), move(self.cu_k), move(self.key_index), self.max_q, self.max_k,
                            self.segments)


def packed_micro_batch(samples: list[Sample], share_prompts: bool = False) -> dict:
    """One packed micro batch of ``B`` samples (host tensors).

    Returns:
        A dict with ``input_ids`` and ``position_ids`` ``[1, N]`` long (``N`` real tokens),
        ``layout`` (:class:`PackedLayout`), ``predict_index`` ``[M]`` long (the row position
        whose hidden state predicts each trained-side token), ``targets`` ``[M]`` long,
        ``valid`` ``[B, T]`` bool (which of the ``[B, T]`` cells hold one of the ``M``
        tokens, in row-major order), ``cells`` ``[M]`` long (their flat indices in ``[B * T]``),
        ``loss_mask`` ``[B, T]`` bool, ``sampling_logprobs``
        ``[B, T]`` float32, ``advantages`` ``[B]`` float32 and ``tokens`` (``N``, an int).
        Column ``t`` of row ``b`` is token ``first_trained(sample_b) + t`` of sample ``b``
        (``T`` = the longest such tail).
    """
    ids, positions, pos_maps = [], [], []
    q_segments, k_index, k_bounds = [], [], [0]
    share_k_index = False
    prev, prompt_at = None, 0  # the previous sample, and where its prompt starts in the row
    for s in samples:
        L = len(s.input_ids)
        start = len(ids)
        if _shares_prompt(s, prev, share_prompts):
            p = s.prompt_len
            ids += s.input_ids[p:]
            positions += range(p, L)
            pos_maps.append(list(range(prompt_at, prompt_at + p)) + list(range(start, start + L - p)))
            k_index += list(range(prompt_at, prompt_at + p)) + list(range(start, start + L - p))
            share_k_index = True
        else:
            prompt_at = start
            ids += s.input_ids
            positions += range(L)
            pos_maps.append(list(range(start, start + L)))
            k_index += list(range(start, start + L))
        q_segments.append((start, len(ids)))
        k_bounds.append(len(k_index))
        prev = s
    starts = [first_trained(s) for s in samples]
    T = max(len(s.input_ids) - st for s, st in zip(samples, starts))
    B = len(samples)
    valid = torch.zeros(B, T, dtype=torch.bool)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    sampling = torch.zeros(B, T, dtype=torch.float32)
    predict, targets, cells = [], [], []
    for b, (s, st, pm) in enumerate(zip(samples, starts, pos_maps)):
        n = len(s.input_ids) - st
        valid[b, :n] = True
        cells += range(b * T, b * T + n)
        loss_mask[b, :n] = torch.tensor(s.loss_mask[st:], dtype=torch.bool)
        sampling[b, :n] = torch.tensor(s.sampling_logprobs[st:], dtype=torch.float32)
        predict += pm[st - 1:len(s.input_ids) - 1]
        targets += s.input_ids[st:]
    segments = [(q0, q1, k0, k1) for (q0, q1), k0, k1 in zip(q_segments, k_bounds[:-1], k_bounds[1:])]
    layout = PackedLayout(
        cu_q=torch.tensor([0] + [q1 for _, q1 in q_segments], dtype=torch.int32),
        cu_k=torch.tensor(k_bounds, dtype=torch.int32),
        key_index=torch.tensor(k_index, dtype=torch.long) if share_k_index else None,
        max_q=max(q1 - q0 for q0, q1 in q_segments), max_k=max(b - a for a, b in zip(k_bounds, k_bounds[1:])),
        segments=segments)
    return {"input_ids": torch.tensor([ids], dtype=torch.long), "position_ids": torch.tensor([positions]),
            "layout": layout, "predict_index": torch.tensor(predict, dtype=torch.long),
            "targets": torch.tensor(targets, dtype=torch.long), "valid": valid,
            "cells": torch.tensor(cells, dtype=torch.long), "loss_mask": loss_mask,
            "sampling_logprobs": sampling, "advantages": torch.tensor([s.advantage for s in samples]),
            "tokens": len(ids)}


def to_device(mb: dict, device) -> dict:
    """``mb`` with its tensors (and layout) on ``device`` (non-blocking copies)."""
    out = {}
    for k, v in mb.items():
        if isinstance(v, (torch.Tensor, PackedLayout)):
            v = v.to(device) if isinstance(v, PackedLayout) else v.to(device, non_blocking=True)
        out[k] = v
    return out


# --- attention -------------------------------------------------------------------------------


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
    out = _VARLEN(q, k, v, layout.cu_q, layout.cu_k, layout.max_q, layout.max_k, **kwargs)
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


@torch.compiler.disable
def _layout_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                      scaling: float | None, dropout: float) -> torch.Tensor:
    """The packed branch of :func:`packed_attention_forward`, always run eagerly: inside a
    compiled decoder layer (``torch_compile``) the layout's host ints and segment list would
    otherwise be guarded on, and every micro batch of a new shape would compile the layer again."""
    if layout.key_index is not None:
        key, value = key[:, :, layout.key_index], value[:, :, layout.key_index]
    if _VARLEN is not None and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and not dropout:
        return _varlen_attention(query, key, value, layout, scaling)
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


# --- log-probs -------------------------------------------------------------------------------


try:  # fused per-row log-softmax kernels on CUDA (TRITON_INTERPRET=1 runs them on the CPU in tests)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with CUDA builds of torch
    triton = None

if triton is not None:
    @triton.jit
    def _rows_fwd_kernel(Z, stride, TARGETS, LP, ENT, LSE, V, inv_tau, BLOCK: tl.constexpr):
        """Row ``r`` of ``z`` ``[M, V]``: lse, ``z[y] - lse`` and the entropy, all of ``z / tau``
        in float32, reading the row twice (max, then sums)."""
        row = tl.program_id(0).to(tl.int64)
        base = Z + row * stride
        cols = tl.arange(0, BLOCK)
        top = tl.full([BLOCK], float("-inf"), tl.float32)
        for start in range(0, V, BLOCK):
            z = tl.load(base + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32) * inv_tau
            top = tl.maximum(top, z)
        m = tl.max(top, 0)
        total = tl.zeros([BLOCK], tl.float32)
        weighted = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            inside = start + cols < V
            z = tl.load(base + start + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_tau
            e = tl.exp(z - m)
            total += e
            weighted += tl.where(inside, e * z, 0.0)
        s = tl.sum(total, 0)
        lse = m + tl.log(s)
        target = tl.load(TARGETS + row)
        zt = tl.load(base + target).to(tl.float32) * inv_tau
        tl.store(LP + row, zt - lse)
        tl.store(ENT + row, lse - tl.sum(weighted, 0) / s)
        tl.store(LSE + row, lse)

    @triton.jit
    def _rows_grad_kernel(Z, stride, TARGETS, LSE, GRAD, V, inv_tau, BLOCK: tl.constexpr):
        """Row ``r`` of ``z``, in place: ``(onehot(y) - softmax(z / tau)) * grad / tau``."""
        row = tl.program_id(0).to(tl.int64)
        base = Z + row * stride
        cols = tl.arange(0, BLOCK)
        lse = tl.load(LSE + row)
        target = tl.load(TARGETS + row)
        scale = tl.load(GRAD + row) * inv_tau
        for start in range(0, V, BLOCK):
            inside = start + cols < V
            z = tl.load(base + start + cols, mask=inside, other=0.0).to(tl.float32) * inv_tau
            g = tl.where(start + cols == target, 1.0, 0.0) - tl.exp(z - lse)
            tl.store(base + start + cols, (g * scale).to(Z.dtype.element_ty), mask=inside)


_ROW_BLOCK = 4096


def _use_triton(z: torch.Tensor) -> bool:
    return triton is not None and z.stride(-1) == 1 and (z.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def _rows_logsoftmax(z: torch.Tensor, targets: torch.Tensor, tau: float, chunk: int):
    """``(logprobs, entropy, lse)`` ``[M]`` float32 of the rows of ``z / tau`` (``z`` ``[M, V]``)."""
    M, V = z.shape
    lp, ent, lse = (torch.empty(M, dtype=torch.float32, device=z.device) for _ in range(3))
    if M and _use_triton(z):
        _rows_fwd_kernel[(M,)](z, z.stride(0), targets, lp, ent, lse, V, 1.0 / tau, BLOCK=_ROW_BLOCK, num_warps=8)
        return lp, ent, lse
    for i in range(0, M, chunk):
        zf = z[i:i + chunk].float()
        if tau != 1.0:
            zf = zf / tau
        lse[i:i + chunk] = torch.logsumexp(zf, dim=-1)
        lp[i:i + chunk] = zf.gather(-1, targets[i:i + chunk, None]).squeeze(-1) - lse[i:i + chunk]
        ent[i:i + chunk] = lse[i:i + chunk] - torch.linalg.vecdot(torch.softmax(zf, dim=-1), zf)
    return lp, ent, lse


def _rows_grad_(z: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor, tau: float,
                chunk: int) -> torch.Tensor:
    """Overwrite ``z`` ``[M, V]`` with ``d (sum_i grad_i lp_i) / d (h W^T)`` =
    ``(onehot(y) - softmax(z / tau)) * grad / tau`` (in ``z``'s dtype); returns ``z``."""
    M, V = z.shape
    grad = grad.float().contiguous()
    if M and _use_triton(z):
        _rows_grad_kernel[(M,)](z, z.stride(0), targets, lse, grad, V, 1.0 / tau, BLOCK=_ROW_BLOCK, num_warps=8)
        return z
    for i in range(0, M, chunk):
        zf = z[i:i + chunk].float()
        if tau != 1.0:
            zf = zf / tau
        g = -torch.exp(zf - lse[i:i + chunk, None])
        g.scatter_add_(-1, targets[i:i + chunk, None], torch.ones_like(g[:, :1]))
        g *= (grad[i:i + chunk] / tau)[:, None]
        z[i:i + chunk] = g.to(z.dtype)
    return z


class _ChunkedLogprobs(torch.autograd.Function):
    """``log softmax(h W^T / tau)[y]`` and entropy (see :func:`chunked_logprobs`). Backward:
    ``d lp_i / d z_i = (onehot(y_i) - softmax(z_i / tau)) / tau`` with ``z = h W^T``, so with
    ``G = grad_lp * (onehot - p) / tau``: ``grad_h = G W`` and ``grad_W = G^T h``.

    A frozen head (no grad for ``W``, e.g. LoRA): the forward pass computes ``U = (onehot - p)
    W`` ``[M, H]`` chunk by chunk and saves only that; the backward pass is ``grad_lp * U / tau``.
    ``keep``: ``z`` ``[M, V]`` (weight dtype) is computed by one matmul and saved; the backward
    pass overwrites it with ``G`` and runs two matmuls. Else ``chunk`` rows at a time in both
    passes, ``z`` recomputed in the backward pass. The row-wise softmax work runs in fused
    Triton kernels on CUDA (:func:`_rows_logsoftmax`, :func:`_rows_grad_`), in float32 chunks
    of ``chunk`` rows elsewhere. The saved ``z`` is overwritten, so the graph cannot be
    backpropagated twice."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, keep):
        h_all = hidden.to(weight.dtype)
        if not weight.requires_grad:  # frozen head (LoRA): grad_h = grad * U / tau, U = (onehot - p) W
            parts = []
            for i in range(0, hidden.shape[0], chunk):
                z, y = h_all[i:i + chunk] @ weight.T, targets[i:i + chunk]
                lp, ent, lse = _rows_logsoftmax(z, y, temperature, chunk)
                ones = torch.full_like(lse, temperature)  # gradient rows of grad = tau: onehot - p
                parts.append((lp, ent, _rows_grad_(z, y, lse, ones, temperature, chunk) @ weight))
            logprobs, entropy, u = (torch.cat(x) for x in zip(*parts)) if parts else (
                hidden.new_zeros(0, dtype=torch.float32), hidden.new_zeros(0, dtype=torch.float32),
                h_all.new_zeros(0, hidden.shape[1]))
            ctx.save_for_backward(u)
            ctx.temperature, ctx.frozen, ctx.h_dtype = temperature, True, hidden.dtype
            ctx.mark_non_differentiable(entropy)
            return logprobs, entropy
        ctx.frozen = False
        if keep:
            z_all = h_all @ weight.T
            logprobs, entropy, lse = _rows_logsoftmax(z_all, targets, temperature, chunk)
        else:
            z_all = None
            parts = [_rows_logsoftmax(h_all[i:i + chunk] @ weight.T, targets[i:i + chunk], temperature, chunk)
                     for i in range(0, hidden.shape[0], chunk)]
            logprobs, entropy, lse = (torch.cat(x) for x in zip(*parts)) if parts else (
                hidden.new_zeros(0, dtype=torch.float32) for _ in range(3))
        ctx.save_for_backward(hidden, weight, targets, lse, z_all)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        if ctx.frozen:
            (u,) = ctx.saved_tensors
            return (u.float() * (grad_logprobs / ctx.temperature)[:, None]).to(ctx.h_dtype), None, None, None, None, None
        hidden, weight, targets, lse, z_all = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        h_all = hidden.to(weight.dtype)
        if z_all is not None:
            g = _rows_grad_(z_all, targets, lse, grad_logprobs, tau, chunk)
            grad_h = (g @ weight).to(hidden.dtype) if need_h else None
            return grad_h, (g.T @ h_all if need_w else None), None, None, None, None
        grad_h = torch.empty_like(hidden) if need_h else None
        # accumulated in the weight's dtype (as autograd would): a float32 copy of a 150k-vocabulary
        # head would cost more memory than the logits this avoids
        grad_w = torch.zeros_like(weight) if need_w else None
        for i in range(0, hidden.shape[0], chunk):
            h = h_all[i:i + chunk]
            g = _rows_grad_(h @ weight.T, targets[i:i + chunk], lse[i:i + chunk], grad_logprobs[i:i + chunk], tau,
                            chunk)
            if need_h:
                grad_h[i:i + chunk] = (g @ weight).to(hidden.dtype)
            if need_w:
                grad_w.addmm_(g.T, h)
        return grad_h, grad_w, None, None, None, None


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     chunk: int | None = None, keep: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``targets`` under ``softmax(hidden @ weight.T / temperature)``, and the entropy,
    without a float32 ``[M, V]`` tensor: at most ``chunk`` rows of float32 logits exist at once
    (default: ``LOGPROB_CHUNK_BYTES`` worth), in the forward and again in the backward pass.
    With ``keep`` the ``[M, V]`` logits in the weight's dtype are held for the backward pass (no
    recomputed matmul); without it each chunk's logits are recomputed there (no ``[M, V]``
    tensor at all). Default ``keep``: when they take at most ``LOGPROB_KEEP_BYTES``.

    The result equals ``selective_logprobs(hidden @ weight.T, targets, temperature)`` (a bias-free
    LM head; tests/test_packing.py checks values and gradients). Gradients flow to ``hidden``
    and, when it requires grad, ``weight`` (summed over the chunks in the weight's dtype).

    Args:
        hidden: ``[M, H]`` final hidden states (after the model's last norm), any float dtype.
        weight: ``[V, H]`` LM-head weight.
        targets: ``[M]`` long, the token each row predicts.
        temperature: > 0, as in :func:`vf_rl.trainer.loss.selective_logprobs`.
    Returns:
        ``(logprobs [M] float32, entropy [M] float32)``; entropy in nats, without grad.
    """
    if chunk is None:
        chunk = max(1, LOGPROB_CHUNK_BYTES // (4 * weight.shape[0]))
    if keep is None:
        keep = hidden.shape[0] * weight.shape[0] * weight.element_size() <= LOGPROB_KEEP_BYTES
    return _ChunkedLogprobs.apply(hidden, weight, targets, float(temperature), int(chunk), bool(keep))


_NO_MASK: dict = {}


def _no_mask(device) -> torch.Tensor:
    """An empty 4-D mask (``[1, 1, 0, 0]`` bool) for ``device``, made once."""
    key = str(device)
    if key not in _NO_MASK:
        _NO_MASK[key] = torch.ones(1, 1, 0, 0, dtype=torch.bool, device=device)
    return _NO_MASK[key]


class _Identity(torch.nn.Module):
    def forward(self, x):
        return x


def _lm_head(model):
    """``(the module holding lm_head, the attribute name)`` when the LM head is a plain
    bias-free ``nn.Linear`` with no logit scaling/softcapping, else None (plain path)."""
    from .model import base_model

    inner = base_model(model)
    head = getattr(inner, "lm_head", None)
    config = getattr(inner, "config", None)
    if (type(head) is not torch.nn.Linear or head.bias is not None
            or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)):
        return None
    if getattr(head.weight, "ds_id", None) is not None or head.weight.numel() == 0:
        return None  # DeepSpeed ZeRO-3 partitions the weight: only the model's own forward gathers it
    return inner, head


def packed_policy_logprobs(model: torch.nn.Module, mb: dict, temperature: float = 1.0,
                           chunked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward a packed micro batch (:func:`packed_micro_batch`, on the device) and return the
    log-probs and entropy of its trained-side tokens in the ``[B, T]`` layout of ``mb["valid"]``.

    The model runs once on the ``[1, N]`` row with ``position_ids`` and the layout (attention
    ``"vf_rl_packed"`` must be the model's implementation), ``use_cache=False``, and
    ``logits_to_keep = predict_index`` so only predicting positions reach the head. With
    ``chunked`` and a plain LM head, the head is swapped for the identity during the forward and
    the log-probs come from :func:`chunked_logprobs`; otherwise from the model's logits.

    Returns:
        ``(logprobs [B, T] float32 (requires grad), entropy [B, T] float32)``, 0 off ``valid``.
    """
    from .loss import selective_logprobs

    found = _lm_head(model) if chunked else None
    # a 4-D attention_mask is passed through as is: transformers then skips building a mask and
    # detecting packed sequences from position_ids (a host sync); the layout defines attention
    kwargs = dict(input_ids=mb["input_ids"], position_ids=mb["position_ids"], use_cache=False,
                  attention_mask=_no_mask(mb["input_ids"].device), logits_to_keep=mb["predict_index"],
                  vf_rl_packing=mb["layout"])
    if found is not None:
        owner, head = found
        owner.lm_head = _Identity()
        try:
            hidden = model(**kwargs).logits[0]  # [M, H]
        finally:
            owner.lm_head = head
        logprobs, entropy = chunked_logprobs(hidden, head.weight, mb["targets"], temperature)
    else:
        logits = model(**kwargs).logits  # [1, M, V]
        logprobs, entropy = selective_logprobs(logits, mb["targets"][None], temperature)
        logprobs, entropy = logprobs[0], entropy[0]
    shape, cells = mb["valid"].shape, mb["cells"]  # scatter/gather by index: no host sync (masked_* would)
    out_lp = logprobs.new_zeros(shape.numel()).scatter(0, cells, logprobs).view(shape)
    out_ent = entropy.new_zeros(shape.numel()).scatter(0, cells, entropy.detach()).view(shape)
    return out_lp, out_ent


def padded_policy_logprobs(model: torch.nn.Module, mb: dict, temperature: float = 1.0,
                           chunked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward a padded micro batch (:func:`padded_micro_batch`, on the device): the model's own
    attention (sdpa; causal without a mask when no row is padded), the LM head only from the
    first trained position on (``logits_to_keep``), log-probs from :func:`chunked_logprobs`
    when the head is plain (else from the logits, as :func:`~vf_rl.trainer.loss.policy_logprobs`).

    Returns:
        ``(logprobs [B, T] float32 (requires grad), entropy [B, T] float32)``.
    """
    from .loss import selective_logprobs

    found = _lm_head(model) if chunked else None
    kwargs = dict(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], use_cache=False,
                  logits_to_keep=mb["keep"])
    targets = mb["targets"]
    if found is None:
        return selective_logprobs(model(**kwargs).logits[:, :-1], targets, temperature)
    owner, head = found
    owner.lm_head = _Identity()
    try:
        hidden = model(**kwargs).logits[:, :-1]  # [B, T, H]
    finally:
        owner.lm_head = head
    logprobs, entropy = chunked_logprobs(hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1),
                                         temperature)
    return logprobs.view(targets.shape), entropy.view(targets.shape)


def micro_batch_logprobs(model: torch.nn.Module, mb: dict, temperature: float = 1.0,
                         chunked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy ``[B, T]`` of a micro batch from :func:`plan_micro_batches`, packed
    or padded."""
    if "layout" in mb:
        return packed_policy_logprobs(model, mb, temperature, chunked)
    return padded_policy_logprobs(model, mb, temperature, chunked)
