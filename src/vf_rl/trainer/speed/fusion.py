"""Projections that read the same input, run as one matrix product in the compiled layers.

A decoder layer's q, k and v projections (and a LoRA adapter's ``A`` matrices on them) each read
the layer's normed hidden states. The narrowest run far below the GPU's matmul peak (a rank-16
``A`` product is a few microseconds of a small fraction of it; ``benchmarks/gemm_ceiling.py``
measures each product).
One product over the concatenated weights, ``x @ cat(W_q, W_k, W_v)^T`` split along its last
dimension, replaces several small ones, as fused-QKV attention does in other trainers (e.g. the
``qkv_proj`` of vLLM's and Megatron's Llama); what it gains is in ``docs/benchmarks.md``.

:class:`FuseSharedInputLinears` is an inductor pre-grad pass (``torch.compile(options=
{"pre_grad_custom_pass": ...})``, :func:`model.compile_layers`) that does it on each compiled
layer's graph, so the model's modules, parameter names and checkpoints stay as they are:
``linear`` calls on the same input node, in one autocast and grad-mode region, with the same
dtype, device, bias presence and ``requires_grad`` (a LoRA model's frozen base weights and its
trainable ``A`` matrices form separate groups, so no frozen weight gets a gradient), become one
``linear`` over ``torch.cat`` of their weights (and biases) and a ``split``. A group is fused only
where one of its products is narrower than its input (k/v projections, LoRA ``A``): wide ones
(gate and up) already run near the peak, and copying their weights into one each pass would cost
about what it saves. The concatenation is tagged to be recomputed in the backward pass rather than
kept (``CheckpointPolicy.MUST_RECOMPUTE``, as selective activation checkpointing tags it): kept, it
would hold a copy of the layer's fused weights per layer until the backward (~50 MiB a layer at
8B).
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.utils.checkpoint import CheckpointPolicy

ENABLED = True
"""Whether :func:`model.compile_layers` passes the fusion to inductor (benchmarks turn it off to
measure it: ``trainer_step.py --sides vf-rl-unfused``)."""

_LINEAR = (torch._C._nn.linear, F.linear)
_REGION = ("_enter_autocast", "_exit_autocast", "set_grad_enabled", "_set_grad_enabled")


class FuseSharedInputLinears(CustomGraphPass):
    """The pass (see the module docstring); ``fused`` counts the ``linear`` calls it replaced."""

    fused = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        region, groups = 0, {}
        for node in graph.nodes:
            if node.op == "call_function" and getattr(node.target, "__name__", "") in _REGION:
                region += 1  # a new autocast or grad-mode region: nodes are fused within one only
            if node.op != "call_function" or node.target not in _LINEAR:
                continue
            x, w, b = (list(node.args) + [None, None])[:3]
            w, b = node.kwargs.get("weight", w), node.kwargs.get("bias", b)
            weight = _value(w)
            if weight is None or weight.dim() != 2 or not isinstance(x, torch.fx.Node) or (
                    b is not None and _value(b) is None):
                continue
            key = (x, region, b is not None, weight.requires_grad, weight.dtype, weight.device)
            groups.setdefault(key, []).append((node, w, b))
        order = {node: i for i, node in enumerate(graph.nodes)}  # before any group is rewritten
        for (x, _, biased, *_), members in groups.items():
            members = _fusable(order, x, members)
            if members:
                self._fuse(graph, x, biased, members)

    def _fuse(self, graph: torch.fx.Graph, x: torch.fx.Node, biased: bool, members: list) -> None:
        with graph.inserting_before(members[0][0]):
            weight = graph.call_function(torch.cat, ([w for _, w, _ in members],), {"dim": 0})
            weight.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE  # no copy kept for the backward
            weight.meta["ac_graph_id"] = 1
            bias = graph.call_function(torch.cat, ([b for _, _, b in members],), {"dim": 0}) if biased else None
            out = graph.call_function(torch._C._nn.linear, (x, weight, bias))
            parts = graph.call_function(torch.split, (out, [_value(w).shape[0] for _, w, _ in members]), {"dim": -1})
            items = [graph.call_function(operator.getitem, (parts, i)) for i in range(len(members))]
        for (node, _, _), item in zip(members, items):
            node.replace_all_uses_with(item)
            graph.erase_node(node)
        type(self).fused += len(members)

    def uuid(self) -> str:
        """The pass's identity in inductor's caches (a change to what it does changes this)."""
        return "vf-rl-fuse-shared-input-linears-v1"


FUSE = FuseSharedInputLinears()
"""The one instance every layer compiles with (dynamo compares backends by their options: one
instance per layer would make each layer's backend differ and recompile the shared code)."""


def _value(node) -> torch.Tensor | None:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _fusable(order: dict, x: torch.fx.Node, members: list) -> list:
    """The members worth fusing and safe to compute at the first one's place: two or more, one of
    them narrower than its input; each weight and bias defined before the first; ``x`` not changed
    in place between the first and the last."""
    if len(members) < 2:
        return []
    first, last = order[members[0][0]], order[members[-1][0]]
    members = [m for m in members if all(order.get(d, -1) < first for d in m[1:] if isinstance(d, torch.fx.Node))]
    width = _value(x).shape[-1] if _value(x) is not None else None
    if len(members) < 2 or width is None or all(_value(w).shape[0] >= width for _, w, _ in members):
        return []
    for user in x.users:
        name = user.target if user.op == "call_method" else getattr(user.target, "__name__", "")
        if first < order.get(user, -1) < last and isinstance(name, str) and name.endswith("_") and not name.endswith("__"):
            return []  # an in-place change of x between the products
    return members
