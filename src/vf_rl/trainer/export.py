"""``vf-rl export RUN_DIR|CHECKPOINT OUT_DIR``: a run's policy as a standalone model directory.

A checkpoint (``checkpoint-<step>``, written by ``checkpoints.CheckpointingTrainer``) holds either
a LoRA adapter (``adapter_config.json``, ``adapter_model.safetensors``) or full weights
(``config.json``, ``model.safetensors``), beside the optimizer state and the tokenizer. The export
is what transformers' ``from_pretrained``, ``vf-vllm --model`` and ``vf-rl eval -m`` load:

- LoRA: the run's base model (``model`` of ``<run>/resolved.toml``) loaded in float32, the adapter
  loaded onto it with peft and merged (``merge_and_unload``: ``W + B A * scaling`` for every adapted
  weight), then cast to the base model's dtype;
- full weights: the checkpoint's weights, cast to the base model's dtype;

with the tokenizer (the checkpoint's, else the base model's) and the base model's generation
config. The directory is written under a temporary name beside ``OUT_DIR`` and renamed when
complete, so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

PROG = "vf-rl export"
EXIT_BAD_INPUT = 2
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


class ExportError(ValueError):
    """Bad input to the export: its message is one line naming the path and what was expected."""


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint directory: a LoRA adapter or a model's weights with their config."""
    return (path / "adapter_config.json").is_file() or (path / "config.json").is_file()


