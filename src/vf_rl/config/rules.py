"""The rules a trainer configuration must satisfy, written once. No torch, no transformers.

Both ways in use them: the TOML file (``schema.load_config``, for ``vf-rl``, ``vf-train`` and
``vf-vllm``) and Python (``RLConfig.__post_init__``), so the two accept and reject the same
arguments with the same message. Rules that need the GPU layout of a TOML file (``trainer.gpus``,
``[inference]``) live in ``schema.py``; everything about ``[trainer.args]`` alone lives here.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from .fields import FieldSpec, annotation_type, rl_fields, scheduler_types

WEIGHT_SYNC_CHOICES = ("auto", "filesystem", "nccl", "lora")
LOSS_TYPES = ("cispo", "dapo")
"""Built-in losses (``trainer/loss.py``'s ``LOSSES``); ``"module:function"`` names another."""
ADVANTAGE_TYPES = ("group_mean", "group_mean_std")
"""Built-in advantages (``trainer/advantage.py``'s ``ADVANTAGES``); ``"module:function"`` names another."""


class ConfigError(ValueError):
    """A bad config: the message is one line naming the key (and the file, from the TOML path)."""


def suggest(key: str, valid) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``valid``, or ``""``."""
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def check_types(args: dict[str, Any], fields: dict[str, FieldSpec], prefix: str = "") -> None:
    """Every key of ``args`` is a field, and its value has the field's annotated type (strict:
    no ``"8"`` for an int, no ``1`` for a bool).

    Raises:
        ConfigError: ``"<prefix><key>: expected <annotation>, got <value>"`` or an unknown key.
    """
    for key, value in args.items():
        if key not in fields:
            raise ConfigError(f"unknown key '{prefix}{key}'{suggest(key, fields)}")
        spec = fields[key]
        try:
            TypeAdapter(annotation_type(spec.annotation), config=ConfigDict(strict=True)).validate_python(value)
        except ValidationError:
            raise ConfigError(f"{prefix}{key}: expected {spec.annotation}, got {value!r}") from None


def derive_defaults(args: dict[str, Any], has_gpu: bool) -> dict[str, Any]:
    """The defaults that depend on other keys, filled in where ``args`` leaves them ``None``:
    ``output_dir`` (``outputs/<run_name>``), ``max_tokens`` (``max_seq_len``), ``bf16`` (on with
    a GPU), ``eval_rollouts_per_example`` (``rollouts_per_example``), ``eval_on_start`` (on when
    ``eval_strategy`` is not ``"no"``). Returns a new dict."""
    a = dict(args)
    if a.get("output_dir") is None:
        a["output_dir"] = f"outputs/{a.get('run_name') or 'vf-rl'}"
    if a.get("max_tokens") is None:
        a["max_tokens"] = a["max_seq_len"]
    if a.get("bf16") is None:
        a["bf16"] = has_gpu
    if a.get("eval_rollouts_per_example") is None:
        a["eval_rollouts_per_example"] = a["rollouts_per_example"]
    if a.get("eval_on_start") is None:
        strategy = a.get("eval_strategy") or "no"
        a["eval_on_start"] = getattr(strategy, "value", strategy) != "no"
    return a


def resolve_function(key: str, name: str, builtins: dict[str, Any]) -> Any:
    """``builtins[name]``, or the function ``"module:function"`` names (imported now).

    Raises:
        ConfigError: naming ``key``, when ``name`` is neither, or the module or function is missing.
    """
    if name in builtins:
        return builtins[name]
    module_name, _, function = name.partition(":")
    if not (module_name and function):
        raise ConfigError(f"{key}: expected one of {', '.join(builtins)} or 'module:function', got {name!r}")
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{key}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?") from None
    if not callable(getattr(module, function, None)):
        raise ConfigError(f"{key}: module {module_name!r} has no function {function!r}")
    return getattr(module, function)


def _check_function_name(key: str, value: str, builtins: tuple[str, ...], prefix: str) -> None:
    if value in builtins:
        return
    module, _, function = value.partition(":")
    if not (module and function and function.isidentifier()):
        raise ConfigError(f"{prefix}{key}: expected one of {', '.join(builtins)} or 'module:function', "
                          f"got {value!r}{suggest(value, builtins)}")


def check_trainer_args(args: dict[str, Any], world_size: int, has_gpu: bool, prefix: str = "") -> None:
    """The rules between trainer arguments.

    ``max_tokens`` and ``max_prompt_len`` must leave room below ``max_seq_len`` when set (their
    defaults, ``max_seq_len`` and 512, are not checked against a short ``max_seq_len``).

    Args:
        args: every RLConfig field with its value as given (derived defaults still ``None``).
        world_size: trainer processes (``trainer.gpus``, or 1 on the CPU).
        has_gpu: the trainer runs on a GPU.
        prefix: put before every key in messages (``"trainer.args."`` for a TOML file).
    Raises:
        ConfigError: one line naming the key and what was expected.
    """
    p = prefix
    a = derive_defaults(args, has_gpu)
    for key in ("batch_size", "micro_batch_size", "rollouts_per_example", "max_seq_len", "max_tokens",
                "max_prompt_len", "max_steps", "max_concurrent", "generation_timeout", "request_timeout",
                "vllm_server_timeout", "weight_sync_bucket_mb", "lora_rank", "eval_rollouts_per_example"):
        if a[key] <= 0:
            raise ConfigError(f"{p}{key}: must be positive, got {a[key]}")
    if a["rollouts_per_example"] < 2:
        raise ConfigError(f"{p}rollouts_per_example: must be at least 2 (advantages compare rollouts of one "
                          f"prompt), got {a['rollouts_per_example']}")
    if a["batch_size"] % a["rollouts_per_example"]:
        raise ConfigError(f"{p}batch_size ({a['batch_size']}) must be divisible by rollouts_per_example "
                          f"({a['rollouts_per_example']})")
    if a["batch_size"] % (a["micro_batch_size"] * world_size):
        raise ConfigError(f"{p}batch_size ({a['batch_size']}) must be divisible by micro_batch_size * "
                          f"trainer processes (trainer.gpus): {a['micro_batch_size']} * {world_size} = "
                          f"{a['micro_batch_size'] * world_size}")
    if a.get("micro_batch_tokens") is not None and a["micro_batch_tokens"] < a["max_seq_len"]:
        raise ConfigError(f"{p}micro_batch_tokens ({a['micro_batch_tokens']}) must be at least max_seq_len "
                          f"({a['max_seq_len']}): one sample of max_seq_len tokens must fit in a micro batch")
    if args.get("max_tokens") is not None and a["max_tokens"] >= a["max_seq_len"]:
        raise ConfigError(f"{p}max_tokens ({a['max_tokens']}) must be below max_seq_len ({a['max_seq_len']}): "
                          "the prompt needs room too")
    if a["max_prompt_len"] != rl_fields()["max_prompt_len"].default and a["max_prompt_len"] >= a["max_seq_len"]:
        raise ConfigError(f"{p}max_prompt_len ({a['max_prompt_len']}) must be below max_seq_len "
                          f"({a['max_seq_len']})")
    if a["learning_rate"] < 0:
        raise ConfigError(f"{p}learning_rate: must not be negative, got {a['learning_rate']}")
    if a["temperature"] <= 0:
        raise ConfigError(f"{p}temperature: must be positive, got {a['temperature']}")
    if not 0 < a["mask_ratio_low"] <= 1 <= a["mask_ratio_high"]:
        raise ConfigError(f"{p}mask_ratio_low/high: need 0 < mask_ratio_low <= 1 <= mask_ratio_high, got "
                          f"{a['mask_ratio_low']} and {a['mask_ratio_high']}")
    if not 0 <= a["epsilon_low"] < 1 or a["epsilon_high"] < 0:
        raise ConfigError(f"{p}epsilon_low/high: need 0 <= epsilon_low < 1 and epsilon_high >= 0, got "
                          f"{a['epsilon_low']} and {a['epsilon_high']}")
    _check_function_name("loss_type", a["loss_type"], LOSS_TYPES, p)
    _check_function_name("advantage_type", a["advantage_type"], ADVANTAGE_TYPES, p)
    schedulers, scheduler = scheduler_types(), getattr(a["lr_scheduler_type"], "value", a["lr_scheduler_type"])
    if scheduler not in schedulers:
        raise ConfigError(f"{p}lr_scheduler_type: unknown scheduler {scheduler!r}{suggest(str(scheduler), schedulers)}; "
                          f"one of: {', '.join(schedulers)}")
    if a["bf16"] and not has_gpu:
        raise ConfigError(f"{p}bf16 = true needs a GPU, but the trainer runs on the CPU (float32)")
    kind = a["weight_sync"]
    if kind not in WEIGHT_SYNC_CHOICES:
        raise ConfigError(f"{p}weight_sync: expected one of {', '.join(WEIGHT_SYNC_CHOICES)}, got {kind!r}")
    if kind == "lora" and not a["use_lora"]:
        raise ConfigError(f"{p}weight_sync = 'lora' needs {p}use_lora = true")
    if kind == "lora" and a.get("lora_modules_to_save"):
        raise ConfigError(f"{p}weight_sync = 'lora' cannot send lora_modules_to_save (vLLM serves adapters only); "
                          "use 'filesystem' or 'nccl'")
    if not 0 <= a["weight_sync_port"] < 65536:
        raise ConfigError(f"{p}weight_sync_port: not a port number: {a['weight_sync_port']}")
    if not 0 < a["vllm_server_port"] < 65536:
        raise ConfigError(f"{p}vllm_server_port: not a port number: {a['vllm_server_port']}")
