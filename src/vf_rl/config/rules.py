"""The rules a trainer configuration must satisfy, written once. No torch; transformers only to
check a key vf-rl does not declare itself, once per transformers version (the defaults derived
from other keys: ``defaults.py``).

Both ways in use them: the TOML file (``schema.load_config``, for ``vf-rl``, ``vf-train`` and
``vf-vllm``) and Python (``RLConfig.__post_init__``), so the two accept and reject the same
arguments with the same message. Rules that need the GPU layout of a TOML file (``trainer.gpus``,
``[inference]``) live in ``schema.py``; everything about ``[trainer.args]`` alone lives here, and
so does the weight-sync choice (:func:`choose_weight_sync`), which the launcher applies to the
file's GPU layout and the trainer to the devices it finds.
"""

from __future__ import annotations

import typing
from functools import lru_cache
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from vf_rl.config.args import CUDA_GRAPH_MODES, SAMPLING_DEFAULTS, TRL_NAMES, RLArgs, rl_fields
from vf_rl.config.choices import builtin_functions, run_choices
from vf_rl.config.errors import ConfigError, suggest
from vf_rl.config.training_arguments import training_arguments_types

WEIGHT_SYNC_CHOICES = ("auto", "filesystem", "nccl", "ipc", "lora")
PREFLIGHT_CHOICES = ("warn", "strict", "off")
HEALTH_RULES = ("errors", "mismatch", "entropy_collapse", "held_out_drop", "length_growth", "repeated_completions",
                "no_signal", "grad_spike")
"""The health rules (``trainer/health.py``), the names ``health_stop`` takes."""
LOSS_TYPES = tuple(builtin_functions("loss"))
"""Built-in losses (their options in ``choices.py`` name their functions); ``"module:function"`` names another."""
ADVANTAGE_TYPES = tuple(builtin_functions("advantage"))
"""Built-in advantages (their options in ``choices.py``); ``"module:function"`` names another."""


@lru_cache(maxsize=1)
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(RLArgs)


def _type_text(tp: Any) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")


def check_types(args: dict[str, Any], prefix: str = "") -> None:
    """Every key of ``args`` is an RLConfig field (vf-rl's own, :class:`~vf_rl.config.args.RLArgs`,
    or transformers' ``TrainingArguments``), and its value has the field's annotated type
    (strict: no ``"8"`` for an int, no ``1`` for a bool).

    Raises:
        ConfigError: ``"<prefix><key>: expected <type>, got <value>"``, or an unknown key
            naming the closest valid one.
    """
    for key, value in args.items():
        tp = _field_types().get(key)  # vf-rl's keys and their older names
        if tp is None:
            others = training_arguments_types()
            if key not in others:
                hint = trl_name_hint(key, prefix) or suggest(key, [*rl_fields(), *others])
                raise ConfigError(f"unknown key '{prefix}{key}'{hint}")
            tp = others[key]
        try:
            adapter = TypeAdapter(tp, config=ConfigDict(strict=True))
        except Exception:  # a type pydantic cannot check (a class of transformers): TrainingArguments checks it
            continue
        try:
            adapter.validate_python(value)
        except ValidationError:
            raise ConfigError(f"{prefix}{key}: expected {_type_text(tp)}, got {value!r}") from None


def trl_name_hint(key: str, prefix: str = "") -> str:
    """`` (TRL's name: here it is <key>)`` for a TRL ``GRPOConfig`` key that vf-rl names otherwise
    (``args.TRL_NAMES``; ``prefix`` put before a ``[trainer.args]`` key), else ``""``."""
    if key not in TRL_NAMES:
        return ""
    target = TRL_NAMES[key]
    return f" (TRL's name: here it is {target if '.' in target else prefix + target})"


