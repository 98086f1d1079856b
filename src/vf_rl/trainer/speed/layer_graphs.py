"""CUDA graphs recorded by hand over the compiled decoder layers (``torch_compile_mode = "reduce-overhead"``).

A small model's training step is bound by the host launching kernels: per-layer compiled
regions run far below the whole decoder stack as inductor's CUDA graphs (``docs/benchmarks.md``).
The stack's graphs cost a compile of every layer (minutes before the first step) and inductor cannot
replay per-layer regions with torch 2.11 (one
compiled function called on its own output, pytorch/pytorch#152887). :class:`LayerGraphs` keeps the
per-layer compile (one graph for every layer, seconds) and records the layers' forward and
backward, all layers in one graph each, with ``torch.cuda.make_graphed_callables`` per input
shape: a training pass of a recorded shape then replays two graphs instead of launching every
kernel from Python.

How it runs: each compiled layer's call goes through :meth:`LayerGraphs.call`. A training
forward (grad enabled, the layer in train mode) on a packed CUDA row whose attention runs the
varlen kernel is keyed by the shapes, dtypes and ``requires_grad`` of its tensor arguments and
its other arguments' values. A shape's first pass runs the compiled layers as they are and checks
that the decoder calls them in order, each on the previous one's output, all with layer 0's other
arguments (the same tensors, not only the same shapes: a model whose layers take rotary tables or
masks of their own per layer type fails it), and that each returns its hidden states alone (a
tensor or a 1-tuple): only then can one graph stand for the loop. Its second pass records, at layer 0 (every layer's forward
in order, then the backwards in reverse, into one memory pool that every shape shares, since a
micro batch's backward ends before the next forward), and replays; layer 0's call then returns
the last layer's output, and the later layers' calls hand it on. Anything else (no-grad passes,
eval, recomputes inside a backward, the CPU, padded batches, models whose loop the check refuses)
runs the compiled layers, as does every pass after a recording that failed (a layer that a capture
cannot hold: one that reads a value on the host).
Rows should come in a few shapes: the trainer pads micro batches to bucket sizes
(``packing.pad_to_buckets``) as it does for the stack's graphs.

Requirements a caller keeps: no autograd graph of an earlier micro batch alive at a recording
(its nodes, the trainable weights' ``AccumulateGrad`` among them, belong to the default stream,
and a recording's backward on the capture stream then waits on it: cudaErrorStreamCaptureImplicit);
every trainable parameter with a ``.grad`` before a replayed backward (a graph's backward returns
its static gradient buffers, which autograd would otherwise take as a parameter's ``.grad`` and the
next replay overwrite: pytorch/pytorch#169545); no hooks on the layers. Memory: a shape's graphs
keep their inputs, output and gradient buffers (the row's hidden states four times); their
activations, live only between a micro batch's forward and backward replays, come from the pool
every shape shares: right as long as no other shape's graphs replay between a micro batch's
forward and its backward (micro batches run one after the other; a forward that gradient
checkpointing re-runs inside the backward runs the layers as they are). A recording's warm-up
passes take a pass's activations from the allocator once more; they go back to the device after
it (``memory.estimate_trainer_peak`` counts the activations twice).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from vf_rl.trainer.speed.attention import varlen_applies
from vf_rl.trainer.speed.packing import PackedLayout

_TENSOR = object()  # a tensor's place among a call's arguments


class _FlatStack(torch.nn.Module):
    """The layers run one after another, called with tensors only, as ``make_graphed_callables``
    takes a module: the first layer's tensor arguments in order (its hidden states first), then the
    layout's ``cu_q``, ``cu_k`` (and ``key_index``); every later layer gets the previous one's
    output as its hidden states and the same other arguments. Its parameters are the layers' (one
    wrapper per recorded shape: recording replaces a module's ``forward``)."""

    def __init__(self, layers: list[torch.nn.Module], runs: list[Callable], form: tuple):
        super().__init__()
        self.layers, self.runs, self.form = torch.nn.ModuleList(layers), runs, form

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        spec, leaves, n_layout, segments, bound = self.form
        n_call = len(tensors) - n_layout
        cu_q, cu_k, *key_index = tensors[n_call:]
        key_index = key_index[0] if key_index else None
        n = tensors[0].shape[1]  # the hidden states of the packed row, [1, N, H]
        # the row's lengths as longest segments, so a replay is right for every micro batch of this shape
        # (the compiled layer passes the kernel the layout's bound where it has one, part of the key)
        layout = PackedLayout(cu_q, cu_k, key_index, n, key_index.shape[0] if key_index is not None else n,
                              segments, bound)
        hidden = tensors[0]
        for run in self.runs:
            it = iter((hidden,) + tensors[1:n_call])
            args, kwargs = tree_unflatten([next(it) if x is _TENSOR else x for x in leaves], spec)
            out = run(*args, vf_rl_packing=layout, **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden


def _split(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], tuple, Hashable] | None:
    """A layer call's tensors (its own, then the layout's), the form :class:`_FlatStack` rebuilds
    it from, and the key of its shape; None when a non-tensor argument cannot be keyed."""
    layout: PackedLayout = kwargs["vf_rl_packing"]
    leaves, spec = tree_flatten((args, {k: v for k, v in kwargs.items() if k != "vf_rl_packing"}))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    fixed = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
    layout_tensors = [layout.cu_q, layout.cu_k] + ([layout.key_index] if layout.key_index is not None else [])
    tensors += layout_tensors
    try:  # the same key for every layer of a pass: the hidden state's requires_grad left out (the
        # first layer's follows the embeddings, every later one's the layers before it)
        key = (spec, tuple(fixed), layout.bound, tuple((tuple(t.shape), t.dtype, t.requires_grad and i > 0)
                                                       for i, t in enumerate(tensors)))
        hash(key)
    except TypeError:
        return None
    return tensors, (spec, fixed, len(layout_tensors), layout.segments, layout.bound), key


