"""Write a random-weight model directory that vLLM and the trainer load like a real checkpoint: the layers
of a named config (benchmarks/trainer_step.py's MODEL_CONFIGS, e.g. llama-3.1-8b) with a tokenizer's vocabulary
(the GPU machines have no hub access and no 8B checkpoint; timings and memory do not depend on the values).
With --pad-vocab the model keeps the config's own vocabulary (the real shape's embedding and LM head, e.g.
Qwen3's 151,936 rows) and the tokenizer is padded to it with placeholder tokens (``<|vocab_pad_N|>``, which no
text tokenizes to and which decode to their own names), so that every token the model samples decodes.

usage: python scripts/gpu/make_random_model.py --config llama-3.1-8b --tokenizer /tmp/smol --out /tmp/llama8b
       python scripts/gpu/make_random_model.py --config qwen3-1.7b --tokenizer /tmp/smol --pad-vocab --out /tmp/q17
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parents[2]


def trainer_step_module():
    """benchmarks/trainer_step.py (MODEL_CONFIGS, CONFIG_CLASSES; that module imports benchmarks/learning.py)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("trainer_step", REPO / "benchmarks" / "trainer_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pad_vocabulary(tokenizer_json: Path, size: int) -> int:
    """Pads the BPE vocabulary of ``tokenizer_json`` (a ``tokenizers`` file, rewritten in place) with
    placeholder tokens ``<|vocab_pad_N|>`` up to ``size`` ids: no merge produces them, so no text
    tokenizes to them, and they decode to their names (printable ASCII, which byte-level decoding keeps).
    Returns how many were added.

    Raises:
        ValueError: not a BPE tokenizer, or its vocabulary is already larger than ``size``."""
    data = json.loads(tokenizer_json.read_text())
    vocab = data["model"].get("vocab")
    if data["model"].get("type") != "BPE" or not isinstance(vocab, dict):
        raise ValueError(f"{tokenizer_json}: --pad-vocab needs a BPE tokenizer")
    taken = set(vocab.values()) | {t["id"] for t in data.get("added_tokens", [])}
    if max(taken) + 1 > size:
        raise ValueError(f"{tokenizer_json}: its {max(taken) + 1} ids do not fit a vocabulary of {size}")
    added = 0
    for token_id in range(size):
        if token_id not in taken:
            vocab[f"<|vocab_pad_{token_id}|>"] = token_id
            added += 1
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False))
    return added


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a name of benchmarks/trainer_step.py's MODEL_CONFIGS")
    p.add_argument("--tokenizer", required=True, help="a model directory whose tokenizer (and vocabulary) to use")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-len", type=int, default=32768, help="max_position_embeddings")
    p.add_argument("--pad-vocab", action="store_true", help="keep the config's vocabulary size and pad the tokenizer "
                   "to it with placeholder tokens (default: the model takes the tokenizer's vocabulary)")
    opts = p.parse_args(argv)
    module = trainer_step_module()
    configs = module.MODEL_CONFIGS
    if opts.config not in configs:
        p.error(f"--config: one of {', '.join(sorted(configs))}")
    spec = dict(configs[opts.config])
    arch = spec.pop("arch")
    tokenizer = AutoTokenizer.from_pretrained(opts.tokenizer)
    if not opts.pad_vocab:
        spec["vocab_size"] = len(tokenizer)  # every token the model samples decodes
    elif spec["vocab_size"] < len(tokenizer):
        p.error(f"--pad-vocab: the tokenizer's {len(tokenizer)} tokens exceed {opts.config}'s {spec['vocab_size']}")
    eos = tokenizer.eos_token_id
    config = module.CONFIG_CLASSES[arch](
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
    if opts.pad_vocab:
        padded = pad_vocabulary(opts.out / "tokenizer.json", config.vocab_size)
        if len(AutoTokenizer.from_pretrained(opts.out)) != config.vocab_size:
            raise SystemExit(f"{opts.out}: the padded tokenizer does not have {config.vocab_size} tokens")
        print(f"{opts.out}: tokenizer padded with {padded} placeholder tokens")
    for name in ("chat_template.jinja", "generation_config.json"):
        if (Path(opts.tokenizer) / name).exists() and not (opts.out / name).exists():
            (opts.out / name).write_bytes((Path(opts.tokenizer) / name).read_bytes())
    print(f"{opts.out}: {opts.config} layers, vocabulary {config.vocab_size}, {params / 1e9:.2f} B parameters, "
          f"written in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
