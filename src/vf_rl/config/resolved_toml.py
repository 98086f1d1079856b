"""``<output_dir>/resolved.toml``: a resolved run config (``schema.resolve``) as a TOML file,
every value with where it came from.

``vf-rl`` writes it before anything starts; ``vf-train`` and ``vf-vllm`` read it as their config
(its ``[resolved]`` table tells ``schema.load_config`` not to resolve it again), and ``vf-rl
--dry-run`` prints it. Keys left unset (``None``: the environment's value or a built-in
default applies in the trainer) are listed as comments. A run started from Python (``RLTrainer``)
writes its trainer arguments there (:func:`python_run_toml`), unless ``vf-rl`` or ``vf-train`` wrote
the file for this run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import tomli_w

from vf_rl.config.args import rl_fields
from vf_rl.config.schema import VfRlConfig

RESOLVED_NAME = "resolved.toml"
COMMENT_COLUMN = 48  # origins line up here (a longer line gets one space before its comment)
PYTHON_RUN_HEADER = "# vf-rl: the resolved trainer arguments of a run started from Python (RLTrainer)."


def _value(value: Any) -> str:
    """One TOML value on one line (arrays inline)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _table(name: str, values: dict[str, Any], origins: dict[str, str], unset: dict[str, str] | None = None) -> list[str]:
    lines, tables = [f"[{name}]"], []
    width = min(max((len(k) + len(_value(v)) for k, v in values.items() if not isinstance(v, dict)), default=0) + 3,
                COMMENT_COLUMN)
    for key, value in values.items():
        if isinstance(value, dict):
            tables.append((key, value))
            continue
        line = f"{key} = {_value(value)}"
        origin = origins.get(f"{name}.{key}")
        lines.append(f"{line:<{width}} # {origin}" if origin else line)
    for key, why in (unset or {}).items():
        lines.append(f"# {key}: unset ({why})")
    for key, value in tables:
        lines += ["", *_table(f"{name}.{key}", value, origins)]
    return lines


def to_toml(config: VfRlConfig) -> str:
    """The resolved ``config`` as TOML text with origins as end-of-line comments.

    Raises:
        TypeError: a value TOML cannot hold (only from the Python API; a TOML file's values can).
    """
    origins = config.origins
    lines = ["# vf-rl: the resolved run config; vf-train and vf-vllm read this file.",
             "# After each value: where it came from (config, default, derived: from what).",
             f"model = {_value(config.model)}", "", *_table("resolved", config.resolved.model_dump(), {})]
    for i, env in enumerate(config.envs):
        header = "[[env]]" if isinstance(config.env, list) else "[env]"
        prefix = f"env[{i}]" if isinstance(config.env, list) else "env"
        lines += ["", header, f"id = {_value(env.id)}", f"weight = {_value(env.weight)}"]
        if env.args:
            lines += ["", *_table(f"{prefix}.args" if prefix == "env" else "env.args", env.args, origins)]
    for side in ("inference", "trainer"):
        section = getattr(config, side)
        top = {k: v for k, v in section.model_dump(exclude_none=True).items() if k != "args"}
        unset = None
        if side == "trainer":
            unset = {k: f.metadata.get("help", "") for k, f in rl_fields().items()
                     if k not in section.args and f.default is None}
        lines += ["", *_table(side, top, {}), "", *_table(f"{side}.args", section.args, origins, unset)]
    return "\n".join(lines) + "\n"


def python_run_toml(args: Any, model: str, env: Any) -> str:
    """The trainer arguments of a run started from Python (an ``RLConfig``) as TOML: ``model``,
    the environment when it has a recipe (``load_environment(id, **args)``), and
    ``[trainer.args]``: vf-rl's keys with where each came from (``set``, ``default``, ``derived``)
    and the other TrainingArguments keys set away from their defaults. Values TOML cannot hold
    (a ready ``lora_config``, objects) are left out; ``None`` is listed as unset. A run from
    Python does not know the GPU layout, so ``[inference]`` and ``[trainer]`` are not written:
    with them added, the file is a config ``vf-rl`` launches."""
    import dataclasses
    import enum

    def plain(value: Any) -> Any:
        value = value.value if isinstance(value, enum.Enum) else value
        try:
            _value(value)
        except (TypeError, ValueError):
            return None
        return value

    values, origins = {}, {}
    for key in rl_fields():
        if key != "lora_config" and plain(getattr(args, key)) is not None:
            values[key], origins[f"trainer.args.{key}"] = plain(getattr(args, key)), args.origins.get(key, "")
    for f in dataclasses.fields(args):  # TrainingArguments' own keys, where set
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(args, f.name, None)
        changed = value != default and bool(value or default)  # not e.g. None -> False, "" -> []
        if f.init and f.name not in values and f.name not in rl_fields() and changed and plain(value) is not None:
            values[f.name], origins[f"trainer.args.{f.name}"] = plain(value), "set"
    unset = {k: f.metadata.get("help", "") for k, f in rl_fields().items()
             if k not in values and k != "lora_config" and getattr(args, k) is None}
    lines = [PYTHON_RUN_HEADER, "# After each value: where it came from (set, default, derived: from what).",
             f"model = {_value(model)}", ""]
    recipe = getattr(env, "recipe", None)
    if getattr(getattr(recipe, "func", None), "__name__", "") == "load_environment" and len(recipe.args) == 1:
        lines += ["[env]", f"id = {_value(recipe.args[0])}", ""]
        if recipe.keywords and plain(recipe.keywords) is not None:
            lines += _table("env.args", recipe.keywords, {}) + [""]
    else:
        lines += [f"# env: {type(env).__name__} object (no recipe to name it by)", ""]
    lines += ["# [inference] and [trainer] (gpus, shared): the layout, not known to a run started from Python", "",
              *_table("trainer.args", values, origins, unset)]
    return "\n".join(lines) + "\n"


def record_python_run(args: Any, model: str, env: Any) -> Path | None:
    """Write :func:`python_run_toml` to ``<output_dir>/resolved.toml``, unless ``vf-rl`` or
    ``vf-train`` wrote that file (a run from a TOML file has its full record there already).
    Returns the path written, or ``None``.

    Raises:
        OSError: ``output_dir`` cannot be written.
    """
    path = Path(args.output_dir) / RESOLVED_NAME
    if path.exists() and not path.read_text().startswith(PYTHON_RUN_HEADER):
        return None
    return write_atomically(path, python_run_toml(args, model, env))


def write_resolved(config: VfRlConfig) -> Path:
    """Write ``to_toml(config)`` to ``<output_dir>/resolved.toml`` (atomically: a half-written
    file is never left) and return its path.

    Raises:
        OSError: the directory cannot be created or written.
    """
    return write_atomically(config.output_dir / RESOLVED_NAME, to_toml(config))


def write_atomically(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in its directory, then rename it.

    Raises:
        OSError: the directory cannot be created or written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".resolved-", suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
