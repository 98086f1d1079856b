#!/usr/bin/env python
"""The matmuls of one fixed-length training step, timed alone: a ceiling on the step's tokens/s.

``trainer_step.py --mode fixed`` steps (``--batch`` sequences of ``--prompt-len`` +
``--completion-len`` tokens, ``--micro-batch`` per pass) run every decoder layer's seven
projections forward and backward, and the LM head on the completion tokens. This script times
each of those matrix products once per shape on the GPU (bf16, ``torch.mm`` on the layouts the
autograd engine uses, 20 calls replayed as one CUDA graph between CUDA events, the median of
``--reps``), with the causal FlashAttention of a pass (``scaled_dot_product_attention``, forward
and backward) beside them, and sums them over the layers and passes of one step:

* forward ``Y = X W^T`` ``[T, K] x [K, N]`` for each projection (``T`` = tokens of a pass),
* backward ``dX = dY W`` and, with full weights, ``dW = dY^T X``; with LoRA (``--lora``, rank
  ``--lora-rank`` on all seven projections) the frozen weights get no ``dW`` and each adapter adds
  its four small products forward and backward (``X A^T``, ``(X A^T) B^T`` and their gradients),
* the LM head on the completion tokens of the pass (``--completion-len`` per sequence): its
  forward and ``dH`` always, ``dW`` with full weights (a tied embedding is trained with them).

The sum is what the step costs when nothing but those kernels runs, back to back, each at the
speed cuBLAS reaches on its shape: the step's tokens/s cannot exceed ``tokens / sum``. Element-
wise work (norms, SiLU, RoPE, the loss), the optimizer and any idle time come on top. Used for
issue 29: whether 1.3x over TRL's measured tokens/s on Llama-1.2B full weights is within reach.

Usage (GPU): ``python benchmarks/gemm_ceiling.py --model-config llama-1b [--lora] [--json F]``;
on a CPU it runs float32 with ``--reps 1`` as a smoke check of the shapes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_step import MODEL_CONFIGS, PEAK_FLOPS  # noqa: E402


def products(cfg: dict, tokens: int, head_tokens: int, lora_rank: int | None) -> list[tuple[str, int, int, int]]:
    """``(name, M, K, N)`` of one pass's matrix products (``[M, K] x [K, N]``): one decoder layer's,
    then the LM head's (names starting with ``head``)."""
    H, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = H // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    projections = [("q", H, q), ("k", H, kv), ("v", H, kv), ("o", q, H), ("gate", H, inter), ("up", H, inter), ("down", inter, H)]
    out = []
    for name, k, n in projections:
        out += [(f"{name} fwd", tokens, k, n), (f"{name} dX", tokens, n, k)]
        if lora_rank is None:
            out.append((f"{name} dW", n, tokens, k))
        else:  # X A^T, (X A^T) B^T; backward: dB = dY^T (X A^T), d(XA^T) = dY B, dA = d(XA^T)^T X, dX += d(XA^T) A
            r = lora_rank
            out += [(f"{name} lora XA", tokens, k, r), (f"{name} lora XAB", tokens, r, n),
                    (f"{name} lora dB", n, tokens, r), (f"{name} lora dXA", tokens, n, r),
                    (f"{name} lora dA", r, tokens, k), (f"{name} lora dX", tokens, r, k)]
    V = cfg["vocab_size"]
    out += [("head fwd", head_tokens, H, V), ("head dH", head_tokens, V, H)]
    if lora_rank is None:
        out.append(("head dW", V, head_tokens, H))
    return out


def time_mm(m: int, k: int, n: int, dtype, device, reps: int) -> float:
    """Seconds of one ``[m, k] x [k, n]`` product (median of ``reps`` timed after 3 untimed)."""
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    return timed(lambda: torch.mm(a, b), device, reps)


