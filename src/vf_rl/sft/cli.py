"""vf-sft: supervised warm-up, written as a vf-rl config is.

    vf-sft @ sft.toml

What it does, the file's keys and the exit statuses are its help (``USAGE``, ``DESCRIPTION``,
``EPILOG``; ``vf-sft --help``); the training itself is ``vf_rl.sft.train``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from vf_rl.config.cli_help import CommandParser, parse_at_command
from vf_rl.config.schema import ConfigError, read_toml

EXIT_BAD_INPUT = 2

USAGE = """vf-sft @ sft.toml
       vf-sft -h | --help | --version"""

DESCRIPTION = """\
Fine-tune a model on prompt/completion rows before RL (a supervised warm-up), configured by a
TOML file written as a vf-rl config is, and write the result as a model directory that an RL
config then names as its model. The rows come from an environment's training split, its
prompts exactly as RL sends them and each row's answer in the format the environment's parser
reads, or from a file or dataset. The loss covers the completion tokens only; LoRA adapters are
merged into the base weights before the model is saved.

The file:

  model = "HuggingFaceTB/SmolLM2-135M-Instruct"   # hub id or local directory

  [env]                     # rows from an environment's training split
  id = "reverse-text"
  args = { few_shot = 0 }
  # or instead of [env]: [data] with path = "rows.jsonl" (or a dataset directory or a hub id)
  # and split = "train" (the default)

  [trainer.args]            # trl.SFTConfig's fields and vf-sft's own keys (below)
  output_dir = "outputs/sft-reverse-text"
  learning_rate = 2e-4

Then set model = "outputs/sft-reverse-text" in the RL config.

{own_keys}"""

EPILOG = """\
exit status: 0 done (the model directory's path is printed); 2 bad input (one line naming the
file and the key)."""


def build_parser() -> CommandParser:
    """The parser of ``vf-sft @ sft.toml``; its help is ``vf-sft --help`` (vf-sft has no options of its own)."""
    import textwrap

    from vf_rl.sft.train import OWN_KEYS

    shown = {**OWN_KEYS, "lora_target_modules": "unset (every attention and MLP projection)",
             "num_examples": "-1 (every row)"}
    own_keys = textwrap.fill("vf-sft's own keys of [trainer.args], with their defaults: " + ", ".join(
        f"{key} = {str(value).lower() if isinstance(value, bool) else value}" for key, value in shown.items()) + ".", 96)
    return CommandParser("vf-sft", usage=USAGE, description=DESCRIPTION.replace("{own_keys}", own_keys), epilog=EPILOG)


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
        config_path, _ = parse_at_command(build_parser(), argv)
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
