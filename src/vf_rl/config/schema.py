"""The vf-rl TOML file: its schema, and its loading into one resolved run config. Light: no
torch, and transformers only to check a key vf-rl does not declare.

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"   # hub id or local directory
    [env]               id = "reverse-text"          [env.args]       ... kwargs of load_environment
    [inference]         gpus = 1                     [inference.args] ... vf-vllm / vllm serve flags
    [trainer]           gpus = 1                     [trainer.args]   ... RLConfig fields

``load_config`` reads a file, resolves it once (:func:`resolve`: every trainer default and
derived value filled in, the server's flags derived from the trainer's keys) and checks every
rule on the resolved values. ``vf-rl`` writes the result to ``<output_dir>/resolved.toml``
(``config/resolved_toml.py``), which ``vf-train`` and ``vf-vllm`` read as it is: a file with a
``[resolved]`` table is not resolved again.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
)

from vf_rl.config.defaults import origin, rename_older_names, resolve_trainer_args
from vf_rl.config.layout import layout_devices, trainer_values
from vf_rl.config.rules import ConfigError, check_trainer_args, check_types, choose_weight_sync, misplaced_key_hint, suggest
from vf_rl.config.tools import tool_flags
from vf_rl.config.vllm_flags import api_servers

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvSection(_Section):
    id: str = Field(min_length=1, description="Environment id (module name; an owner/ prefix is dropped).")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment's load_environment().")
    weight: float = Field(default=1.0, gt=0, description="With several [[env]] tables: this environment's share "
                          "of each batch's prompts (relative to the others).")


class InferenceSection(_Section):
    gpus: StrictInt = Field(ge=0, description="GPUs for vf-vllm (0: run on the CPU).")
    shared: StrictBool = Field(default=False, description="The trainer runs on the inference GPUs too (one GPU for both): "
                               "vLLM takes inference.args.gpu_memory_utilization of each GPU's memory, the trainer the "
                               "rest. Unset, vf-rl derives it from the model's config and the run's sizes: the bf16 "
                               "weights, a KV cache for `batch_size x max_off_policy_steps x max_seq_len` tokens, one "
                               "forward's activations and 2 GiB, plus 15%, as a share of the first visible GPU (an 80 "
                               "GB one when `nvidia-smi` cannot say), at least 0.3 (the share small models were "
                               "measured with) and at most 0.9; `--dry-run` prints it.")
    args: dict[str, Any] = Field(default_factory=dict, description="vf-vllm flags: key -> --kebab-case.")


class TrainerSection(_Section):
    gpus: StrictInt = Field(ge=0, description="GPUs for vf-train (0: run on the CPU); per node with nodes > 1.")
    nodes: StrictInt = Field(default=1, ge=1, description="Trainer machines (accelerate multi-node): node 0 runs "
                             "with `vf-rl @ cfg`, node K with `vf-rl @ cfg --node-rank K`; `--print-commands` "
                             "prints them all.")
    main_address: str | None = Field(default=None, description="host:port where node 0 accepts the other trainer "
                                     "nodes (needed with nodes > 1).")
    args: dict[str, Any] = Field(default_factory=dict, description="RLConfig fields.")

    @property
    def processes(self) -> int:
        """Trainer processes in all: ``max(gpus, 1) * nodes``."""
        return max(self.gpus, 1) * self.nodes


class ResolvedSection(_Section):
    source: str = Field(description="The config file this run config was resolved from.")


class VfRlConfig(_Section):
    """A whole vf-rl TOML file; after :func:`load_config`, resolved: ``trainer.args`` holds every
    vf-rl key (``None`` ones aside) and ``inference.args`` the server's derived flags."""

    model: str = Field(min_length=1, description="Hub id or local model directory.")
    env: EnvSection | list[EnvSection] = Field(description="An [env] table, or [[env]] tables for several "
                                               "environments in one run (sampled by weight per batch).")
    inference: InferenceSection
    trainer: TrainerSection
    resolved: ResolvedSection | None = Field(default=None, description="Present in a resolved file "
                                             "(<output_dir>/resolved.toml): its values are used as they are.")
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def origins(self) -> dict[str, str]:
        """Where each resolved value came from, by dotted key (``"trainer.args.max_tokens"``):
        ``"config"``, ``"default"`` or ``"derived: <from what>"``; empty when read from a
        resolved file."""
        return self._origins

    @property
    def envs(self) -> list[EnvSection]:
        """The environment tables: ``[env]`` as a list of one, or every ``[[env]]``."""
        return self.env if isinstance(self.env, list) else [self.env]

    @field_validator("model")
    @classmethod
    def _expand_home(cls, value: str) -> str:
        return str(Path(value).expanduser()) if value.startswith("~") else value

    @property
    def output_dir(self) -> Path:
        """The trainer's ``output_dir`` (default ``outputs/<run_name>``)."""
        return Path(trainer_values(self)["output_dir"])

    def server_address(self) -> tuple[str, int]:
        """``(host, port)`` where vf-vllm listens."""
        args = self.inference.args
        return str(args["host"]), int(args["port"])