def misplaced_key_hint(key: str) -> str:
    """For an unknown key at the top level or in ``[trainer]``: a pointer to ``[trainer.args]`` when
    it is a trainer key there (vf-rl's, an older name, TrainingArguments') or TRL's name of one,
    else ``""``."""
    if key in TRL_NAMES:
        return trl_name_hint(key, "trainer.args.")
    if key in _field_types() or key in training_arguments_types():
        return f": {key} belongs in [trainer.args]"
    return ""


def resolve_function(key: str, name: str, builtins: dict[str, Any]) -> Any:
    """The function ``builtins[name]`` (a function, or its ``"module:function"`` path), or the
    function ``name`` itself names as ``"module:function"`` (imported now).

    Raises:
        ConfigError: naming ``key``, when ``name`` is neither, or the module or function is missing.
    """
    if name in builtins and callable(builtins[name]):
        return builtins[name]
    if name in builtins:
        name = builtins[name]
    module_name, _, function = name.partition(":")
    if not (module_name and function):
        raise ConfigError(f"{key}: expected one of {', '.join(builtins)} or 'module:function', got {name!r}")
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{key}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?") from None
    except Exception as exc:  # the module itself fails: one line, not its traceback
        raise ConfigError(f"{key}: importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    if not callable(getattr(module, function, None)):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise ConfigError(f"{key}: module {module_name!r} has no function {function!r}{suggest(function, names)}")
    return getattr(module, function)


def _check_function_name(key: str, value: str, builtins: tuple[str, ...], prefix: str) -> None:
    """A built-in name, or ``module:function`` whose module imports and has that function
    (imported now, so a typo fails at ``--dry-run``, not after the server started)."""
    if value in builtins:
        return
    module, _, function = value.partition(":")
    if not (module and function and function.isidentifier()):
        raise ConfigError(f"{prefix}{key}: expected one of {', '.join(builtins)} or 'module:function', "
                          f"got {value!r}{suggest(value, builtins)}")
    resolve_function(prefix + key, value, {})


def check_trainer_args(a: dict[str, Any], world_size: int, has_gpu: bool, prefix: str = "") -> None:
    """The rules between trainer arguments.

    ``max_tokens`` and ``max_prompt_len`` must leave room below ``max_seq_len`` when set (their
    defaults, ``max_seq_len`` and 512, are not checked against a short ``max_seq_len``).

    Args:
        a: every RLArgs field with the value the run uses (:func:`resolve_trainer_args`).
        world_size: trainer processes (``trainer.gpus`` (1 on the CPU) times ``trainer.nodes``).
        has_gpu: the trainer runs on a GPU.
        prefix: put before every key in messages (``"trainer.args."`` for a TOML file).
    Raises:
        ConfigError: one line naming the key and what was expected.
    """
    p = prefix
    for key in ("batch_size", "micro_batch_size", "rollouts_per_example", "max_seq_len", "max_tokens",
                "max_prompt_len", "max_steps", "max_concurrent", "generation_timeout", "request_timeout",
                "vllm_server_timeout", "weight_sync_bucket_mb", "lora_rank", "eval_rollouts_per_example",
                "stall_warning_timeout", "stall_timeout"):
        if a[key] is not None and a[key] <= 0:
            raise ConfigError(f"{p}{key}: must be positive, got {a[key]}")
    if a["stall_warning_timeout"] >= a["stall_timeout"]:
        raise ConfigError(f"{p}stall_warning_timeout ({a['stall_warning_timeout']}) must be below stall_timeout "
                          f"({a['stall_timeout']}): the watchdog warns before it stops the run")
    if a["rollouts_per_example"] < 2:
        raise ConfigError(f"{p}rollouts_per_example: must be at least 2 (advantages compare rollouts of one "
                          f"prompt), got {a['rollouts_per_example']}")
    if a["batch_size"] % a["rollouts_per_example"]:
        raise ConfigError(f"{p}batch_size ({a['batch_size']}) must be divisible by rollouts_per_example "
                          f"({a['rollouts_per_example']})")
    if a["batch_size"] % (a["micro_batch_size"] * world_size):
        raise ConfigError(f"{p}batch_size ({a['batch_size']}) must be divisible by micro_batch_size * "
                          f"trainer processes (trainer.gpus * trainer.nodes): {a['micro_batch_size']} * {world_size}"
                          f" = {a['micro_batch_size'] * world_size}")
    if a.get("micro_batch_tokens") is not None and a["micro_batch_tokens"] < a["max_seq_len"]:
        raise ConfigError(f"{p}micro_batch_tokens ({a['micro_batch_tokens']}) must be at least max_seq_len "
                          f"({a['max_seq_len']}): one sample of max_seq_len tokens must fit in a micro batch")
    if a["max_tokens"] is not None and a["max_tokens"] >= a["max_seq_len"]:
        raise ConfigError(f"{p}max_tokens ({a['max_tokens']}) must be below max_seq_len ({a['max_seq_len']}): "
                          "the prompt needs room too")
    if a["max_prompt_len"] != rl_fields()["max_prompt_len"].default and a["max_prompt_len"] >= a["max_seq_len"]:
        raise ConfigError(f"{p}max_prompt_len ({a['max_prompt_len']}) must be below max_seq_len "
                          f"({a['max_seq_len']})")
    if a.get("max_time_s") is not None and a["max_time_s"] <= 0:
        raise ConfigError(f"{p}max_time_s: must be positive (seconds), got {a['max_time_s']}")
    if a["learning_rate"] < 0:
        raise ConfigError(f"{p}learning_rate: must not be negative, got {a['learning_rate']}")
    if a["temperature"] is not None and a["temperature"] <= 0:
        raise ConfigError(f"{p}temperature: must be positive, got {a['temperature']}")
    if not 0 < a["mask_ratio_low"] <= 1 <= a["mask_ratio_high"]:
        raise ConfigError(f"{p}mask_ratio_low/high: need 0 < mask_ratio_low <= 1 <= mask_ratio_high, got "
                          f"{a['mask_ratio_low']} and {a['mask_ratio_high']}")
    if not 0 <= a["epsilon_low"] < 1 or a["epsilon_high"] < 0:
        raise ConfigError(f"{p}epsilon_low/high: need 0 <= epsilon_low < 1 and epsilon_high >= 0, got "
                          f"{a['epsilon_low']} and {a['epsilon_high']}")
    check_sampling_and_lora(a, p)
    check_output_dir(a["output_dir"], p)
    _check_function_name("loss_type", a["loss_type"], LOSS_TYPES, p)
    _check_function_name("advantage_type", a["advantage_type"], ADVANTAGE_TYPES, p)
    check_scheduler(a["lr_scheduler_type"], p)
    if a["bf16"] and not has_gpu:
        raise ConfigError(f"{p}bf16 = true needs a GPU, but the trainer runs on the CPU (float32)")
    if a["activation_offloading"] and not a.get("gradient_checkpointing"):
        raise ConfigError(f"{p}activation_offloading = true needs {p}gradient_checkpointing = true (it moves the "
                          "checkpointed layer inputs to host memory)")
    if a.get("tiled_mlp") and a["use_lora"] and a["lora_dropout"] > 0:
        raise ConfigError(f"{p}tiled_mlp = true needs {p}lora_dropout = 0 (the backward pass recomputes each MLP "
                          f"tile, which would draw new dropout masks); this run has {a['lora_dropout']}")
    if a["torch_compile"] and a.get("torch_compile_mode") in CUDA_GRAPH_MODES:
        _check_cuda_graphs(a, world_size, p)
    if a["torch_compile"] and a.get("deepspeed"):
        raise ConfigError(f"{p}torch_compile = true is not supported with deepspeed (its ZeRO-3 hooks gather "
                          "weights inside the layers vf-rl compiles); leave torch_compile unset or false")
    if a["preflight"] not in PREFLIGHT_CHOICES:
        raise ConfigError(f"{p}preflight: expected one of {', '.join(PREFLIGHT_CHOICES)}, got {a['preflight']!r}")
    unknown = [name for name in a.get("health_stop") or () if name not in HEALTH_RULES]
    if unknown:
        raise ConfigError(f"{p}health_stop: unknown rule {unknown[0]!r}; the rules are {', '.join(HEALTH_RULES)}")
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
    urls = a.get("vllm_server_urls")
    if urls is not None:
        import re

        bad = [u for u in urls if not re.fullmatch(r"https?://[^/\s:]+(:\d{1,5})?/?", str(u))]
        if not urls or bad:
            raise ConfigError(f"{p}vllm_server_urls: expected a non-empty list of http://host:port URLs, got "
                              f"{bad[0] if bad else urls!r}")
        if len(set(urls)) != len(urls):
            raise ConfigError(f"{p}vllm_server_urls: a server is listed twice")
    check_recipe_args(a, p)
    run_choices(a, p)  # no key of an option the run does not take
    check_batch_keys(a, p)


def _check_cuda_graphs(a: dict[str, Any], world_size: int, p: str) -> None:
    """``torch_compile_mode`` that replays CUDA graphs of the decoder layers (``trainer/model.py``):
    measured with one trainer process and packed micro batches, and its graphs cannot hold what
    runs outside them inside the layers (checkpointed layers, tiled MLPs)."""
    mode = f"{p}torch_compile_mode = {a['torch_compile_mode']!r} (CUDA graphs of the decoder layers)"
    if world_size > 1:
        raise ConfigError(f"{mode} runs with one trainer process; this run has {world_size} (trainer.gpus * "
                          "trainer.nodes): use 'default' or 'max-autotune-no-cudagraphs'")
    for key, why in (("gradient_checkpointing", "recomputes layers outside the graphs"),
                     ("tiled_mlp", "runs each MLP's backward itself")):
        if a.get(key):
            raise ConfigError(f"{mode} does not combine with {p}{key} ({key} {why}); unset one of them")
    if not a.get("padding_free", True):
        raise ConfigError(f"{mode} needs {p}padding_free = true (packed micro batches are padded to a few shapes, "
                          "each one graph)")


def check_scheduler(name: Any, p: str = "") -> None:
    """``lr_scheduler_type`` names one of transformers' schedulers (imports transformers, only
    for a name other than RLArgs' default).

    Raises:
        ConfigError: naming the key, the closest scheduler and every valid one.
    """
    name = getattr(name, "value", name)
    if name == rl_fields()["lr_scheduler_type"].default:
        return
    from transformers.trainer_utils import SchedulerType

    schedulers = [s.value for s in SchedulerType]
    if name not in schedulers:
        raise ConfigError(f"{p}lr_scheduler_type: unknown scheduler {name!r}{suggest(str(name), schedulers)}; "
                          f"one of: {', '.join(schedulers)}")


def choose_weight_sync(requested: str, trainer_device: str, server_devices: list[str],
                       server_is_local: bool = True) -> str:
    """The weight-sync transport for where the trainer and the server's workers run: ``auto``
    resolved, any other choice checked. The launcher asks with the devices of the file's GPU
    layout (``layout.layout_devices``), the trainer again with the devices it finds.

    Args:
        requested: one of ``WEIGHT_SYNC_CHOICES``.
        trainer_device: the trainer's GPU (any id, e.g. a UUID), or ``"cpu"``.
        server_devices: one GPU id (or ``"cpu"``) per vLLM worker.
        server_is_local: the server listens on this machine (the NCCL group and CUDA IPC need that).
    Returns:
        ``"nccl"`` when the trainer and every vLLM worker are on different GPUs of this machine,
        ``"ipc"`` when they are all on the trainer's GPU, ``"filesystem"`` otherwise, for
        ``auto``; else ``requested``.
    Raises:
        ConfigError: a transport that cannot work there (one line naming the key).
    """
    if requested not in WEIGHT_SYNC_CHOICES:
        raise ConfigError(f"weight_sync: expected one of {', '.join(WEIGHT_SYNC_CHOICES)}, got {requested!r}")
    on_cpu = trainer_device == "cpu" or "cpu" in server_devices
    shared = trainer_device in server_devices
    all_shared = bool(server_devices) and all(d == trainer_device for d in server_devices)
    if requested == "auto":
        if not server_is_local or on_cpu:
            return "filesystem"
        return "ipc" if all_shared else "filesystem" if shared else "nccl"
    if requested in ("nccl", "ipc") and on_cpu:
        raise ConfigError(f"weight_sync = '{requested}' needs the trainer and the vLLM server on GPUs "
                          "(inference.gpus >= 1 and trainer.gpus >= 1); use 'filesystem' on the CPU")
    if requested == "nccl" and shared:
        raise ConfigError("weight_sync = 'nccl' cannot connect two ranks on one GPU, and the trainer shares a GPU "
                          "with the vLLM server (inference.shared = true); use 'ipc', 'filesystem' or 'lora'")
    if requested == "ipc" and not (all_shared and server_is_local):
        raise ConfigError("weight_sync = 'ipc' needs every vLLM worker on the trainer's GPU, on this machine "
                          "(inference.shared = true); use 'nccl' or 'filesystem'")
    return requested


REPORT_TO_CHOICES = ("none", "wandb")


def check_sampling_and_lora(a: dict[str, Any], p: str = "") -> None:
    """Value ranges of the sampling keys (vLLM's and OpenAI's), the LoRA keys (peft's), the
    logging keys and a few optimizer keys, so that none fails later inside a library.

    Raises:
        ConfigError: naming the key, its value and the range.
    """
    s = {**SAMPLING_DEFAULTS, **{k: v for k, v in a.items() if k in SAMPLING_DEFAULTS and v is not None}}
    ranges = [("top_p", 0 < s["top_p"] <= 1, "0 < top_p <= 1"),
              ("top_k", a["top_k"] is None or a["top_k"] == -1 or a["top_k"] >= 1, "top_k >= 1, or -1 / unset for off"),
              ("min_p", 0 <= s["min_p"] <= 1, "0 <= min_p <= 1"),
              ("repetition_penalty", s["repetition_penalty"] > 0, "repetition_penalty > 0"),
              ("presence_penalty", -2 <= s["presence_penalty"] <= 2, "-2 <= presence_penalty <= 2"),
              ("frequency_penalty", -2 <= s["frequency_penalty"] <= 2, "-2 <= frequency_penalty <= 2"),
              ("lora_alpha", a["lora_alpha"] > 0, "lora_alpha > 0"),
              ("lora_dropout", 0 <= a["lora_dropout"] < 1, "0 <= lora_dropout < 1"),
              ("max_grad_norm", a.get("max_grad_norm", 1.0) >= 0, "max_grad_norm >= 0 (0: no clipping)"),
              ("weight_decay", a.get("weight_decay", 0.0) >= 0, "weight_decay >= 0"),
              ("warmup_steps", a.get("warmup_steps", 0) >= 0, "warmup_steps >= 0"),
              ("save_steps", a["save_steps"] > 0, "save_steps > 0"),
              ("logging_steps", a["logging_steps"] > 0, "logging_steps > 0"),
              ("log_rollouts_every", a["log_rollouts_every"] >= 0, "log_rollouts_every >= 0 (0: none)"),
              ("num_eval_examples", a["num_eval_examples"] == -1 or a["num_eval_examples"] > 0,
               "num_eval_examples > 0, or -1 for all")]
    for key, ok, expected in ranges:
        if not ok:
            raise ConfigError(f"{p}{key}: expected {expected}, got {a[key]!r}")
    targets = a["lora_target_modules"]
    if targets is not None and not (isinstance(targets, str) and targets or isinstance(targets, list) and targets
                                    and all(isinstance(t, str) and t for t in targets)):
        raise ConfigError(f"{p}lora_target_modules: expected \"all-linear\", a module name or a non-empty list of "
                          f"module names, got {targets!r}")
    save = a["lora_modules_to_save"]
    if save is not None and not all(isinstance(t, str) and t for t in save):
        raise ConfigError(f"{p}lora_modules_to_save: expected a list of module names, got {save!r}")
    report_to = a["report_to"]
    for value in report_to if isinstance(report_to, list) else [report_to]:
        if value not in REPORT_TO_CHOICES:
            raise ConfigError(f"{p}report_to: expected one of {', '.join(REPORT_TO_CHOICES)} (or a list of them), "
                              f"got {value!r}{suggest(str(value), REPORT_TO_CHOICES)}")


def check_output_dir(output_dir: str, p: str = "") -> None:
    """``output_dir`` can be created and written: a file (or, when it does not exist yet, a
    directory) is made in it or in its nearest existing parent and removed again, so the check
    leaves nothing behind. A real write, not ``os.access``: as root ``access`` says yes to
    ``/proc``, read-only mounts and the like. The probe's name is unique (several trainer
    processes check at once).

    Raises:
        ConfigError: naming the key and the path that blocks it.
    """
    import os
    import tempfile
    from pathlib import Path

    path = Path(output_dir).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{p}output_dir: {existing} is a file, not a directory (output_dir = {output_dir!r})")
    try:
        if existing == path:
            fd, probe = tempfile.mkstemp(dir=existing, prefix=".vf-rl-write-check-")
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".vf-rl-write-check-"))
    except OSError as exc:
        raise ConfigError(f"{p}output_dir: cannot write to {existing} ({exc.strerror}) (output_dir = "
                          f"{output_dir!r}); choose a directory you can write") from None


