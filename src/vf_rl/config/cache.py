"""vf-rl's cache directory, and facts about installed packages kept there as JSON so that the
launcher reads them without importing the package (vLLM's or transformers' import takes seconds
and brings torch).

``$VF_RL_CACHE``, default ``~/.cache/vf-rl``: the prepared CPU model (``models/``) and one JSON
file per fact and package version (``vllm-serve-options-<version>.json``,
``training-arguments-<version>.json``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any, Callable


def cache_dir() -> Path:
    """``$VF_RL_CACHE`` (default ``~/.cache/vf-rl``), ``~`` expanded; not created here."""
    return Path(os.environ.get("VF_RL_CACHE", Path.home() / ".cache" / "vf-rl")).expanduser()


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (read from its metadata, not imported), or
    ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cached_json(name: str, compute: Callable[[], Any]) -> Any:
    """The JSON value stored as ``<cache_dir>/<name>.json``; when there is none (or it does not
    parse), ``compute()``, stored for next time unless it is ``None``. The file is written whole
    (a temporary file renamed), so a reader never sees half of it; a cache that cannot be written
    costs only the next call's ``compute()``."""
    path = cache_dir() / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    value = compute()
    if value is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(value))
            os.replace(tmp, path)
        except OSError:
            pass
    return value
