"""``<output_dir>/resolved.toml``: a resolved run config (``schema.resolve``) as a TOML file,
every value with where it came from.

``vf-rl`` writes it before anything starts; ``vf-train`` and ``vf-vllm`` read it as their config
(its ``[resolved]`` table tells ``schema.load_config`` not to resolve it again), and ``vf-rl
--dry-run`` prints it. Keys left unset (``None``: the environment's value or a built-in
default applies in the trainer) are listed as comments.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import tomli_w

from .args import rl_fields
from .schema import VfRlConfig

RESOLVED_NAME = "resolved.toml"


def _value(value: Any) -> str:
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _table(name: str, values: dict[str, Any], origins: dict[str, str], unset: dict[str, str] | None = None) -> list[str]:
    lines, tables = [f"[{name}]"], []
    width = max((len(k) + len(_value(v)) for k, v in values.items() if not isinstance(v, dict)), default=0) + 3
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


def write_resolved(config: VfRlConfig) -> Path:
    """Write ``to_toml(config)`` to ``<output_dir>/resolved.toml`` (atomically: a half-written
    file is never left) and return its path.

    Raises:
        OSError: the directory cannot be created or written.
    """
    path = config.output_dir / RESOLVED_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".resolved-", suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(to_toml(config))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