def _location(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def _section_keys(loc: tuple) -> list[str]:
    model: type[BaseModel] = VfRlConfig
    for part in loc[:-1]:
        if isinstance(part, int):  # an [[env]] table
            continue
        annotation = EnvSection if (model, part) == (VfRlConfig, "env") else model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _first_error(errors: list[dict], data: dict) -> dict:
    """The first error of the ``env`` branch the file used (``[env]`` or ``[[env]]``), with
    pydantic's union tag taken out of its location."""
    wrong, tag = ("EnvSection", "list[EnvSection]") if isinstance(data.get("env"), list) else \
        ("list[EnvSection]", "EnvSection")
    errors = [e for e in errors if e["loc"][:2] != ("env", wrong)] or errors
    err = dict(errors[0])
    err["loc"] = tuple(part for i, part in enumerate(err["loc"]) if not (i == 1 and part == tag))
    return err


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's choices of ``max_lora_rank``."""


def resolve(config: "VfRlConfig", source: Path) -> "VfRlConfig":
    """The run config of a TOML file, resolved once.

    ``trainer.args``: RLArgs' defaults, overridden by the file, derived defaults filled in
    (``defaults.resolve_trainer_args``). ``inference.args``: the file's flags plus those derived: ``max_model_len``
    (``max_seq_len``: one sequence-length truth), ``host`` and ``port`` (``vllm_server_host``/``port``),
    ``gpu_memory_utilization`` (when shared: ``memory.shared_split``), the LoRA flags (``weight_sync = "lora"``),
    ``api_server_count`` (a GPU server without LoRA adapters: ``vllm_flags.api_servers``), ``data_parallel_size``
    (several inference GPUs), tool calling (``tools.tool_flags``: on when the model's chat template has a known
    tool-call format). ``origins`` says where each value came from.

    Raises:
        ConfigError: an older key name refused, or a weight-sync choice the layout cannot use.
    """
    from vf_rl.config.memory import recorded_layers_fit, shared_split

    given = rename_older_names(config.trainer.args, "trainer.args.")
    has_gpu = config.trainer.gpus > 0
    a = resolve_trainer_args(given, has_gpu, config.trainer.processes)
    origins = {f"trainer.args.{k}": origin(k, v, k in given) for k, v in a.items()}
    try:
        sync = choose_weight_sync(a["weight_sync"], *layout_devices(config, a))
    except ConfigError as exc:
        raise ConfigError(f"trainer.args.{exc}") from None
    if a["weight_sync"] == "auto":
        origins["trainer.args.weight_sync"] = f"default (for this layout: {sync})"
    inference = dict(config.inference.args)
    derived = {"max_model_len": (a["max_seq_len"], "trainer.args.max_seq_len"),
               "host": (a["vllm_server_host"], "trainer.args.vllm_server_host"),
               "port": (a["vllm_server_port"], "trainer.args.vllm_server_port")}
    if config.inference.shared and "gpu_memory_utilization" not in inference:
        derived["gpu_memory_utilization"] = shared_split(config, a)
    if a["weight_sync"] == "lora":  # serve the adapter
        derived["enable_lora"] = (True, "weight_sync = 'lora'")
        derived["max_lora_rank"] = (next(r for r in LORA_RANKS if r >= int(a["lora_rank"])), "trainer.args.lora_rank")
        derived["max_loras"] = (1, "weight_sync = 'lora'")
    if config.inference.gpus and a["weight_sync"] != "lora":  # vLLM records an adapter in one API server only
        derived["api_server_count"] = (api_servers(), "1 API-server process per 4 CPU cores, at most 4")
    derived.update(tool_flags(config.model, inference))
    if config.inference.gpus > 1:
        derived["data_parallel_size"] = (config.inference.gpus // int(inference.get("tensor_parallel_size", 1)),
                                         "inference.gpus / tensor_parallel_size")
    for key, (value, why) in derived.items():
        origins[f"inference.args.{key}"] = "config" if key in inference else f"derived: {why}"
        inference.setdefault(key, value)
    for key in config.inference.args:
        origins.setdefault(f"inference.args.{key}", "config")

    def build(a: dict[str, Any]) -> "VfRlConfig":
        return config.model_copy(update={
            "trainer": config.trainer.model_copy(update={"args": {k: v for k, v in a.items() if v is not None}}),
            "inference": config.inference.model_copy(update={"args": inference}),
            "resolved": ResolvedSection(source=str(source))})

    resolved = build(a)
    if origins.get("trainer.args.torch_compile_mode", "").startswith("derived") and not recorded_layers_fit(resolved):
        a["torch_compile_mode"] = None  # the per-layer compile, which holds a pass's activations once
        origins["trainer.args.torch_compile_mode"] = "default (recorded layers' memory estimate does not fit the GPU)"
        resolved = build(a)
    resolved._origins = origins
    return resolved


def validate_trainer_args(config: "VfRlConfig") -> None:
    """Check the resolved ``[trainer.args]``: the rules between keys (``rules.check_trainer_args``,
    shared with ``RLConfig``) and the rules that need the GPU layout of the file.

    Raises:
        ConfigError: naming the key and what was expected (without the file name).
    """
    a = trainer_values(config)
    check_trainer_args(a, world_size=config.trainer.processes, has_gpu=config.trainer.gpus > 0,
                       prefix="trainer.args.")
    validate_layout(config, a)


def validate_layout(config: "VfRlConfig", a: dict[str, Any]) -> None:
    """``[inference] shared``, several trainer nodes and the server port against the GPU layout
    (the weight-sync choice is checked by :func:`resolve`).

    Raises:
        ConfigError: naming the key.
    """
    shared = config.inference.shared
    if shared and (config.inference.gpus == 0 or config.trainer.gpus == 0):
        raise ConfigError("inference.shared = true needs inference.gpus >= 1 and trainer.gpus >= 1 "
                          f"(got {config.inference.gpus} and {config.trainer.gpus})")
    if config.trainer.nodes > 1:
        import re

        if not config.trainer.main_address or not re.fullmatch(r"[^\s:]+:\d{1,5}", config.trainer.main_address):
            raise ConfigError(f"trainer.main_address: nodes = {config.trainer.nodes} needs node 0's address as "
                              f"\"host:port\" (got {config.trainer.main_address!r})")
    port = config.inference.args.get("port")
    if port is not None and port != a["vllm_server_port"]:
        raise ConfigError(f"inference.args.port ({port}) differs from trainer.args.vllm_server_port "
                          f"({a['vllm_server_port']}); set only trainer.args.vllm_server_port")


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
    max_model_len = args.get("max_model_len")
    if isinstance(max_model_len, int) and not isinstance(max_model_len, bool) and max_model_len > 0:
        max_seq_len = trainer_values(config)["max_seq_len"]
        if max_model_len < max_seq_len:
            raise ConfigError(f"inference.args.max_model_len ({max_model_len}) is below trainer.args.max_seq_len "
                              f"({max_seq_len}): the server could not produce the sequences the trainer trains on; "
                              "raise max_model_len or lower max_seq_len (unset, it is max_seq_len)")


def read_toml(path: Path) -> dict:
    """The TOML file at ``path`` as a dict.

    Raises:
        ConfigError: one line: the file is missing, not UTF-8 text, or not valid TOML."""
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text (UTF-8) file") from None


def load_config(path: str | Path) -> "VfRlConfig":
    """Read, resolve (:func:`resolve`, unless the file is already a resolved one) and validate
    a vf-rl TOML file: schema, trainer and inference args, model path. The ``[env]`` tables are
    checked against their environments by ``vf_rl.env_api.checks.check_environments``.
    Imports neither torch nor vLLM.

    Raises:
        ConfigError: one line naming the file and the key, and what was expected.
    """
    path = Path(path)
    data = read_toml(path)
    try:
        config = VfRlConfig.model_validate(data)
    except ValidationError as exc:
        err = _first_error(exc.errors(), data)
        key = _location(err["loc"]) or "(top level)"
        if err["type"] == "missing":
            raise ConfigError(f"{path}: required key '{key}' is missing") from None
        if err["type"] == "extra_forbidden":
            leaf = str(err["loc"][-1])  # a trainer key at the top level or in [trainer] is pointed to [trainer.args]
            hint = misplaced_key_hint(leaf) if tuple(err["loc"][:-1]) in ((), ("trainer",)) else ""
            raise ConfigError(f"{path}: unknown key '{key}'{hint or suggest(leaf, _section_keys(err['loc']))}") from None
        raise ConfigError(f"{path}: {key}: {err['msg']} (got {err.get('input')!r})") from None
    model_path = Path(config.model)
    looks_local = config.model.startswith((".", "/", "~")) or config.model.count("/") != 1
    if looks_local and not model_path.exists():
        raise ConfigError(f"{path}: model: local model directory '{config.model}' does not exist")
    try:
        check_types(config.trainer.args, prefix="trainer.args.")
        validate_inference_args(config)
        if config.resolved is None:
            config = resolve(config, path)
        validate_trainer_args(config)
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
