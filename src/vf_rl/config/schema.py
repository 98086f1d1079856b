"""The vf-rl TOML file: its schema and loading. Light: no torch, no transformers.

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"   # hub id or local directory
    [env]               id = "reverse-text"          [env.args]       ... kwargs of load_environment
    [inference]         gpus = 1                     [inference.args] ... vf-vllm / vllm serve flags
    [trainer]           gpus = 1                     [trainer.args]   ... RLConfig fields
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(Exception):
    """A bad config: the message is one line naming the file and key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvSection(_Section):
    id: str = Field(min_length=1, description="Environment id (module name; an owner/ prefix is dropped).")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment's load_environment().")


class InferenceSection(_Section):
    gpus: StrictInt = Field(ge=0, description="GPUs for vf-vllm (0: run on the CPU).")
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


def load_config(path: str | Path) -> VfRlConfig:
    """Read and validate a vf-rl TOML file.

    Raises:
        ConfigError: missing file, TOML syntax error, or a schema violation (one line each).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None
    try:
        config = VfRlConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _location(err["loc"]) or "(top level)"
        if err["type"] == "missing":
            raise ConfigError(f"{path}: required key '{key}' is missing") from None
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{path}: unknown key '{key}'") from None
        raise ConfigError(f"{path}: {key}: {err['msg']} (got {err.get('input')!r})") from None
    model_path = Path(config.model).expanduser()
    looks_local = config.model.startswith((".", "/", "~")) or config.model.count("/") != 1
    if looks_local and not model_path.exists():
        raise ConfigError(f"{path}: model: local model directory '{config.model}' does not exist")
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
