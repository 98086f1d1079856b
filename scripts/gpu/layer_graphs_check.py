"""Whether per-layer CUDA graphs captured by hand (``torch.cuda.make_graphed_callables`` over the
compiled decoder layers) train as the compiled layers do, and how fast: an experiment for issue 29.

The CUDA-graph mode the trainer ships (``torch_compile_mode = "reduce-overhead"``) compiles the
whole decoder stack as one region: 1.99x TRL's best on fixed-length Qwen2-0.5B LoRA, but a first
step of 90-112 s (inductor compiles 24 layers), against 21 s for per-layer regions, whose step is
bound by the host's launches (benchmarks/RESULTS.md, ak, an). inductor's CUDA graphs cannot replay
per-layer regions with torch 2.11 (one compiled function called on its own output,
pytorch/pytorch#152887). This script keeps the per-layer compile and records each layer's forward
and backward as graphs of its own with ``make_graphed_callables`` (one memory pool, forwards in
order, backwards in reverse, as a training pass runs them): a pass then replays 2 x layers graphs
instead of launching every kernel from Python.

Sides, same random Qwen2-0.5B-shaped model with LoRA r16 on the seven projections (bf16, adapters
too), the same packed micro batches of the fixed batch (64 x (256 + 256) tokens, micro batch 8) and
of a second batch of another row length (192-token completions), steps alternating between the two:
``layers`` (``compile_layers``, the trainer's default) and ``graphs`` (the same compiled layers,
each called through the graphs recorded for the row's shape, every shape in one memory pool).
Printed per side: first step (compile and recording included; the graphs side runs second and finds
the layers' code compiled in this process, so what it adds to a first step is its recording time,
printed apart), step time and tokens/s over the timed steps, peak memory; and the relative L2
difference of each batch's first-step LoRA gradients between the sides (a graph that replays stale
inputs, or a shape that overwrote another's memory, would show there).

On the CPU (``--device cpu``, no CUDA graphs) the graphs side calls the same per-layer wrappers
without recording: a check of the plumbing (the gradients must equal the plain model's).

    python scripts/gpu/layer_graphs_check.py [--device cuda] [--model-config qwen2-0.5b] [--steps 6]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from trainer_step import LORA_TARGETS, build_model  # noqa: E402

from vf_rl.trainer.attention import register_attention  # noqa: E402
from vf_rl.trainer.batching import Sample  # noqa: E402
from vf_rl.trainer.logprobs import packed_policy_logprobs  # noqa: E402
from vf_rl.trainer.model import base_model, compile_layers  # noqa: E402
from vf_rl.trainer.packing import PackedLayout, plan_micro_batches  # noqa: E402


class FlatLayer(torch.nn.Module):
    """A decoder layer called with tensors only (``make_graphed_callables`` takes no other
    arguments): the row's hidden states ``[1, N, H]``, RoPE's ``cos`` and ``sin`` ``[1, N, D]``,
    the layout's ``cu_q`` and ``cu_k`` ``[S + 1]`` int32; returns ``[1, N, H]``. The layout's host
    fields (longest segments, segment list) are set per micro batch shape (``shape``)."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer
        self.host = (0, 0, [])

    def forward(self, hidden, cos, sin, cu_q, cu_k):
        max_q, max_k, segments = self.host
        layout = PackedLayout(cu_q, cu_k, None, max_q, max_k, segments)
        return self.layer(hidden, position_embeddings=(cos, sin), vf_rl_packing=layout)


def shape(hidden: torch.Tensor, cu_q: torch.Tensor) -> tuple[int, int]:
    """A recorded graph's key: the row's length ``N`` and its segment count + 1."""
    return hidden.shape[1], cu_q.shape[0]


class Router(torch.nn.Module):
    """Stands in the model's layer list for layer ``index``: takes transformers' call and runs the
    layer's graphed callable recorded for the row's :func:`shape` (``graphs``), else the flat layer."""

    def __init__(self, flat: FlatLayer, graphs: dict, index: int):
        super().__init__()
        self.flat, self.graphs, self.index = flat, graphs, index

    def forward(self, hidden_states, position_embeddings=None, vf_rl_packing=None, **_):
        layout = vf_rl_packing
        self.flat.host = (layout.max_q, layout.max_k, layout.segments)
        cos, sin = position_embeddings
        recorded = self.graphs.get(shape(hidden_states, layout.cu_q))
        call = recorded[self.index] if recorded else self.flat
        return call(hidden_states, cos, sin, layout.cu_q, layout.cu_k)


def build(args, device: torch.device, graphs: bool):
    """The model of one side (same seed on both): LoRA, vf-rl's packed attention, compiled layers;
    with ``graphs`` every layer routed through a :class:`FlatLayer` (recorded later)."""
    from peft import LoraConfig, get_peft_model

    model = build_model(args.model_config, device, torch.bfloat16, seed=0)
    torch.manual_seed(1)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=LORA_TARGETS,
                                             init_lora_weights=False)).to(torch.bfloat16)
    model.set_attn_implementation(register_attention())
    if args.compile:
        compile_layers(model)
    flats, recorded = [], {}
    if graphs:
        layers = base_model(model).model.layers
        for i in range(len(layers)):
            flats.append(FlatLayer(layers[i]))
            layers[i] = Router(flats[-1], recorded, i)
    return model, flats, recorded


