"""Weight-sync time per step for each transport, side by side (needs 2 GPUs).

vf-vllm serves the model on GPU 0 (with runtime LoRA loading); this process is the trainer on
GPU 1 (bf16). For each transport it times ``push`` (what ``sync_weights`` does each step: merge
LoRA / export or broadcast / reload in vLLM / reset the prefix cache) ``--repeats`` times after
one warm-up, and prints a markdown table with the ratio to ``filesystem``. The merged-weight
transports run against a plain server, ``lora`` against one started with ``--enable-lora``.

    python benchmarks/weight_sync.py --model /path/to/SmolLM2-135M-Instruct
    python benchmarks/weight_sync.py --random llama-1b --tokenizer /path/to/SmolLM2-135M-Instruct

``--random NAME`` builds a randomly initialised model of that shape (vocabulary of the given
tokenizer), saves it to a temporary directory and serves that: timing does not need trained
weights.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {  # hidden, layers, heads, kv heads, intermediate
    "llama-1b": (2048, 16, 32, 8, 8192),
    "qwen2-0.5b": (896, 24, 14, 2, 4864),
}


def random_model_dir(shape: str, tokenizer_dir: str, out: Path) -> str:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, inter = SHAPES[shape]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
                         tie_word_embeddings=True, max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def start_server(model: str, port: int, log: Path, lora: bool) -> subprocess.Popen:
    """vf-vllm on GPU 0; with runtime LoRA loading when ``lora`` (vLLM 0.26 cannot reload full
    weights into a LoRA-enabled server, so the merged-weight transports get a plain one)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    argv = [sys.executable, "-m", "vf_rl.inference.server", "--model", model, "--port", str(port), "--enforce-eager",
            "--max-model-len", "1024", "--gpu-memory-utilization", "0.4"]
    if lora:
        argv += ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "1"]
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory to serve and train")
    parser.add_argument("--random", choices=sorted(SHAPES), help="a random model of this shape instead")
    parser.add_argument("--tokenizer", help="tokenizer directory for --random")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=1024)
    parser.add_argument("--json", help="append the rows here (JSON lines)")
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        print("weight_sync.py: needs 2 GPUs", file=sys.stderr)
        return 2
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from vf_rl.inference.client import InferenceClient
    from vf_rl.inference.communicator import free_port
    from vf_rl.trainer.weight_sync import make_weight_sync

    work = Path(tempfile.mkdtemp(prefix="vf-rl-sync-bench-"))
    model_dir = args.model or random_model_dir(args.random, args.tokenizer, work / "model")
    device = torch.device("cuda:1")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    n_params = sum(p.numel() for p in base.parameters())
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device),
                          LoraConfig(r=16, lora_alpha=16, target_modules="all-linear"))
    groups = {False: [("filesystem", "full", base), ("nccl", "full", base), ("filesystem", "lora r16", lora),
                      ("nccl", "lora r16", lora)],
              True: [("lora", "lora r16", lora)]}
    rows = []
    for lora_server, cases in groups.items():
        port = free_port()
        server = start_server(model_dir, port, work / f"server-{lora_server}.log", lora_server)
        client = InferenceClient(port=port, timeout=600)
        try:
            client.wait_until_ready(600, poll=1.0)
            for transport, weights, model in cases:
                sync = make_weight_sync(transport, client, work / transport, device, bucket_mb=args.bucket_mb)
                times = []
                for i in range(args.repeats + 1):
                    torch.cuda.synchronize(device)
                    start = time.perf_counter()
                    sync.push(model)
                    if i:  # the first push warms up (allocations, NCCL channels, file cache)
                        times.append(time.perf_counter() - start)
                sync.close()
                rows.append({"transport": transport, "weights": weights, "mean_s": statistics.mean(times),
                             "min_s": min(times), "max_s": max(times)})
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
    name = args.random or Path(model_dir).name
    device_name = torch.cuda.get_device_name(1)
    print(f"\n### Weight sync per step: {name} ({n_params / 1e6:.0f}M params, bf16), {device_name} x2")
    print(f"{datetime.date.today()}; command: python {' '.join(sys.argv)}\n")
    print("| transport | weights sent | mean s | min s | max s | vs filesystem (same weights) |")
    print("|---|---|---|---|---|---|")
    reference = {r["weights"]: r["mean_s"] for r in rows if r["transport"] == "filesystem"}
    for r in rows:
        ratio = reference[r["weights"]] / r["mean_s"]
        print(f"| {r['transport']} | {r['weights']} | {r['mean_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | "
              f"{ratio:.2f}x faster |")
        r.update(model=name, params=n_params, device=device_name, speedup_vs_filesystem=ratio)
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
