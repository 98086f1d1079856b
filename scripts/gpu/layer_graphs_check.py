"""Whether CUDA graphs captured by hand (``torch.cuda.make_graphed_callables`` over the compiled
decoder layers, what ``torch_compile_mode = "reduce-overhead"`` runs) train as the compiled layers
do, and how fast (issue 29).

The decoder stack compiled as one region of inductor's CUDA graphs ran 1.99x TRL's best on
fixed-length Qwen2-0.5B LoRA, but with a first step of 90-168 s (inductor compiles 24 layers),
against 20 s for per-layer regions, whose step is bound by the host's launches.
inductor's CUDA graphs cannot replay per-layer regions with torch 2.11 (one compiled
function called on its own output, pytorch/pytorch#152887).
``vf_rl.trainer.speed.layer_graphs`` keeps the
per-layer compile and records the layers' forward and backward, one graph each per shape, with
``make_graphed_callables``: a pass then replays two graphs instead of launching every kernel from
Python.

Sides, same random Qwen2-0.5B-shaped model with LoRA r16 on the seven projections (bf16, adapters
too), the same packed micro batches of the fixed batch (64 x (256 + 256) tokens, micro batch 8) and
of a second batch of another row length (192-token completions), steps alternating between the two:
``layers`` (``compile_layers``, the trainer's default), ``layers-again`` (the same, run again: how far
two runs of the same code lie apart, FlashAttention's backward adding with atomics), ``eager`` (the
layers not compiled: how far two right answers lie apart in bf16), ``graphs`` (the same compiled layers, called through the graphs
``vf_rl.trainer.speed.layer_graphs.LayerGraphs`` records for the row's shape) and ``eager-graphs`` (the
layers not compiled, recorded the same way: no compile at all).
Printed per side: first step (compile and recording included; a side after the first finds the
layers' code compiled in this process, so what it adds to a first step is its recording time,
printed apart), step time and tokens/s over the timed steps, peak memory; and the relative L2
difference of each batch's first-step LoRA gradients against the first side (a graph that replays
stale inputs, or a shape that overwrote another's memory, would show there). Exit status 1 when a
graph side's difference is over ``--tol`` and over the ``layers-again`` and ``eager`` sides' (the
floors; H200, ap: 2.6e-02 for the graphs, 3.5e-02 for eager layers recorded).

``--mode realistic``: three batches of ``trainer_step.py``'s realistic distribution instead (shared
prompts, completions of 4-1,024 tokens), padded to bucket sizes as the trainer's CUDA-graph mode pads
them; each shape is recorded at its second pass, so a run's first steps hold
the recordings.

On the CPU (``--device cpu``, no CUDA graphs) the graph sides run their layers through the same
routing without recording: a check of the plumbing (the gradients must equal the plain model's).

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

from vf_rl.orchestrator.samples import Sample  # noqa: E402
from vf_rl.trainer.model import compile_layers, decoder_layers  # noqa: E402
from vf_rl.trainer.speed.attention import register_attention  # noqa: E402
from vf_rl.trainer.speed.layer_graphs import LayerGraphs  # noqa: E402
from vf_rl.trainer.speed.logprobs import packed_policy_logprobs  # noqa: E402
from vf_rl.trainer.speed.packing import micro_batches_to, plan_micro_batches  # noqa: E402


def build(args, device: torch.device, graphs: bool, compiled: bool = True):
    """The model of one side (same seed on every side): LoRA, vf-rl's packed attention, compiled
    layers (unless ``--no-compile`` or ``compiled`` False); with ``graphs`` its layers routed
    through :class:`LayerGraphs` (recording on a GPU); returns ``(model, LayerGraphs or None)``."""
    from peft import LoraConfig, get_peft_model

    model = build_model(args.model_config, device, torch.bfloat16, seed=0)
    torch.manual_seed(1)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=LORA_TARGETS,
                                             init_lora_weights=False)).to(torch.bfloat16)
    model.set_attn_implementation(register_attention())
    if args.compile and compiled:
        compile_layers(model)
    return model, (LayerGraphs(decoder_layers(model)) if graphs else None)


def batches(args, device: torch.device) -> list[list]:
    """The batches the steps cycle through, as the trainer plans them for a compiled model (packed
    micro batches, on the device). ``fixed``: the fixed batch, then one of ``--second-completion-len``
    (another row length) unless 0. ``realistic``: three batches of ``trainer_step.py``'s realistic
    distribution (seeds 0-2: prompts shared by groups of 8, of up to ``--prompt-max`` tokens,
    completions up to ``--max-tokens``), padded to
    bucket sizes as the CUDA-graph mode pads them (a few shapes, recorded once each). Packed rows
    carry the run's ``max_seq_len`` as their bound, as the trainer's do."""
    g = torch.Generator().manual_seed(0)
    out = []
    if args.mode == "fixed":
        for c in [args.completion_len] + ([args.second_completion_len] if args.second_completion_len else []):
            samples = []
            for _ in range(args.batch):
                ids = torch.randint(3, 1000, (args.prompt_len + c,), generator=g).tolist()
                samples.append(Sample(ids, [0] * args.prompt_len + [1] * c, [0.0] * len(ids),
                                      float(torch.randn((), generator=g))))
            longest = args.prompt_len + max(args.completion_len, args.second_completion_len)  # the run's max_seq_len
            out.append(plan_micro_batches(samples, 1, 0, args.micro_batch, None, True, 0, True, always_pack=True,
                                          max_seq_len=longest))
    else:
        from types import SimpleNamespace

        from trainer_step import batch_shape

        for seed in range(3):
            shape = SimpleNamespace(mode="realistic", batch=args.batch, group=8, prompt_min=min(64, args.prompt_max),
                                    prompt_max=args.prompt_max, max_tokens=args.max_tokens, cap_share=0.25,
                                    seed=seed)
            samples = []
            for P, C, group in zip(*batch_shape(shape)):
                if not samples or samples[-1].group != group:
                    prompt = torch.randint(3, 1000, (P,), generator=g).tolist()
                ids = prompt + torch.randint(3, 1000, (C,), generator=g).tolist()
                samples.append(Sample(ids, [0] * P + [1] * C, [0.0] * len(ids), float(torch.randn((), generator=g)),
                                      group=group, prompt_len=P))
            out.append(plan_micro_batches(samples, 1, 0, args.micro_batch, None, True, 0, True, bucketed=True,
                                          max_seq_len=shape.prompt_max + shape.max_tokens))
    return [micro_batches_to(plan, device) for plan in out]


def step(model, micro_batches: list, optimizer) -> torch.Tensor:
    """One optimizer step over the micro batches (CISPO's shape of loss: log-probs x advantage over
    loss tokens); returns the LoRA gradients before the update (flat, float32)."""
    tokens = sum(int(mb.loss_mask.sum()) for mb in micro_batches)
    for mb in micro_batches:
        logprobs, _ = packed_policy_logprobs(model, mb)
        loss = -(logprobs * mb.advantages[:, None] * mb.loss_mask).sum() / tokens
        loss.backward()
        # Drop the micro batch's graph before the next forward: its nodes (the LoRA weights'
        # AccumulateGrad among them, made on the default stream) would otherwise outlive it into a
        # recording, whose backward on the capture stream then waits on the default stream, which
        # CUDA refuses (cudaErrorStreamCaptureImplicit).
        del logprobs, loss
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.requires_grad])
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return grads


def side(args, device: torch.device, name: str) -> dict:
    """One side's run (``layers``, ``layers-again``, ``eager``, ``graphs`` or ``eager-graphs``): first
    step, timed steps, and the first step's LoRA gradients of each batch."""
    graphs = name.endswith("graphs")
    model, layer_graphs = build(args, device, graphs, compiled=not name.startswith("eager"))
    cycle = batches(args, device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.AdamW(trainable, lr=1e-6, fused=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    first = [step(model, cycle[0], optimizer)]
    sync()
    first_s = time.perf_counter() - start
    first += [step(model, b, optimizer) for b in cycle[1:]]
    times = []
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        step(model, cycle[i % len(cycle)], optimizer)
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
    tokens = sum(mb.tokens for b in cycle for mb in b) / len(cycle)
    mean = sum(times) / len(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    recorded = f"{len(layer_graphs.graphs)} shape(s) recorded in {layer_graphs.record_s:.1f} s, " if graphs else ""
    print(f"[{name}] first step {first_s:.1f} s, {recorded}step {mean:.3f} s "
          f"({min(times):.3f}-{max(times):.3f}), {tokens / mean:,.0f} tokens/s, peak {peak:.2f} GiB", flush=True)
    return {"first": first, "first_s": first_s, "step_s": mean, "tokens_per_s": tokens / mean}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model-config", default="qwen2-0.5b")
    p.add_argument("--mode", choices=("fixed", "realistic"), default="fixed")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--completion-len", type=int, default=256)
    p.add_argument("--second-completion-len", type=int, default=192,
                   help="a second batch of this completion length (another row length: graphs recorded per shape, "
                        "one pool), steps alternating between the two; 0: one batch")
    p.add_argument("--prompt-max", type=int, default=1024, help="realistic: longest prompt")
    p.add_argument("--max-tokens", type=int, default=1024, help="realistic: completion cap")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-compile", dest="compile", action="store_false", help="eager layers (CPU plumbing check)")
    p.add_argument("--sides", default="layers,layers-again,eager,graphs,eager-graphs",
                   help="comma-separated, the first the reference: layers (compiled), layers-again (the same again), "
                        "eager (not compiled), graphs (compiled layers recorded), eager-graphs (eager layers "
                        "recorded: no compile at all)")
    p.add_argument("--tol", type=float, default=2e-2,
                   help="largest relative L2 gradient difference of a graph side (or the floors' of layers-again "
                        "and eager, if larger)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    names = args.sides.split(",")
    runs = {name: side(args, device, name) for name in names}
    ref = runs[names[0]]
    diffs = {}
    for name in names[1:]:
        r = runs[name]
        diffs[name] = max(((g - a).norm() / a.norm()).item() for g, a in zip(r["first"], ref["first"]))
        print(f"{name} against {names[0]}: first steps' LoRA gradients (one per batch), largest relative L2 "
              f"difference {diffs[name]:.3e}; speed {r['tokens_per_s'] / ref['tokens_per_s']:.2f}x, first step "
              f"{r['first_s']:.1f} s against {ref['first_s']:.1f} s", flush=True)
    bar = max(args.tol, diffs.get("layers-again", 0.0), diffs.get("eager", 0.0))
    return 0 if all(d <= bar for name, d in diffs.items() if name.endswith("graphs")) else 1


if __name__ == "__main__":
    sys.exit(main())
