"""A docs page whose part between two markers is generated (the configuration keys' table, the
metrics reference): the page with that part replaced, and the command line that writes it or checks it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable


def replace_between(text: str, start: str, end: str, body: str) -> str:
    """``text`` with what lies between the markers ``start`` and ``end`` replaced by ``body``.

    Raises:
        ValueError: when a marker is missing.
    """
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def write_or_check(page: Path, render: Callable[[str], str], script: str) -> int:
    """Write ``page`` rendered, or with ``--check`` exit 1 (saying which ``script`` to run) when it is stale."""
    text = page.read_text()
    new = render(text)
    if "--check" in sys.argv:
        if new != text:
            print(f"docs/{page.name} is out of date: run python scripts/{script}")
            return 1
        return 0
    page.write_text(new)
    return 0
