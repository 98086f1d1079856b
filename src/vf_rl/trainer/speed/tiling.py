"""Tiled MLP: each decoder layer's MLP runs over the sequence in tiles, keeping none of its
intermediates for the backward pass (``tiled_mlp = true``, for long sequences).

A gated MLP ``down(act(gate(x)) * up(x))`` keeps its gate, up, activation and product tensors,
``[tokens, intermediate]`` each, from the forward to the backward pass: at 7-8B shapes that is
more than half of a decoder layer's activation memory. The MLP acts on each token alone, so
:class:`TiledMLP` runs it on ``tiles`` slices of the sequence without autograd in the forward
pass, keeps only its input ``x`` (``[tokens, hidden]``), and in the backward pass recomputes one
tile at a time with autograd and backpropagates it: the parameters' gradients accumulate tile by
tile, the input's gradient is written tile by tile. One tile's intermediates live at a time. The
cost is the MLP's forward run twice (as under gradient checkpointing, where this pass is itself
the recomputation). The same idea is the ``TiledMLP`` of Arctic Long Sequence Training (Bekman et
al., *Arctic Long Sequence Training: Scalable and Efficient Training for Multi-Million Token
Sequences*, 2025), with tiles of about ``hidden`` tokens each.
"""

from __future__ import annotations

import math
import types

import torch


class TiledMLP(torch.autograd.Function):
    """``fn(x)`` computed on ``tiles`` slices of ``x`` along the sequence dimension (``-2``);
    only ``x`` is saved. ``params`` are ``fn``'s trainable parameters, passed so that autograd
    calls the backward pass when only they need gradients (frozen inputs, LoRA)."""

    @staticmethod
    def forward(ctx, fn, x: torch.Tensor, tiles: int, *params: torch.Tensor) -> torch.Tensor:
        ctx.fn, ctx.tiles, ctx.n_params = fn, tiles, len(params)
        device = x.device.type  # the recomputation runs under the forward's autocast, as a checkpoint's does
        ctx.autocast = (device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device))
        ctx.save_for_backward(x)
        with torch.no_grad():
            return torch.cat([fn(part) for part in x.tensor_split(tiles, dim=-2)], dim=-2)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[1] else None
        parts = zip(x.tensor_split(ctx.tiles, dim=-2), grad_out.tensor_split(ctx.tiles, dim=-2),
                    grad_x.tensor_split(ctx.tiles, dim=-2) if grad_x is not None else [None] * ctx.tiles)
        for part, grad_part, into in parts:
            part = part.detach().requires_grad_(into is not None)
            device, dtype, enabled = ctx.autocast
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=enabled):
                out = ctx.fn(part)
            # parameters' .grad accumulate here, as a checkpoint's recomputation does
            torch.autograd.backward(out, grad_part)
            if into is not None:
                into.copy_(part.grad)
        return (None, grad_x, None) + (None,) * ctx.n_params  # the parameters' gradients are in their .grad


def tile_count(tokens: int, hidden: int) -> int:
    """Tiles for a pass of ``tokens`` tokens: about ``hidden`` tokens each (ALST's choice; a
    tile's intermediates then take about ``intermediate / hidden`` times the input's memory)."""
    return max(1, math.ceil(tokens / max(hidden, 1)))


@torch.compiler.disable  # its backward runs autograd itself: a compiled layer calls it eagerly
def _tiled_forward(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    forward = mlp._vf_rl_untiled_forward
    tokens = x.shape[-2] * (x.shape[0] if x.dim() > 2 else 1)
    tiles = min(tile_count(tokens, x.shape[-1]), x.shape[-2])
    if tiles <= 1:
        return forward(x)
    params = [p for p in mlp.parameters() if p.requires_grad]
    if not torch.is_grad_enabled() or not (x.requires_grad or params):
        # nothing to backpropagate (reference log-probs, evaluation): one tile's intermediates at a time
        return torch.cat([forward(part) for part in x.tensor_split(tiles, dim=-2)], dim=-2)
    return TiledMLP.apply(forward, x, tiles, *params)


def tile_mlps(model: torch.nn.Module) -> int:
    """Run every decoder layer's ``mlp`` (the module under a layer's ``mlp`` attribute) tiled
    (:class:`TiledMLP`), in place: the modules, their parameters and state dict are unchanged
    (peft's LoRA layers inside stay trainable). Without autograd (evaluation, reference
    log-probs) an MLP runs tile by tile too, with nothing kept: a no-grad forward at a long length
    holds one tile's intermediates, not ``[tokens, intermediate]`` ones.

    Returns:
        the number of MLPs tiled (0 for a model whose layers have no ``mlp``)."""
    from vf_rl.trainer.model import decoder_layers

    count = 0
    for layer in decoder_layers(model):
        mlp = getattr(layer, "mlp", None)
        if mlp is None or hasattr(mlp, "_vf_rl_untiled_forward"):
            continue
        mlp._vf_rl_untiled_forward = mlp.forward
        mlp.forward = types.MethodType(_tiled_forward, mlp)
        count += 1
    return count
