"""Regenerate the metrics reference (docs/metrics.md) from its one declaration,
``vf_rl.config.metric_catalog.METRICS``. The docs site also renders it at build time
(scripts/docs_hooks.py), and tests/test_metric_catalog.py checks the file is current.

    python scripts/gen_metrics_page.py          # rewrite docs/metrics.md between the markers
    python scripts/gen_metrics_page.py --check  # exit 1 if docs/metrics.md is out of date
"""

import re
import sys
from pathlib import Path

from generated_page import replace_between, write_or_check

from vf_rl.config.metric_catalog import GROUPS, METRICS, Metric

PAGE = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
START, END = "<!-- metrics-table:start -->", "<!-- metrics-table:end -->"


def anchor(key: str) -> str:
    """The HTML id of a key's row (``reward/within_group_std`` -> ``reward-within_group_std``)."""
    return "".join(c if c.isalnum() or c in "_-" else "-" for c in key.replace("<", "").replace(">", ""))


# a name written in plain text that reads as code: a key or setting with "_" or "/" (top_p, errors/*, <output_dir>/logs)
NAME = re.compile(r"(?<![\w`])(?:<[a-z_]+>|[a-z][a-z0-9]*)(?:[_/](?:<[a-z_]+>|[a-z0-9*]+|\.[a-z]+))+(?:\.[a-z]+)?(?![\w`])")


def cell(text: str) -> str:
    """``text`` for a table cell: names (``top_p``, ``errors/*``) as code, ``|`` and ``<`` escaped outside code."""
    out = []
    for i, part in enumerate(text.split("`")):
        if i % 2:  # already code
            out.append(f"`{part}`")
            continue
        pieces = NAME.split(part)
        names = NAME.findall(part)
        for j, piece in enumerate(pieces):
            out.append(piece.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;"))
            if j < len(names):
                out.append(f"`{names[j]}`")
    return "".join(out)


def row(m: Metric) -> str:
    notes = []
    if m.when:
        notes.append(f"Logged with {m.when}.")
    if m.console:
        notes.append(f"Step line: `{m.console}`.")
    if m.rollouts:
        notes.append(f"Also `eval/{m.key}`.")
    meaning = " ".join([cell(m.meaning), *(f"*{n}*" if "`" in n else f"*{cell(n)}*" for n in notes)])
    key = f'<span id="{anchor(m.key)}"></span>`{m.key}`<br>{cell(m.unit)}'
    healthy = f"**Healthy:** {cell(m.healthy)}<br>" if m.healthy else ""
    return f"| {key} | {meaning} | {healthy}**Otherwise:** {cell(m.action)} |"


def tables() -> str:
    parts = []
    for group in GROUPS:
        parts += [f"## {group}", "", "| key, unit | meaning | healthy range, and what to do outside it |", "|---|---|---|",
                  *(row(m) for m in METRICS if m.group == group), ""]
    return "\n".join(parts).rstrip()


def render(text: str) -> str:
    return replace_between(text, START, END, tables())


def main() -> int:
    return write_or_check(PAGE, render, "gen_metrics_page.py")


if __name__ == "__main__":
    sys.exit(main())
