"""The vf-rl TOML file: its schema and loading. Light: no torch, no transformers.

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"   # hub id or local directory
    [env]               id = "reverse-text"          [env.args]       ... kwargs of load_environment
    [inference]         gpus = 1                     [inference.args] ... vf-vllm / vllm serve flags
    [trainer]           gpus = 1                     [trainer.args]   ... RLConfig fields
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, TypeAdapter, ValidationError, field_validator

from .fields import MISSING, annotation_type, scheduler_types, trainer_fields

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


WEIGHT_SYNC_CHOICES = ("auto", "filesystem", "nccl", "lora")


class ConfigError(Exception):
    """A bad config: the message is one line naming the file and key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvSection(_Section):
    id: str = Field(min_length=1, description="Environment id (module name; an owner/ prefix is dropped).")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment's load_environment().")


class InferenceSection(_Section):
    gpus: StrictInt = Field(ge=0, description="GPUs for vf-vllm (0: run on the CPU).")
    shared: StrictBool = Field(default=False, description="The trainer runs on the inference GPUs too (one GPU for both): "
                               "vLLM takes inference.args.gpu_memory_utilization of each GPU's memory (default 0.3 "
                               "here), the trainer the rest.")
    args: dict[str, Any] = Field(default_factory=dict, description="vf-vllm flags: key -> --kebab-case.")


class TrainerSection(_Section):
    gpus: StrictInt = Field(ge=0, description="GPUs for vf-train (0: run on the CPU).")
    args: dict[str, Any] = Field(default_factory=dict, description="RLConfig fields.")


class VfRlConfig(_Section):
    """A whole vf-rl TOML file."""

    model: str = Field(min_length=1, description="Hub id or local model directory.")
    env: EnvSection
    inference: InferenceSection
    trainer: TrainerSection

    @field_validator("model")
    @classmethod
    def _expand_home(cls, value: str) -> str:
        return str(Path(value).expanduser()) if value.startswith("~") else value

    @property
    def run_name(self) -> str:
        return str(self.trainer.args.get("run_name") or "vf-rl")

    @property
    def output_dir(self) -> Path:
        return Path(self.trainer.args.get("output_dir") or f"outputs/{self.run_name}")


