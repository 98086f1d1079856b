"""Write a random-weight model directory that vLLM and the trainer load like a real checkpoint: the layers
of a named config (benchmarks/trainer_step.py's MODEL_CONFIGS, e.g. llama-3.1-8b) with a tokenizer's vocabulary
(the GPU machines have no hub access and no 8B checkpoint; timings and memory do not depend on the values).

usage: python scripts/gpu/make_random_model.py --config llama-3.1-8b --tokenizer /tmp/smol --out /tmp/llama8b
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config

REPO = Path(__file__).resolve().parents[2]


def model_configs() -> dict:
    """benchmarks/trainer_step.py's MODEL_CONFIGS (that module imports benchmarks/learning.py)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("trainer_step", REPO / "benchmarks" / "trainer_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.MODEL_CONFIGS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a name of benchmarks/trainer_step.py's MODEL_CONFIGS")
    p.add_argument("--tokenizer", required=True, help="a model directory whose tokenizer (and vocabulary) to use")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-len", type=int, default=32768, help="max_position_embeddings")
    opts = p.parse_args(argv)
    configs = model_configs()
    if opts.config not in configs:
        p.error(f"--config: one of {', '.join(sorted(configs))}")
    spec = dict(configs[opts.config])
    arch = spec.pop("arch")
    tokenizer = AutoTokenizer.from_pretrained(opts.tokenizer)
    spec["vocab_size"] = len(tokenizer)  # every token the model samples decodes
    eos = tokenizer.eos_token_id
    config = (Qwen2Config if arch == "qwen2" else LlamaConfig)(
        **spec, max_position_embeddings=opts.max_len, eos_token_id=eos, bos_token_id=tokenizer.bos_token_id or eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = sum(t.numel() for t in model.parameters())
    opts.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(opts.out)
    tokenizer.save_pretrained(opts.out)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (Path(opts.tokenizer) / name).exists() and not (opts.out / name).exists():
            (opts.out / name).write_bytes((Path(opts.tokenizer) / name).read_bytes())
    print(f"{opts.out}: {opts.config} layers, vocabulary {config.vocab_size}, {params / 1e9:.2f} B parameters, "
          f"written in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
