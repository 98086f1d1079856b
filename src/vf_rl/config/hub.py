"""Whether the Hugging Face hub can be asked: offline switches and a quick reachability check."""

from __future__ import annotations

import os


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``."""
    return os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub answers within ``timeout`` seconds (``HF_ENDPOINT``, proxies honoured).
    Saves ``datasets``' retries (about 25 s) on a machine without network."""
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        httpx.head(endpoint, timeout=timeout)
        return True
    except httpx.HTTPError:
        return False
