"""The one error a bad config raises, and the nearest-name hint its messages carry."""

from __future__ import annotations

import difflib


class ConfigError(ValueError):
    """A bad config: the message is one line naming the key (and the file, from the TOML path)."""


def suggest(key: str, valid) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``valid``, or ``""``."""
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""
