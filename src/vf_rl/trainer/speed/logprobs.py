"""Log-probs of a micro batch's tokens from the LM head, chunked: no float32 ``[M, V]`` logits.

:func:`chunked_logprobs`: ``log softmax(h W^T / tau)[y]`` and the entropy from the final hidden
states ``h`` ``[M, H]`` and the LM-head weight ``W`` ``[V, H]``, ``chunk`` rows at a time; the
bf16 ``[M, V]`` logits are kept for the backward pass when small (``LOGPROB_KEEP_BYTES``), else
recomputed chunk by chunk there. :func:`micro_batch_logprobs` runs the model on a packed or padded
micro batch (``packing.py``) and takes the log-probs of its trained tokens.
:func:`selective_logprobs` is the plain (unchunked) form.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import TYPE_CHECKING

import torch

from vf_rl.config.memory import LOGPROB_CHUNK_BYTES, LOGPROB_KEEP_BYTES

if TYPE_CHECKING:
    from vf_rl.trainer.speed.packing import MicroBatch


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
        temperature: > 0, as in :func:`selective_logprobs`.
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
    from vf_rl.trainer.model import base_model

    inner = base_model(model)
    head = getattr(inner, "lm_head", None)
    config = getattr(inner, "config", None)
    if (type(head) is not torch.nn.Linear or head.bias is not None
            or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)):
        return None
    if getattr(head.weight, "ds_id", None) is not None or head.weight.numel() == 0:
        return None  # DeepSpeed ZeRO-3 partitions the weight: only the model's own forward gathers it
    return inner, head


def packed_policy_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0,
                           chunked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward a packed micro batch (:func:`packed_micro_batch`, on the device) and return the
    log-probs and entropy of its trained-side tokens in the ``[B, T]`` layout of ``mb.valid``.

    The model runs once on the ``[1, N]`` row with ``position_ids`` and the layout (attention
    ``"vf_rl_packed"`` must be the model's implementation), ``use_cache=False``, and
    ``logits_to_keep = predict_index`` so only predicting positions reach the head. With
    ``chunked`` and a plain LM head, the head is swapped for the identity during the forward and
    the log-probs come from :func:`chunked_logprobs`; otherwise from the model's logits.

    Returns:
        ``(logprobs [B, T] float32 (requires grad), entropy [B, T] float32)``, 0 off ``valid``.
    """

    found = _lm_head(model) if chunked else None
    # a 4-D attention_mask is passed through as is: transformers then skips building a mask and
    # detecting packed sequences from position_ids (a host sync); the layout defines attention
    kwargs = dict(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False,
                  attention_mask=_no_mask(mb.input_ids.device), logits_to_keep=mb.predict_index,
                  vf_rl_packing=mb.layout)
    if found is not None:
        owner, head = found
        owner.lm_head = _Identity()
        try:
            hidden = model(**kwargs).logits[0]  # [M, H]
        finally:
            owner.lm_head = head
        logprobs, entropy = chunked_logprobs(hidden, head.weight, mb.targets, temperature)
    else:
        logits = model(**kwargs).logits  # [1, M, V]
        logprobs, entropy = selective_logprobs(logits, mb.targets[None], temperature)
        logprobs, entropy = logprobs[0], entropy[0]
    shape, cells = mb.valid.shape, mb.cells  # scatter/gather by index: no host sync (masked_* would)
    out_lp = logprobs.new_zeros(shape.numel()).scatter(0, cells, logprobs).view(shape)
    out_ent = entropy.new_zeros(shape.numel()).scatter(0, cells, entropy.detach()).view(shape)
    return out_lp, out_ent


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (unwrapped) model's forward takes ``logits_to_keep`` (every current
    transformers decoder model does); read once per model class."""
    from vf_rl.trainer.model import base_model

    return _forward_takes_logits_to_keep(type(base_model(model)))


@functools.lru_cache(maxsize=None)
def _forward_takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def padded_policy_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0,
                           chunked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward a padded micro batch (:func:`padded_micro_batch`, on the device): the model's own
    attention (sdpa; causal without a mask when no row is padded), the LM head only from the
    first trained position on (``logits_to_keep``), log-probs from :func:`chunked_logprobs`
    when the head is plain (else from the logits, as :func:`selective_logprobs`).

    Returns:
        ``(logprobs [B, T] float32 (requires grad), entropy [B, T] float32)``.
    """

    found = _lm_head(model) if chunked else None
    kwargs = dict(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    if _takes_logits_to_keep(model):  # the LM head only from the first trained position on
        kwargs["logits_to_keep"] = mb.keep
    targets = mb.targets
    if found is None:
        return selective_logprobs(model(**kwargs).logits[:, -mb.keep:-1], targets, temperature)
    owner, head = found
    owner.lm_head = _Identity()
    try:
        hidden = model(**kwargs).logits[:, -mb.keep:-1]  # [B, T, H]
    finally:
        owner.lm_head = head
    logprobs, entropy = chunked_logprobs(hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1),
                                         temperature)
    return logprobs.view(targets.shape), entropy.view(targets.shape)


def micro_batch_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0,
                         chunked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy ``[B, T]`` of a micro batch from :func:`plan_micro_batches`, packed
    or padded."""
    if mb.packed:
        return packed_policy_logprobs(model, mb, temperature, chunked)
    return padded_policy_logprobs(model, mb, temperature, chunked)


def selective_logprobs(logits: torch.Tensor, token_ids: torch.Tensor,
                       temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
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
