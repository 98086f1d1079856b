"""The trainer arguments a run uses: RLArgs' defaults under the given keys, the older key names
mapped, and the defaults that depend on other keys derived, in one place (:func:`resolve_trainer_args`)
for the TOML file (``schema.resolve``) and ``RLConfig``. No torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vf_rl.config.args import OLDER_NAMES, REFUSED_NAMES, rl_fields
from vf_rl.config.rules import ConfigError

DERIVED_FROM = {"output_dir": "outputs/<run_name>", "bf16": "on with a GPU",
                "eval_rollouts_per_example": "rollouts_per_example", "eval_on_start": "on when eval_strategy is not 'no'",
                "torch_compile": "on with a GPU without DeepSpeed, or with torch_compile_backend/torch_compile_mode set",
                "torch_compile_mode": "'reduce-overhead' (recorded layers) with torch_compile on one trainer GPU, "
                                      "padding_free, without gradient_checkpointing or tiled_mlp"}
"""The keys :func:`derive_defaults` fills, and from what (shown in ``resolved.toml``)."""


def origin(key: str, value: Any, given: bool, label: str = "config") -> str:
    """Where a resolved trainer key's value came from, as ``resolved.toml`` says it: ``label``
    when the user gave it, ``derived: <from what>`` when :func:`derive_defaults` filled it with a
    value other than the field's default, else ``default``."""
    if given:
        return label
    field = rl_fields().get(key)
    if key in DERIVED_FROM and (field is None or value != field.default):
        return f"derived: {DERIVED_FROM[key]}"
    return "default"


def derive_defaults(args: dict[str, Any], has_gpu: bool, processes: int = 1) -> dict[str, Any]:
    """The defaults that depend on other keys, filled in where ``args`` leaves them ``None``:
    ``output_dir`` (``outputs/<run_name>``), ``bf16`` (on with a GPU), ``eval_rollouts_per_example``
    (``rollouts_per_example``), ``eval_on_start`` (on when ``eval_strategy`` is not ``"no"``),
    ``torch_compile`` (on with a GPU unless DeepSpeed is used, or when a compile backend or mode
    is given), ``torch_compile_mode`` (``"reduce-overhead"`` where :func:`records_layers_by_default`;
    ``processes``: trainer processes). Returns a new dict."""
    a = dict(args)
    if a.get("output_dir") is None:
        a["output_dir"] = f"outputs/{a.get('run_name') or 'vf-rl'}"
    if a.get("bf16") is None:
        a["bf16"] = has_gpu
    if a.get("eval_rollouts_per_example") is None:
        a["eval_rollouts_per_example"] = a["rollouts_per_example"]
    if a.get("eval_on_start") is None:
        strategy = a.get("eval_strategy") or "no"
        a["eval_on_start"] = getattr(strategy, "value", strategy) != "no"
    if a.get("torch_compile") is None:  # auto: compiled layers measured faster on GPUs (docs/benchmarks.md)
        a["torch_compile"] = bool(has_gpu and not a.get("deepspeed")
                                  or a.get("torch_compile_backend") or a.get("torch_compile_mode"))
    if records_layers_by_default(a, has_gpu, processes):
        a["torch_compile_mode"] = "reduce-overhead"
    return a


def records_layers_by_default(a: dict[str, Any], has_gpu: bool, processes: int) -> bool:
    """Whether a run that leaves ``torch_compile_mode`` unset records its compiled decoder layers as
    CUDA graphs (``"reduce-overhead"``, ``trainer/speed/layer_graphs.py``): with ``torch_compile`` (inductor,
    the default backend) on a GPU, one trainer process, packed micro batches, and neither
    ``gradient_checkpointing``, ``tiled_mlp`` nor DeepSpeed (the cases ``rules`` refuses the mode
    for). There it trains faster than the per-layer compile (``docs/benchmarks.md``)."""
    return bool(has_gpu and a.get("torch_compile") and a.get("torch_compile_mode") is None
                and a.get("torch_compile_backend") in (None, "inductor") and processes == 1 and a.get("padding_free", True)
                and not a.get("gradient_checkpointing") and not a.get("tiled_mlp") and not a.get("deepspeed"))


def resolve_trainer_args(given: dict[str, Any], has_gpu: bool, processes: int = 1) -> dict[str, Any]:
    """The trainer arguments a run uses: ``given`` (older key names mapped, ``rename_older_names``)
    over RLArgs' defaults, with the defaults derived from other keys filled in
    (:func:`derive_defaults`). The one place they are derived, for the TOML file and for
    ``RLConfig``. Sampling keys left ``None`` stay ``None`` (the environment's value, else
    ``args.SAMPLING_DEFAULTS``, applies in the trainer).

    Raises:
        ConfigError: an older name that is refused, or given together with its new name.
    """
    defaults = {name: f.default for name, f in rl_fields().items() if f.default is not dataclasses.MISSING}
    return derive_defaults({**defaults, **rename_older_names(given)}, has_gpu, processes)


def rename_older_names(args: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``args`` with the older key names (``args.OLDER_NAMES``) mapped to the current ones; a
    ``None`` under an older name counts as not given. ``args`` may hold every field (RLConfig's
    path): the new name then counts as given when it differs from its default.

    Raises:
        ConfigError: a key of ``args.REFUSED_NAMES``, or an old and a new name given together.
    """
    out = dict(args)
    for old, hint in REFUSED_NAMES.items():
        if out.pop(old, None) is not None:
            raise ConfigError(f"{prefix}{old}: not supported: {hint}")
    for old, new in OLDER_NAMES.items():
        value = out.pop(old, None)
        if value is None:
            continue
        if new in out and out[new] != rl_fields()[new].default:
            raise ConfigError(f"{prefix}{old} is the older name of {prefix}{new}; set only {new}")
        out[new] = value
    return out
