"""Whether the decoder stack compiled as CUDA graphs (``mode="reduce-overhead"``, trainer_step.py's
vf-rl-stack-cudagraphs side, through its ``compile_stack``) accumulates gradients over micro batches as eager code does.

Replays of one CUDA graph write their outputs into the same static buffers, and a parameter's
``.grad`` from micro batch 1 may be such a buffer when micro batch 2 replays the backward graph; the
benchmark's gradient check looks at micro batch 0 alone, so it cannot see that. Here a small
Qwen2-shaped model with LoRA (float32, fixed shapes) runs N micro batches forward and backward, the
gradients accumulated, eager and compiled, and the relative L2 difference of the accumulated
gradients is printed and must stay under ``--tol``. On the CPU inductor skips CUDA graphs (the check
then covers the stack region alone, and that every trainable parameter has a ``.grad`` before
each backward, which keeps autograd from taking a replayed graph's output buffer as the gradient).

    python scripts/gpu/cudagraph_accum_check.py [--micro-batches 4] [--tol 1e-4]
Exit code 1 when the difference is above ``--tol``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from trainer_step import compile_stack  # noqa: E402  (the benchmark sides' own setup)
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--tol", type=float, default=1e-4)
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                          "up_proj", "down_proj"], init_lora_weights=False)
    eager = get_peft_model(Qwen2ForCausalLM(config), lora).to(device)
    graphs = copy.deepcopy(eager)
    compile_stack(graphs, cuda_graphs=True)
    batches = [torch.randint(0, 512, (4, 64), device=device) for _ in range(a.micro_batches)]
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
                    return 1
                (logits.float().log_softmax(-1).mean() / len(batches)).backward()
            accumulated.append(torch.cat([q.grad.flatten() for q in model.parameters() if q.grad is not None]))
        diff = ((accumulated[1] - accumulated[0]).norm() / accumulated[0].norm()).item()
        print(f"step {step}: {len(batches)} micro batches on {device}, relative L2 difference of the accumulated "
              f"gradients {diff:.3e}", flush=True)
        if not diff <= a.tol:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
