"""Whether the decoder stack compiled as CUDA graphs (``torch_compile_mode = "reduce-overhead"``,
``vf_rl.trainer.model.compile_stack``) trains as code without them does.

1. Accumulation: replays of one CUDA graph write their outputs into the same static buffers, and a
   parameter's ``.grad`` from micro batch 1 may be such a buffer when micro batch 2 replays the
   backward graph (pytorch/pytorch#169545). A small Qwen2-shaped model with LoRA (float32, plain
   rows of one shape) runs N micro batches forward and backward, the gradients accumulated, eager
   and as CUDA graphs; the relative L2 difference of the accumulated gradients must stay under
   ``--tol``.
2. Layouts: packed micro batches whose samples differ in number and length, padded to one shape
   (``packing.pad_to_buckets``, what the trainer does with CUDA graphs), so that one recorded graph
   replays with each micro batch's own layout (segment bounds, gathered keys) as its inputs. The
   trainer's log-probs (``logprobs.packed_policy_logprobs``) and accumulated gradients as CUDA graphs
   against the same stack compiled without them (bf16 on a GPU, FlashAttention varlen), relative L2
   difference under ``--layout-tol``: a layout baked into the graph would show here.
3. Sizes: packed micro batches padded to three different shapes (row length, segment count,
   gathered keys), one after the other in every step, on a freshly compiled stack: the first
   compiles with those sizes dynamic (``model._mark_row_sizes``; the trainer's warm-up does it
   before step 1, ``warmup.py``), and steps 1-2 compile nothing more (dynamo's
   ``unique_graphs``) and replay.
   Log-probs and accumulated gradients as CUDA graphs against the same stack without them, under
   ``--layout-tol``.

On the CPU inductor skips CUDA graphs (the check then covers the compiled stack, the padding, and
that every trainable parameter has a ``.grad`` before each backward).

    python scripts/gpu/cudagraph_accum_check.py [--micro-batches 4] [--tol 1e-4] [--layout-tol 1e-2]
    [--parts accumulation,layouts,sizes]
Exit code 1 when a difference is above its tolerance.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
from peft import LoraConfig, get_peft_model
from torch._dynamo.utils import counters
from transformers import Qwen2Config, Qwen2ForCausalLM

from vf_rl.orchestrator.samples import Sample
from vf_rl.trainer.model import compile_stack
from vf_rl.trainer.speed.attention import register_attention
from vf_rl.trainer.speed.logprobs import packed_policy_logprobs
from vf_rl.trainer.speed.packing import micro_batches_to, packed_micro_batch, pad_to_buckets

CONFIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=512)
LORA = dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj"], init_lora_weights=False)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([q.grad.flatten().float() for q in model.parameters() if q.grad is not None])


def accumulation(device: str, micro_batches: int, tol: float) -> bool:
    torch.manual_seed(0)
    eager = get_peft_model(Qwen2ForCausalLM(Qwen2Config(**CONFIG)), LoraConfig(**LORA)).to(device)
    graphs = copy.deepcopy(eager)
    compile_stack(graphs, mode="reduce-overhead")
    batches = [torch.randint(0, 512, (4, 64), device=device) for _ in range(micro_batches)]
    for step in range(3):  # the first replays record; later steps replay
        accumulated = []
        for model in (eager, graphs):
            model.zero_grad(set_to_none=True)
            for ids in batches:
                logits = model(input_ids=ids, use_cache=False).logits
                if model is graphs and any(q.grad is None for q in model.parameters() if q.requires_grad):
                    # on the CPU the graphs are not replayed, so this is the part of the fix the CPU can see
                    print("a trainable parameter has no .grad before the backward: autograd would take the "
                          "backward graph's output buffer as its .grad (pytorch/pytorch#169545)", flush=True)
                    return False
                (logits.float().log_softmax(-1).mean() / len(batches)).backward()
            accumulated.append(grads(model))
        diff = relative(accumulated[1], accumulated[0])
        print(f"step {step}: {len(batches)} micro batches on {device}, relative L2 difference of the accumulated "
              f"gradients {diff:.3e}", flush=True)
        if not diff <= tol:
            return False
    return True


def packed_batches(count: int, sizes: bool = False) -> list:
    """``count`` (at most 5) packed micro batches of two groups each, lengths differing: with
    prompt lengths summing to 30 (the gathered keys match) padded to one bucket shape, or with
    ``sizes`` two groups more per micro batch and longer completions each time, padded to a budget
    doubling each time (three micro batches: three shapes)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(count):
        samples = []
        p1 = 8 + 4 * i
        groups = [(p1, [20 + 7 * i, 31 - 5 * i]), (30 - p1, [9 + 3 * i, 40])]
        if sizes:
            groups = groups[:1] + [(5 + j, [12 * (i + 1), 3 + j]) for j in range(2 * i)]
        for group, (prompt, completions) in enumerate(groups):
            ids = torch.randint(3, 512, (prompt,), generator=g).tolist()
            for c in completions:
                full = ids + torch.randint(3, 512, (c,), generator=g).tolist()
                samples.append(Sample(full, [0] * prompt + [1] * c, [0.0] * len(full), 1.0 - 2 * (group % 2),
                                      group=group, prompt_len=prompt))
        budget = 128 << i if sizes else 256
        out.append(pad_to_buckets(packed_micro_batch(samples, share_prompts=True), pad_token_id=0, token_budget=budget))
    return out