def check_recipe_args(a: dict[str, Any], p: str = "") -> None:
    """Rules of the filtering, ``beta`` and ``max_off_policy_steps`` keys.

    Raises:
        ConfigError: naming the key.
    """
    if a["difficulty_threshold"] < 0:
        raise ConfigError(f"{p}difficulty_threshold: must not be negative, got {a['difficulty_threshold']}")
    if a["oversampling_factor"] < 1:
        raise ConfigError(f"{p}oversampling_factor: must be at least 1, got {a['oversampling_factor']}")
    if a["max_filter_rounds"] < 1:
        raise ConfigError(f"{p}max_filter_rounds: must be positive, got {a['max_filter_rounds']}")
    low, high = a["difficulty_min_reward"], a["difficulty_max_reward"]
    if low is not None and high is not None and low >= high:
        raise ConfigError(f"{p}difficulty_min_reward ({low}) must be below difficulty_max_reward ({high})")
    if a["beta"] < 0:
        raise ConfigError(f"{p}beta: must not be negative, got {a['beta']}")
    if a["max_off_policy_steps"] < 1:
        raise ConfigError(f"{p}max_off_policy_steps: must be at least 1 (1 = one step off-policy), "
                          f"got {a['max_off_policy_steps']}")


def check_batch_keys(a: dict[str, Any], p: str = "") -> None:
    """TrainingArguments' batch keys, which vf-rl derives itself, must not ask for something else.

    Raises:
        ConfigError: ``per_device_train_batch_size`` other than ``micro_batch_size`` (or its
            default 8), ``gradient_accumulation_steps`` other than 1; naming the key to use.
    """
    if a.get("per_device_train_batch_size", 8) not in (8, a["micro_batch_size"]):
        raise ConfigError(f"{p}per_device_train_batch_size: use {p}micro_batch_size (rollouts per forward pass "
                          f"per process) and {p}batch_size (rollouts per optimizer step)")
    if a.get("gradient_accumulation_steps", 1) != 1:
        raise ConfigError(f"{p}gradient_accumulation_steps: use {p}batch_size (rollouts per optimizer step); "
                          "its micro batches are accumulated for you")