def _location(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def _suggest(key: str, valid) -> str:
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _section_keys(loc: tuple) -> list[str]:
    model: type[BaseModel] = VfRlConfig
    for part in loc[:-1]:
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def resolved_trainer_args(config: "VfRlConfig") -> dict[str, Any]:
    """RLConfig's own keys with their defaults, overridden by ``[trainer.args]``, with the
    derived defaults filled in (``output_dir``, ``max_tokens``, ``bf16``)."""
    args = {name: spec.default for name, spec in trainer_fields().items()
            if spec.owner == "RLConfig" and spec.default is not MISSING}
    args.update(config.trainer.args)
    args["output_dir"] = str(config.output_dir)
    if args.get("max_tokens") is None:
        args["max_tokens"] = args["max_seq_len"]
    if args.get("bf16") is None:
        args["bf16"] = config.trainer.gpus > 0
    return args


def validate_trainer_args(config: "VfRlConfig") -> None:
    """Check ``[trainer.args]``: known keys, value types, and the rules between keys.

    Raises:
        ConfigError: naming the key and what was expected (without the file name).
    """
    fields = trainer_fields()
    for key, value in config.trainer.args.items():
        if key not in fields:
            raise ConfigError(f"unknown key 'trainer.args.{key}'{_suggest(key, fields)}")
        spec = fields[key]
        try:
            TypeAdapter(annotation_type(spec.annotation), config=ConfigDict(strict=True)).validate_python(value)
        except ValidationError:
            raise ConfigError(f"trainer.args.{key}: expected {spec.annotation}, got {value!r}") from None
    a = resolved_trainer_args(config)
    world = max(config.trainer.gpus, 1)
    for key in ("batch_size", "micro_batch_size", "rollouts_per_example", "max_seq_len", "max_tokens",
                "max_prompt_len", "max_steps", "max_concurrent"):
        if a[key] <= 0:
            raise ConfigError(f"trainer.args.{key}: must be positive, got {a[key]}")
    if a["rollouts_per_example"] < 2:
        raise ConfigError(f"trainer.args.rollouts_per_example: must be at least 2 (advantages compare rollouts "
                          f"of one prompt), got {a['rollouts_per_example']}")
    if a["batch_size"] % a["rollouts_per_example"]:
        raise ConfigError(f"trainer.args.batch_size ({a['batch_size']}) must be divisible by rollouts_per_example "
                          f"({a['rollouts_per_example']})")
    if a["batch_size"] % (a["micro_batch_size"] * world):
        raise ConfigError(f"trainer.args.batch_size ({a['batch_size']}) must be divisible by micro_batch_size * "
                          f"trainer.gpus ({a['micro_batch_size']} * {world} = {a['micro_batch_size'] * world})")
    if a["max_tokens"] > a["max_seq_len"] or ("max_tokens" in config.trainer.args and a["max_tokens"] >= a["max_seq_len"]):
        raise ConfigError(f"trainer.args.max_tokens ({a['max_tokens']}) must be below max_seq_len "
                          f"({a['max_seq_len']}): the prompt needs room too")
    if "max_prompt_len" in config.trainer.args and a["max_prompt_len"] >= a["max_seq_len"]:
        raise ConfigError(f"trainer.args.max_prompt_len ({a['max_prompt_len']}) must be below max_seq_len "
                          f"({a['max_seq_len']})")
    if a["learning_rate"] < 0:
        raise ConfigError(f"trainer.args.learning_rate: must not be negative, got {a['learning_rate']}")
    if a["temperature"] <= 0:
        raise ConfigError(f"trainer.args.temperature: must be positive, got {a['temperature']}")
    if not 0 < a["mask_ratio_low"] <= 1 <= a["mask_ratio_high"]:
        raise ConfigError("trainer.args.mask_ratio_low/high: need 0 < mask_ratio_low <= 1 <= mask_ratio_high")
    schedulers = scheduler_types()
    if a["lr_scheduler_type"] not in schedulers:
        raise ConfigError(f"trainer.args.lr_scheduler_type: unknown scheduler {a['lr_scheduler_type']!r}"
                          f"{_suggest(a['lr_scheduler_type'], schedulers)}; one of: {', '.join(schedulers)}")
    if config.trainer.gpus == 0 and a.get("bf16"):
        raise ConfigError("trainer.args.bf16 = true needs a GPU, but trainer.gpus = 0 (CPU training is float32)")
    validate_weight_sync(config, a)
    port = config.inference.args.get("port")
    if port is not None and port != a["vllm_server_port"]:
        raise ConfigError(f"inference.args.port ({port}) differs from trainer.args.vllm_server_port "
                          f"({a['vllm_server_port']}); set only trainer.args.vllm_server_port")
    if not 0 < int(a["vllm_server_port"]) < 65536:
        raise ConfigError(f"trainer.args.vllm_server_port: not a port number: {a['vllm_server_port']}")


def validate_weight_sync(config: "VfRlConfig", a: dict[str, Any]) -> None:
    """``weight_sync`` against the GPU layout; ``[inference] shared``.

    Raises:
        ConfigError: naming the key.
    """
    kind = a["weight_sync"]
    if kind not in WEIGHT_SYNC_CHOICES:
        raise ConfigError(f"trainer.args.weight_sync: expected one of {', '.join(WEIGHT_SYNC_CHOICES)}, got {kind!r}")
    shared = config.inference.shared
    if shared and (config.inference.gpus == 0 or config.trainer.gpus == 0):
        raise ConfigError("inference.shared = true needs inference.gpus >= 1 and trainer.gpus >= 1 "
                          f"(got {config.inference.gpus} and {config.trainer.gpus})")
    if kind == "nccl" and (config.inference.gpus == 0 or config.trainer.gpus == 0):
        raise ConfigError("trainer.args.weight_sync = 'nccl' needs inference.gpus >= 1 and trainer.gpus >= 1; "
                          "use 'filesystem' on the CPU")
    if kind == "nccl" and shared:
        raise ConfigError("trainer.args.weight_sync = 'nccl' cannot work with inference.shared = true (NCCL cannot "
                          "connect two ranks on one GPU); use 'filesystem' or 'lora'")
    if kind == "lora" and not a["use_lora"]:
        raise ConfigError("trainer.args.weight_sync = 'lora' needs trainer.args.use_lora = true")
    if kind == "lora" and a.get("lora_modules_to_save"):
        raise ConfigError("trainer.args.weight_sync = 'lora' cannot send lora_modules_to_save (vLLM serves adapters "
                          "only); use 'filesystem' or 'nccl'")
    if a["weight_sync_bucket_mb"] <= 0:
        raise ConfigError(f"trainer.args.weight_sync_bucket_mb: must be positive, got {a['weight_sync_bucket_mb']}")
    if not 0 <= a["weight_sync_port"] < 65536:
        raise ConfigError(f"trainer.args.weight_sync_port: not a port number: {a['weight_sync_port']}")


def validate_inference_args(config: "VfRlConfig") -> None:
    """Rules for ``[inference.args]`` that need no vLLM import."""
    args = config.inference.args
    for key in ("tensor_parallel_size", "data_parallel_size"):
        value = args.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"inference.args.{key}: expected a positive integer, got {value!r}")
        if value > 1 and config.inference.gpus == 0:
            raise ConfigError(f"inference.args.{key} = {value} needs GPUs, but inference.gpus = 0")
    tp = args.get("tensor_parallel_size", 1)
    if config.inference.gpus and config.inference.gpus % tp:
        raise ConfigError(f"inference.gpus ({config.inference.gpus}) must be a multiple of "
                          f"inference.args.tensor_parallel_size ({tp})")
    for key in ("model", "worker_extension_cls"):
        if key in args:
            raise ConfigError(f"inference.args.{key}: set by vf-rl itself (use the top-level 'model')")