def layouts(device: str, micro_batches: int, tol: float, sizes: bool = False) -> bool:
    """Part 2 (one shape, ``micro_batches`` layouts) or, with ``sizes``, part 3 (three shapes)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(**CONFIG))
    base.set_attn_implementation(register_attention())
    plain = get_peft_model(base, LoraConfig(**LORA)).to(device, dtype)
    graphs = copy.deepcopy(plain)
    compile_stack(plain)
    compile_stack(graphs, mode="reduce-overhead")
    batches = packed_batches(3 if sizes else micro_batches, sizes)
    shapes = [(mb.input_ids.shape[1], mb.layout.cu_q.shape[0], mb.layout.key_index.shape[0]) for mb in batches]
    bounds = {tuple(mb.layout.cu_q.tolist()) for mb in batches}
    if len(set(shapes)) != (3 if sizes else 1) or len(bounds) != len(batches) or (
            sizes and any(len(set(dim)) != 3 for dim in zip(*shapes))):
        print(f"the micro batches should have {'three shapes' if sizes else 'one shape'} and layouts of their own: "
              f"{shapes}, {len(bounds)} layouts")
        return False
    what = f"packed micro batches of shapes (N, S + 1, K) {shapes}" if sizes else \
        f"{len(batches)} packed micro batches of one shape (N, S + 1, K) {shapes[0]}"
    for step in range(3):
        if step == 1:
            compiled = counters["stats"]["unique_graphs"]
        results = []
        for model in (plain, graphs):
            model.zero_grad(set_to_none=True)
            logprobs = []
            for mb in batches:
                lp, _ = packed_policy_logprobs(model, micro_batches_to([mb], device)[0])
                (lp.float() * mb.advantages.to(device)[:, None]).sum().backward()
                logprobs.append(lp.detach().float().flatten())
            results.append((torch.cat(logprobs), grads(model)))
        lp_diff, grad_diff = relative(results[1][0], results[0][0]), relative(results[1][1], results[0][1])
        print(f"step {step}: {what} on {device} ({dtype}), CUDA graphs against the same stack without: relative L2 "
              f"difference of the log-probs {lp_diff:.3e}, of the accumulated gradients {grad_diff:.3e}", flush=True)
        if not (lp_diff <= tol and grad_diff <= tol):
            return False
    if sizes and counters["stats"]["unique_graphs"] != compiled:
        print(f"steps 1-2 compiled {counters['stats']['unique_graphs'] - compiled} graph(s) more, after step 0 had "
              "run every shape", flush=True)
        return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--layout-tol", type=float, default=1e-2)
    p.add_argument("--parts", default="accumulation,layouts,sizes", help="comma list of the parts to run, in order")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    parts = {"accumulation": lambda: accumulation(device, a.micro_batches, a.tol),
             "layouts": lambda: layouts(device, min(max(a.micro_batches, 2), 5), a.layout_tol),
             "sizes": lambda: layouts(device, 3, a.layout_tol, sizes=True)}
    for part in a.parts.split(","):
        if not parts[part]():
            print(f"{part}: failed", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