def timed(fn, device, reps: int, calls: int = 20) -> float:
    """Seconds of one ``fn()``: the median of ``reps`` timings after 3 untimed calls. On a GPU each
    timing is ``calls`` calls recorded as one CUDA graph and replayed between two CUDA events, /
    ``calls``: the kernels back to back with no launch between them, as the trainer's recorded
    layers run them (timed one launch at a time, a rank-16 LoRA product read ~34 us on an H200,
    the launch's latency, not the kernel's). Where ``fn`` cannot be recorded the
    ``calls`` run back to back from the host instead."""
    for _ in range(3 if reps > 1 else 0):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    run = graphed(fn, calls)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return sorted(times)[len(times) // 2]


def graphed(fn, calls: int):
    """``calls`` of ``fn`` as one CUDA graph's replay, or (when recording fails) as a host loop."""
    try:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        return graph.replay
    except RuntimeError as exc:
        print(f"  (not recorded as a CUDA graph: {str(exc).splitlines()[0][:100]}; timed from the host)", flush=True)
        torch.cuda.synchronize()

        def loop():
            for _ in range(calls):
                fn()
        return loop


def time_attention(cfg: dict, seqs: int, length: int, dtype, device, reps: int) -> float:
    """Seconds of one pass's causal attention, forward and backward, over ``seqs`` sequences of
    ``length`` tokens (``scaled_dot_product_attention``: FlashAttention on a GPU)."""
    heads, d = cfg["num_attention_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    q, k, v = (torch.randn(seqs, heads, length, d, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(seqs, heads, length, d, dtype=dtype, device=device)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), grad)
    return timed(step, device, reps)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-config", choices=sorted(MODEL_CONFIGS), default="llama-1b")
    p.add_argument("--batch", type=int, default=64, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per pass")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--completion-len", type=int, default=256)
    p.add_argument("--lora", action="store_true", help="LoRA on all seven projections: no dW of frozen weights")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--step-s", type=float, default=None, help="a measured step's seconds, to print beside the sum")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    reps = args.reps if device.type == "cuda" else 1
    cfg = MODEL_CONFIGS[args.model_config]
    length = args.prompt_len + args.completion_len
    tokens, passes = args.micro_batch * length, args.batch // args.micro_batch
    shapes = products(cfg, tokens, args.micro_batch * args.completion_len, args.lora_rank if args.lora else None)
    layers = cfg["num_hidden_layers"]
    rows, total_s, total_flop = [], 0.0, 0.0
    for name, m, k, n in shapes:
        s = time_mm(m, k, n, dtype, device, reps)
        per_step = (1 if name.startswith("head") else layers) * passes
        rows.append({"product": name, "m": m, "k": k, "n": n, "s": s, "tflops": 2 * m * k * n / s / 1e12,
                     "per_step": per_step})
        total_s += s * per_step
        total_flop += 2 * m * k * n * per_step
    attention_s = time_attention(cfg, args.micro_batch, length, dtype, device, reps) * layers * passes
    step_tokens = args.batch * length
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = next((v for key, v in PEAK_FLOPS.items() if key in name), None)
    result = {
        "device": name, "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "model_config": args.model_config, "lora": args.lora, "tokens_per_step": step_tokens, "passes": passes,
        "matmul_s": total_s, "matmul_tflops": total_flop / total_s / 1e12, "attention_s": attention_s,
        "ceiling_tokens_per_s": step_tokens / (total_s + attention_s), "products": rows,
    }
    print(f"{args.model_config} {'LoRA' if args.lora else 'full'}, {args.batch} x ({args.prompt_len} + "
          f"{args.completion_len}) tokens, {passes} passes of {tokens} tokens, on {name}:")
    for r in rows:
        print(f"  {r['product']:<16} [{r['m']}, {r['k']}] x [{r['k']}, {r['n']}]: {r['s'] * 1e6:8.1f} us "
              f"({r['tflops']:6.1f} TFLOP/s) x {r['per_step']}")
    print(f"matmuls {total_s:.4f} s per step at {result['matmul_tflops']:.0f} TFLOP/s"
          + (f" ({result['matmul_tflops'] * 1e12 / peak:.0%} of peak)" if peak else "")
          + f"; attention {attention_s:.4f} s; ceiling {result['ceiling_tokens_per_s']:,.0f} tokens/s")
    if args.step_s:
        print(f"a measured step of {args.step_s:.4f} s: {args.step_s - total_s - attention_s:.4f} s beyond them")
        result["step_s"] = args.step_s
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