def validate_env(config: "VfRlConfig") -> None:
    """The environment id names an importable module, a module in the working directory or a
    built-in (``vf_rl.envs.registry.find_environment``; nothing is imported)."""
    from vf_rl.envs.registry import find_environment

    try:
        find_environment(config.env.id)
    except ValueError as exc:
        raise ConfigError(f"env.id: {exc}") from None


def load_config(path: str | Path) -> "VfRlConfig":
    """Read and validate a vf-rl TOML file: schema, trainer and inference args, environment
    id and model path. Imports neither torch nor vLLM.

    Raises:
        ConfigError: one line naming the file and the key, and what was expected.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text (UTF-8) file") from None
    try:
        config = VfRlConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _location(err["loc"]) or "(top level)"
        if err["type"] == "missing":
            raise ConfigError(f"{path}: required key '{key}' is missing") from None
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{path}: unknown key '{key}'{_suggest(str(err['loc'][-1]), _section_keys(err['loc']))}") from None
        raise ConfigError(f"{path}: {key}: {err['msg']} (got {err.get('input')!r})") from None
    model_path = Path(config.model)
    looks_local = config.model.startswith((".", "/", "~")) or config.model.count("/") != 1
    if looks_local and not model_path.exists():
        raise ConfigError(f"{path}: model: local model directory '{config.model}' does not exist")
    try:
        validate_trainer_args(config)
        validate_inference_args(config)
        validate_env(config)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config


def parse_at_args(argv: list[str], prog: str) -> tuple[Path, list[str]]:
    """Split ``@ config.toml [rest...]`` (or ``@config.toml``).

    Raises:
        ConfigError: the first argument is not ``@``.
    """
    if argv and argv[0].startswith("@") and len(argv[0]) > 1:
        return Path(argv[0][1:]), argv[1:]
    if len(argv) >= 2 and argv[0] == "@":
        return Path(argv[1]), argv[2:]
    raise ConfigError(f"usage: {prog} @ path/to/config.toml [options] (the first argument must be '@')")