def last_checkpoint(run_dir: Path) -> Path | None:
    """The run's ``checkpoint-<step>`` of the highest step, or ``None`` when it has none.

    Every ``checkpoint-<step>`` directory in a run is complete: ``CheckpointingTrainer`` writes
    one under ``.tmp-checkpoint-<step>/`` and renames it when it is whole."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).iterdir() if p.is_dir() and (m := CHECKPOINT_NAME.match(p.name))
             and is_checkpoint(p)] if Path(run_dir).is_dir() else []
    return max(found)[1] if found else None


def find_checkpoint(source: Path) -> Path:
    """The checkpoint ``source`` names: itself when it is a checkpoint, else a run directory's last one.

    Raises:
        ExportError: ``source`` is not a directory, or holds no checkpoint.
    """
    if not source.is_dir():
        raise ExportError(f"{source}: no such directory (expected a run's output_dir or one of its checkpoint-<step>)")
    if is_checkpoint(source):
        return source
    checkpoint = last_checkpoint(source)
    if checkpoint is None:
        raise ExportError(f"{source}: no checkpoint-<step> directory with a LoRA adapter or model weights in it "
                          "(a run saves one every save_steps and at its last step)")
    return checkpoint


WEIGHT_FILES = {"lora": ("adapter_model.safetensors", "adapter_model.bin"),
                "full": ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                         "pytorch_model.bin.index.json")}


def checkpoint_kind(checkpoint: Path) -> str:
    """``"lora"`` (an adapter) or ``"full"`` (a model's weights).

    Raises:
        ExportError: the checkpoint holds no weights file (a DeepSpeed ZeRO-3 checkpoint saved without
            ``stage3_gather_16bit_weights_on_model_save`` keeps only its shards).
    """
    kind = "lora" if (checkpoint / "adapter_config.json").is_file() else "full"
    if not any((checkpoint / name).is_file() for name in WEIGHT_FILES[kind]):
        raise ExportError(f"{checkpoint}: no weights file ({', '.join(WEIGHT_FILES[kind])}); a DeepSpeed ZeRO-3 "
                          "checkpoint needs stage3_gather_16bit_weights_on_model_save = true in its DeepSpeed config")
    return kind


def base_model(checkpoint: Path) -> str:
    """The base model of the run that wrote ``checkpoint``: ``model`` of ``resolved.toml`` in the
    run directory (the checkpoint's parent), which ``vf-rl``, ``vf-train`` and a run from Python
    (``RLTrainer``) all write.

    Raises:
        ExportError: no readable ``resolved.toml`` with a ``model`` there, or a local model directory that is gone.
    """
    from vf_rl.config.schema import ConfigError, read_toml

    path = checkpoint.parent / "resolved.toml"
    try:
        model = read_toml(path).get("model")
    except ConfigError as exc:
        raise ExportError(f"{exc} (the run's resolved.toml names its base model; or pass --base-model)") from None
    if not isinstance(model, str):
        raise ExportError(f"{path}: no 'model' key (expected the run's base model; or pass --base-model)")
    return model


def _check_base(model: str) -> None:
    """A base model that looks like a local path must exist (a hub id is left to transformers)."""
    looks_local = model.startswith((".", "/", "~")) or model.count("/") != 1
    if looks_local and not Path(model).expanduser().is_dir():
        raise ExportError(f"base model: local model directory '{model}' does not exist")


def _check_out(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"{out_dir}: exists and is not an empty directory (expected a new directory for the model)")


def load_policy(checkpoint: Path, base: str):
    """The checkpoint's policy as a plain transformers model in the base model's dtype.

    Args:
        checkpoint: a ``checkpoint-<step>`` directory (a LoRA adapter or full weights).
        base: the base model (hub id or local directory).
    Returns:
        ``(model, kind)``: a ``PreTrainedModel`` on the CPU, its weights in the dtype of ``base``'s
        config (float32 where it names none), and ``"lora"`` or ``"full"``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    base_config = AutoConfig.from_pretrained(base)
    dtype = getattr(base_config, "dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if (checkpoint / "adapter_config.json").is_file():
        from peft import PeftModel

        # merged in float32, then cast once: W + delta rounded one time, as the weight sync sends it
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, str(checkpoint)).merge_and_unload()
        kind = "lora"
    else:
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
        kind = "full"
    model = model.to(dtype)
    model.config.dtype = dtype
    model.config.use_cache = getattr(base_config, "use_cache", True)  # training turns it off with gradient checkpointing
    return model, kind


def _tokenizer_and_generation(checkpoint: Path, base: str):
    from transformers import AutoTokenizer, GenerationConfig

    source = str(checkpoint) if (checkpoint / "tokenizer_config.json").is_file() else base
    tokenizer = AutoTokenizer.from_pretrained(source)
    try:
        generation = GenerationConfig.from_pretrained(base)
    except OSError:  # a base model without generation_config.json: transformers' defaults from the config
        generation = None
    return tokenizer, generation


def export(source: Path, out_dir: Path, base: str | None = None) -> tuple[Path, Path, str]:
    """Write the policy of ``source`` (a run directory: its last checkpoint; or a checkpoint) to
    ``out_dir`` as a standalone model directory (config, safetensors weights, generation config,
    tokenizer), atomically: written to ``.<name>.tmp-<pid>`` beside ``out_dir`` and renamed.

    Args:
        source: a run's output directory or one of its ``checkpoint-<step>`` directories.
        out_dir: the model directory to create (absent or empty).
        base: the base model; default ``model`` of the run's ``resolved.toml``.
    Returns:
        ``(out_dir, checkpoint, kind)``; ``kind`` is ``"lora"`` (merged) or ``"full"``.
    Raises:
        ExportError: bad input (one line): no such directory, no checkpoint (or one without weights), no base
            model, ``out_dir`` not empty.
    """
    source, out_dir = Path(source).expanduser(), Path(out_dir).expanduser()
    checkpoint = find_checkpoint(source)
    checkpoint_kind(checkpoint)
    _check_out(out_dir)
    base = base or base_model(checkpoint)
    _check_base(base)
    base = str(Path(base).expanduser()) if base.startswith("~") else base
    model, kind = load_policy(checkpoint, base)
    tokenizer, generation = _tokenizer_and_generation(checkpoint, base)
    if generation is not None:
        model.generation_config = generation
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, out_dir)  # an empty out_dir is replaced; a non-empty one was refused above
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir, checkpoint, kind


USAGE = """vf-rl export RUN_DIR|CHECKPOINT OUT_DIR [--base-model MODEL]
       vf-rl export -h | --help | --version"""

DESCRIPTION = """\
Write a run's policy as a standalone model directory that transformers loads
(AutoModelForCausalLM.from_pretrained(OUT_DIR)), vf-vllm serves (vf-vllm --model OUT_DIR) and
vf-rl eval evaluates (vf-rl eval ENV -m OUT_DIR --serve).

The policy is the last checkpoint of RUN_DIR (its checkpoint-<step> of the highest step), or the
checkpoint named. A LoRA checkpoint is merged into the run's base model (model in
RUN_DIR/resolved.toml); a full-weights checkpoint is written as it is. The weights keep the base
model's dtype; the tokenizer and the base model's generation config are written beside them.
OUT_DIR is written under a temporary name beside it and renamed when complete, so a failed export
leaves nothing behind."""

EPILOG = """\
examples:
  vf-rl export outputs/reverse-text outputs/reverse-text/model
  vf-rl export outputs/reverse-text/checkpoint-20 models/reverse-text-step20

exit status: 0 done (OUT_DIR is printed last); 2 bad input (one line): RUN_DIR or CHECKPOINT
missing, no checkpoint in RUN_DIR, no base model, OUT_DIR exists and is not empty."""


def build_parser():
    """The parser of ``vf-rl export``; its help is ``vf-rl export --help``."""
    from vf_rl.config.cli_help import CommandParser

    parser = CommandParser(PROG, usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("source", type=Path, metavar="RUN_DIR|CHECKPOINT",
                        help="A run's output directory (its last checkpoint is exported) or one checkpoint-<step> "
                             "directory of it.")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR",
                        help="The model directory to write; it must not exist, or be empty.")
    parser.add_argument("--base-model", default=None, metavar="MODEL",
                        help="The base model a LoRA checkpoint is merged into, a hub id or local directory "
                             "(default: model in the run's resolved.toml).")
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    # its result lines, without loading bars (read when transformers is first imported)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        out_dir, checkpoint, kind = export(opts.source, opts.out_dir, opts.base_model)
    except ExportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    what = "LoRA adapter merged into its base model" if kind == "lora" else "full weights"
    print(f"{PROG}: {checkpoint} ({what}) -> {out_dir}")
    print(f"  load:     AutoModelForCausalLM.from_pretrained({str(out_dir)!r})")
    print(f"  serve:    vf-vllm --model {out_dir}")
    print(f"  evaluate: vf-rl eval ENV_ID -m {out_dir} --serve")
    print(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