def batch(args, device: torch.device, completion_len: int, seed: int = 0) -> list:
    """A fixed batch as the trainer plans it for a compiled model: packed micro batches (on the device)."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(args.batch):
        ids = torch.randint(3, 1000, (args.prompt_len + completion_len,), generator=g).tolist()
        samples.append(Sample(ids, [0] * args.prompt_len + [1] * completion_len, [0.0] * len(ids),
                              float(torch.randn((), generator=g))))
    plan = plan_micro_batches(samples, 1, 0, args.micro_batch, None, True, 0, True, always_pack=True)
    return [mb.to(device) for mb in plan]


def record(model, flats: list, recorded: dict, mb, pool) -> float:
    """Record every layer's forward and backward for ``mb``'s :func:`shape` (``make_graphed_callables``,
    in the memory pool ``pool``, shared by every shape: a micro batch's backward ends before the
    next forward, whatever its shape); returns the seconds it took."""
    start = time.perf_counter()
    base = base_model(model).model
    with torch.no_grad():
        hidden = base.embed_tokens(mb.input_ids)
        cos, sin = base.rotary_emb(hidden, mb.position_ids)
    for flat in flats:
        flat.host = (mb.layout.max_q, mb.layout.max_k, mb.layout.segments)
    sample = tuple((hidden.detach().clone().requires_grad_(True), cos, sin, mb.layout.cu_q, mb.layout.cu_k)
                   for _ in flats)
    graphed = torch.cuda.make_graphed_callables(tuple(flats), sample, pool=pool)
    recorded[shape(hidden, mb.layout.cu_q)] = list(graphed)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def step(model, micro_batches: list, optimizer) -> torch.Tensor:
    """One optimizer step over the micro batches (CISPO's shape of loss: log-probs x advantage over
    loss tokens); returns the LoRA gradients before the update (flat, float32)."""
    tokens = sum(int(mb.loss_mask.sum()) for mb in micro_batches)
    for mb in micro_batches:
        logprobs, _ = packed_policy_logprobs(model, mb)
        loss = -(logprobs * mb.advantages[:, None] * mb.loss_mask).sum() / tokens
        loss.backward()
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.requires_grad])
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return grads


def side(args, device: torch.device, graphs: bool) -> dict:
    model, flats, recorded = build(args, device, graphs)
    batches = [batch(args, device, args.completion_len)]
    if args.second_completion_len:
        batches.append(batch(args, device, args.second_completion_len, seed=1))
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.AdamW(trainable, lr=1e-6, fused=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    captured = 0.0
    if graphs and device.type == "cuda":
        for micro_batches in batches:  # compile the layers' graph (row sizes dynamic) outside the recording
            logprobs, _ = packed_policy_logprobs(model, micro_batches[0])
            logprobs.sum().backward()
        model.zero_grad(set_to_none=False)
        pool = torch.cuda.graph_pool_handle()
        for micro_batches in batches:
            captured += record(model, flats, recorded, micro_batches[0], pool)
    first = [step(model, batches[0], optimizer)]
    sync()
    first_s = time.perf_counter() - start
    first += [step(model, b, optimizer) for b in batches[1:]]
    times = []
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        step(model, batches[i % len(batches)], optimizer)
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    tokens = sum(mb.tokens for b in batches for mb in b) / len(batches)
    mean = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    print(f"[{'graphs' if graphs else 'layers'}] first step {first_s:.1f} s (recording {captured:.1f} s for "
          f"{len(recorded)} shape(s)), step {mean:.3f} s ({min(times):.3f}-{max(times):.3f}), "
          f"{tokens / mean:,.0f} tokens/s, peak {peak:.2f} GiB", flush=True)
    return {"first": first, "first_s": first_s, "step_s": mean, "tokens_per_s": tokens / mean}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model-config", default="qwen2-0.5b")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--completion-len", type=int, default=256)
    p.add_argument("--second-completion-len", type=int, default=192,
                   help="a second batch of this completion length (another row length: graphs recorded per shape, "
                        "one pool), steps alternating between the two; 0: one batch")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-compile", dest="compile", action="store_false", help="eager layers (CPU plumbing check)")
    p.add_argument("--tol", type=float, default=2e-2, help="largest relative L2 gradient difference")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    layers = side(args, device, graphs=False)
    graphs = side(args, device, graphs=True)
    diff = max(((g - a).norm() / a.norm()).item() for g, a in zip(graphs["first"], layers["first"]))
    print(f"first steps' LoRA gradients (one per batch), graphs against layers: largest relative L2 difference "
          f"{diff:.3e}; "
          f"speed {graphs['tokens_per_s'] / layers['tokens_per_s']:.2f}x, first step "
          f"{graphs['first_s']:.1f} s against {layers['first_s']:.1f} s", flush=True)
    return 0 if diff <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
