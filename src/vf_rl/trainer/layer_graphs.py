"""CUDA graphs recorded by hand over the compiled decoder layers (an experiment for issue 29).

A small model's training step is bound by the host launching kernels (Qwen2-0.5B LoRA on an
H200: 37,275 tokens/s with per-layer compiled regions, 97,803 with the whole decoder stack as
inductor's CUDA graphs; benchmarks/RESULTS.md, ao). The stack's graphs cost a 24-layer compile
(150 s before the first step) and inductor cannot replay per-layer regions with torch 2.11 (one
compiled function called on its own output, pytorch/pytorch#152887). :class:`LayerGraphs` keeps the
per-layer compile (one graph for every layer, ~15-20 s) and records each layer's forward and
backward with ``torch.cuda.make_graphed_callables`` per input shape: a training pass of a recorded
shape then replays 2 x layers graphs instead of launching every kernel from Python.

How it runs: each compiled layer's call goes through :meth:`LayerGraphs.call`. A training
forward (grad enabled, the layer in train mode) on a packed CUDA row whose attention runs the
varlen kernel is keyed by the shapes, dtypes and ``requires_grad`` of its tensor arguments and
its other arguments' values; a shape's first pass runs the compiled layers as they are, its second
records every layer at once (at layer 0: forwards in order, backwards in reverse, one memory pool
for every shape, since a micro batch's backward ends before the next forward), and later passes
replay. Anything else (no-grad passes, eval, recomputes inside a backward, the CPU, padded
batches) runs the compiled layers.
Rows should come in a few shapes: the trainer pads micro batches to bucket sizes
(``packing.pad_to_buckets``) as it does for the stack's graphs.

Requirements a caller keeps: no autograd graph of an earlier micro batch alive at a recording
(its nodes, the trainable weights' ``AccumulateGrad`` among them, belong to the default stream,
and a recording's backward on the capture stream then waits on it: cudaErrorStreamCaptureImplicit);
every trainable parameter with a ``.grad`` before a replayed backward (a graph's backward returns
its static gradient buffers, which autograd would otherwise take as a parameter's ``.grad`` and the
next replay overwrite: pytorch/pytorch#169545); no hooks on a layer's wrapper. Memory: a shape's
graphs keep their inputs, outputs and gradient buffers; their activations, live only between a
micro batch's forward and backward replays, come from the pool every shape shares: right as long
as no other shape's graphs replay between a micro batch's forward and its backward (micro batches
run one after the other; a forward that gradient checkpointing re-runs inside the backward runs
the layers as they are).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .attention import varlen_applies
from .packing import PackedLayout

_TENSOR = object()  # a tensor's place among a call's arguments


class _FlatLayer(torch.nn.Module):
    """One layer called with tensors only, as ``make_graphed_callables`` takes it: the call's
    tensor arguments in order, then the layout's ``cu_q``, ``cu_k`` (and ``key_index``). Its
    parameters are the layer's (one wrapper per recorded shape: recording replaces a module's
    ``forward``)."""

    def __init__(self, layer: torch.nn.Module, run: Callable, form: tuple):
        super().__init__()
        self.layer, self.run, self.form = layer, run, form

    def forward(self, *tensors: torch.Tensor):
        spec, leaves, n_layout, segments = self.form
        n_call = len(tensors) - n_layout
        it = iter(tensors[:n_call])
        args, kwargs = tree_unflatten([next(it) if x is _TENSOR else x for x in leaves], spec)
        cu_q, cu_k, *key_index = tensors[n_call:]
        key_index = key_index[0] if key_index else None
        n = tensors[0].shape[1]  # the hidden states of the packed row, [1, N, H]
        # longest segments as upper bounds (what the compiled layer uses anyway), so a replay is right
        # for every micro batch of this shape
        layout = PackedLayout(cu_q, cu_k, key_index, n, key_index.shape[0] if key_index is not None else n,
                              segments)
        return self.run(*args, vf_rl_packing=layout, **kwargs)


def _split(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], tuple, Hashable] | None:
    """A layer call's tensors (its own, then the layout's), the form :class:`_FlatLayer` rebuilds
    it from, and the key of its shape; None when a non-tensor argument cannot be keyed."""
    layout: PackedLayout = kwargs["vf_rl_packing"]
    leaves, spec = tree_flatten((args, {k: v for k, v in kwargs.items() if k != "vf_rl_packing"}))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    fixed = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
    layout_tensors = [layout.cu_q, layout.cu_k] + ([layout.key_index] if layout.key_index is not None else [])
    tensors += layout_tensors
    try:  # the same key for every layer of a pass: the hidden state's requires_grad left out (the
        # first layer's follows the embeddings, every later one's the layers before it)
        key = (spec, tuple(fixed), tuple((tuple(t.shape), t.dtype, t.requires_grad and i > 0)
                                         for i, t in enumerate(tensors)))
        hash(key)
    except TypeError:
        return None
    return tensors, (spec, fixed, len(layout_tensors), layout.segments), key


class LayerGraphs:
    """Routes the compiled ``layers`` (``model.compile_layers``) through per-shape CUDA graphs.

    Args:
        layers: the decoder layers, compiled (``_compiled_call_impl``, which then runs them) or not
            (their own ``_call_impl``: eager kernels, replayed the same way).

    Attributes:
        graphs: key -> one graphed callable per layer, for each recorded shape.
        record_s: seconds spent recording (warm-up iterations and capture), all shapes.
    """

    def __init__(self, layers: list[torch.nn.Module]):
        self.layers = list(layers)
        self.runs = [layer._compiled_call_impl or layer._call_impl for layer in self.layers]
        self.graphs: dict[Hashable, list[Callable]] = {}
        self.seen: set[Hashable] = set()
        self.record_s = 0.0
        self.pool = None  # one memory pool for every shape's graphs, made at the first recording
        for i, layer in enumerate(self.layers):
            layer._compiled_call_impl = (lambda i: lambda *a, **k: self.call(i, a, k))(i)

    def call(self, index: int, args: tuple, kwargs: dict):
        """Layer ``index``'s call: replayed, recorded or run compiled (module docstring)."""
        layout = kwargs.get("vf_rl_packing")
        hidden = args[0] if args else None  # transformers passes the hidden states first, positionally
        if (layout is None or not isinstance(hidden, torch.Tensor) or not torch.is_grad_enabled()
                or not self.layers[index].training or not varlen_applies(hidden)
                or torch._C._current_graph_task_id() != -1  # inside a backward: a checkpoint's recompute
                or (hidden.is_cuda and torch.cuda.is_current_stream_capturing())):
            return self.runs[index](*args, **kwargs)
        split = _split(args, kwargs)
        if split is None:
            return self.runs[index](*args, **kwargs)
        tensors, form, key = split
        if index == 0:
            if key not in self.graphs and key in self.seen:
                self._record(key, tensors, form)
            self.seen.add(key)
        graphs = self.graphs.get(key)
        return graphs[index](*tensors) if graphs else self.runs[index](*args, **kwargs)

    def _record(self, key: Hashable, tensors: list[torch.Tensor], form: tuple) -> None:
        start = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        flats = tuple(_FlatLayer(layer, run, form) for layer, run in zip(self.layers, self.runs))
        # sample inputs of their own (a replay copies its inputs into them); every layer's input has
        # the first one's shape, and requires grad from the first layer with a trainable parameter on
        sample, grad = [], tensors[0].requires_grad
        for layer in self.layers:
            hidden = tensors[0].detach().clone().requires_grad_(grad)
            sample.append((hidden,) + tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in tensors[1:]))
            grad = grad or any(p.requires_grad for p in layer.parameters())
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)  # make_graphed_callables refuses autocast's weight cache
        try:
            self.graphs[key] = list(torch.cuda.make_graphed_callables(flats, tuple(sample), pool=self.pool))
        finally:
            torch.set_autocast_cache_enabled(cache)
        torch.cuda.synchronize()
        self.record_s += time.perf_counter() - start