def _hidden_out(out) -> torch.Tensor | None:
    """A layer's output hidden states when that is all it returns (a tensor or a 1-tuple), else None."""
    if isinstance(out, tuple) and len(out) == 1:
        out = out[0]
    return out if isinstance(out, torch.Tensor) else None


class LayerGraphs:
    """Routes the compiled ``layers`` (``model.compile_layers``) through per-shape CUDA graphs.

    Args:
        layers: the decoder layers in the order the model calls them, compiled
            (``_compiled_call_impl``, which then runs them) or not (their own ``_call_impl``: eager
            kernels, replayed the same way).
        max_shapes: shapes recorded at most; later new shapes run the compiled layers (each shape
            holds its row's hidden states four times: inputs, output and gradient buffers).

    Attributes:
        graphs: key -> ``(graphed stack, its hidden input's requires_grad, layers return 1-tuples)``
            for each recorded shape.
        seen: key -> whether the layers return 1-tuples, for each shape whose first pass ran every
            layer as one graph can stand for (module docstring).
        record_s: seconds spent recording (warm-up iterations and capture), all shapes.
        failed: why a recording failed (its error's first line), else None; after one, none is tried.

    Raises:
        RuntimeError: (from a layer's call) a replayed pass whose next layer is called on other hidden
            states than the graph's output: the model changed between the check and the replay.
    """

    def __init__(self, layers: list[torch.nn.Module], max_shapes: int = 64):
        self.layers, self.max_shapes = list(layers), max_shapes
        self.runs = [layer._compiled_call_impl or layer._call_impl for layer in self.layers]
        self.graphs: dict[Hashable, tuple[Callable, bool, bool]] = {}
        self.seen: dict[Hashable, bool] = {}
        self.record_s = 0.0
        self.failed: str | None = None  # why a recording failed: none is tried again, the compiled layers run
        self.pool = None  # one memory pool for every shape's graphs, made at the first recording
        self._trace: list | None = None  # a first pass: [key, next layer, its input, 1-tuples, layer 0's other tensors]
        self._through: tuple | None = None  # a replayed pass: (next layer, the graph's output, what to return)
        for i, layer in enumerate(self.layers):
            layer._compiled_call_impl = (lambda i: lambda *a, **k: self.call(i, a, k))(i)

    def call(self, index: int, args: tuple, kwargs: dict):
        """Layer ``index``'s call: replayed, recorded, handed on or run compiled (module docstring)."""
        if index == 0:
            self._through = self._trace = None
        elif self._through is not None:
            return self._hand_on(index, args)
        elif self._trace is None:  # a later layer of a pass neither replayed nor under check
            return self.runs[index](*args, **kwargs)
        layout = kwargs.get("vf_rl_packing")
        hidden = args[0] if args else None  # transformers passes the hidden states first, positionally
        split = None
        if (layout is not None and isinstance(hidden, torch.Tensor) and torch.is_grad_enabled()
                and self.layers[index].training and varlen_applies(hidden)
                and torch._C._current_graph_task_id() == -1  # not inside a backward: a checkpoint's recompute
                and not (hidden.is_cuda and torch.cuda.is_current_stream_capturing())):
            split = _split(args, kwargs)
        if split is None:
            self._trace = None
            return self.runs[index](*args, **kwargs)
        tensors, form, key = split
        if index == 0:
            recorded = self.graphs.get(key)
            if recorded is None and key in self.seen and len(self.graphs) < self.max_shapes and not self.failed:
                recorded = self._record(key, tensors, form)
            if recorded is not None and recorded[1] == hidden.requires_grad:
                graphed, _, one_tuple = recorded
                out = graphed(*tensors)
                ret = (out,) if one_tuple else out
                if len(self.layers) > 1:
                    self._through = (1, out, ret)
                return ret
            self._trace = [key, 0, hidden, None, tensors[1:]]
        out = self.runs[index](*args, **kwargs)
        self._check(index, key, tensors, out)
        return out

    def _check(self, index: int, key: Hashable, tensors: list[torch.Tensor], out) -> None:
        """A first pass's layer ``index`` (its tensors, the hidden states first; its output ``out``)
        continues the trace: the same key, the next index, the previous layer's output as its input,
        layer 0's other tensors themselves, its hidden states alone as its output; the last layer's
        completes it (``seen``). Anything else ends it."""
        trace, result = self._trace, _hidden_out(out)
        if (trace is None or trace[0] != key or trace[1] != index or trace[2] is not tensors[0] or result is None
                or trace[3] not in (None, isinstance(out, tuple))
                or any(a is not b for a, b in zip(tensors[1:], trace[4]))):
            self._trace = None
            return
        trace[1:4] = [index + 1, result, isinstance(out, tuple)]
        if index == len(self.layers) - 1:
            self.seen[key] = trace[3]
            self._trace = None

    def _hand_on(self, index: int, args: tuple):
        """A later layer's call in a replayed pass: the graph ran it already; its output is the graph's."""
        expected, out, ret = self._through
        if index != expected or not args or args[0] is not out:
            self._through = None
            raise RuntimeError(f"layer graphs: decoder layer {index} was called on other hidden states than the "
                               f"recorded layers' output (layer {expected} on it was expected)")
        self._through = None if index == len(self.layers) - 1 else (index + 1, out, ret)
        return ret

    def _record(self, key: Hashable, tensors: list[torch.Tensor], form: tuple) -> tuple[Callable, bool, bool] | None:
        """Record a shape's graphs; None when recording fails (a layer that reads a value on the host
        or synchronizes, which a capture cannot hold, e.g. a mixture-of-experts router's token counts):
        ``failed`` says why, and the layers run compiled from then on."""
        start = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stack = _FlatStack(self.layers, self.runs, form)
        # sample inputs of its own (a replay copies its inputs into them)
        sample = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in tensors)
        cache = torch.is_autocast_cache_enabled()
        autocast = torch.is_autocast_enabled("cuda")
        if autocast:  # make_graphed_callables refuses autocast's weight cache (model.record_layer_graphs turns it off)
            torch.set_autocast_cache_enabled(False)
        try:
            graphed = torch.cuda.make_graphed_callables(stack, sample, pool=self.pool)
        except RuntimeError as exc:
            self.failed = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"layer graphs: recording a row of {tensors[0].shape[1]} tokens failed ({self.failed}); the "
                  "compiled layers run without CUDA graphs from now on", flush=True)
            return None
        finally:
            torch.set_autocast_cache_enabled(cache)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the warm-up passes' cached blocks, back to the device (vLLM may share it)
        took = time.perf_counter() - start
        self.record_s += took
        print(f"layer graphs: recorded a row of {tensors[0].shape[1]} tokens in {took:.1f} s "
              f"({len(self.graphs) + 1} shapes, {self.record_s:.1f} s of recording in all)", flush=True)
        self.graphs[key] = (graphed, tensors[0].requires_grad, self.seen[key])
        return self.graphs[key]
