"""vf-sft: supervised warm-up, written as a vf-rl config is.

    vf-sft @ sft.toml

The file::

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"   # hub id or local directory
    [env]                     # rows from an environment's training split (prompts as RL sends them)
    id = "reverse-text"
    args = { few_shot = 0 }
    # or: [data] path = "rows.jsonl" (or a dataset directory or hub id), split = "train"
    [trainer.args]            # trl.SFTConfig fields, and use_lora, lora_rank, lora_alpha,
    output_dir = "outputs/sft-reverse-text"   # lora_dropout, lora_target_modules, max_seq_len, num_examples
    learning_rate = 2e-4

writes a merged model directory at ``output_dir``; an RL config then sets ``model`` to it
(``vf_rl.sft.train``). Exit status: 0 done; 2 bad input (one line naming the file and key).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from vf_rl.config.schema import ConfigError, parse_at_args, read_toml

EXIT_BAD_INPUT = 2


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvTable(_Section):
    id: str
    args: dict = {}


class DataTable(_Section):
    path: str
    split: str = "train"


class TrainerTable(_Section):
    args: dict = {}


class SftFile(_Section):
    model: str
    env: EnvTable | None = None
    data: DataTable | None = None
    trainer: TrainerTable = TrainerTable()


def load_sft_config(path: Path) -> SftFile:
    """Read and validate an SFT TOML file.

    Raises:
        ConfigError: one line naming the file and the key."""
    try:
        config = SftFile.model_validate(read_toml(path))
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(part) for part in err["loc"]) or "(top level)"
        what = {"missing": "required key is missing", "extra_forbidden": "unknown key"}.get(err["type"], err["msg"])
        raise ConfigError(f"{path}: {key}: {what}") from None
    looks_local = config.model.startswith((".", "/", "~")) or config.model.count("/") != 1
    if looks_local and not Path(config.model).expanduser().exists():
        raise ConfigError(f"{path}: model: local model directory '{config.model}' does not exist")
    config.model = str(Path(config.model).expanduser()) if looks_local else config.model
    return config


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config_path, rest = parse_at_args(argv, "vf-sft")
        if rest:
            raise ConfigError(f"unknown options {' '.join(rest)} (usage: vf-sft @ config.toml)")
        config = load_sft_config(config_path)
        from vf_rl.sft.train import load_rows, split_args, train_sft

        split_args(config.trainer.args)  # unknown keys before the rows and the model load
        rows = load_rows(config.data.model_dump() if config.data else None,
                         config.env.model_dump() if config.env else None)
    except ConfigError as exc:
        print(f"vf-sft: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"vf-sft: {len(rows)} rows, model {config.model}", flush=True)
    try:
        out = train_sft(config.model, rows, config.trainer.args)
    except ConfigError as exc:
        print(f"vf-sft: error: {config_path}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"vf-sft: model written to {out} (set model = \"{out}\" in the RL config)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
