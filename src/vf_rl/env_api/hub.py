"""Where an environment's data comes from: the Hugging Face hub, or data shipped offline.

Every built-in environment takes ``source = "auto" | "hub" | "offline"``: ``"auto"`` tries the
hub (unless ``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``) and falls back to the offline
data with a warning; ``"hub"`` fails if the hub does; ``"offline"`` never touches the network.
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

from vf_rl.config.hub import hub_offline, hub_reachable  # noqa: F401  (this module's API)

logger = logging.getLogger(__name__)
T = TypeVar("T")
SOURCES = ("auto", "hub", "offline")


def check_source(source: str, env_name: str) -> None:
    """Raises ValueError unless ``source`` is one of :data:`SOURCES`."""
    if source not in SOURCES:
        raise ValueError(f"{env_name}: source must be one of {', '.join(SOURCES)}, got {source!r}")


def hub_or_offline(env_name: str, source: str, load_hub: Callable[[], T], load_offline: Callable[[], T]) -> T:
    """``load_hub()`` or ``load_offline()`` as ``source`` says.

    Raises:
        ValueError: unknown ``source``.
        Exception: whatever ``load_hub`` raises, when ``source="hub"``.
    """
    check_source(source, env_name)
    if source == "offline" or (source == "auto" and hub_offline()):
        return load_offline()
    if source == "auto" and not hub_reachable():
        logger.warning("%s: the hub is unreachable; using the offline data", env_name)
        return load_offline()
    try:
        return load_hub()
    except Exception as exc:
        if source == "hub":
            raise
        logger.warning("%s: hub data unavailable (%s); using the offline data", env_name, type(exc).__name__)
        return load_offline()
