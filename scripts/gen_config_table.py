"""Regenerate the configuration reference (docs/configuration.md) from the schema (RLArgs and the
TOML sections). The docs site also renders it at build time (scripts/docs_hooks.py).

    python scripts/gen_config_table.py          # rewrite docs/configuration.md between the markers
    python scripts/gen_config_table.py --check  # exit 1 if docs/configuration.md is out of date
"""

import dataclasses
import sys
from pathlib import Path

from pydantic import BaseModel

from vf_rl.config.args import rl_fields
from vf_rl.config.schema import EnvSection, InferenceSection, TrainerSection, VfRlConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"


def table() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    sections = [("", VfRlConfig), ("env.", EnvSection), ("inference.", InferenceSection), ("trainer.", TrainerSection)]
    for prefix, model in sections:
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) or name == "resolved":
                continue  # a section itself, or the marker of a resolved file
            default = "required" if field.is_required() else f"`{field.get_default(call_default_factory=True)!r}`"
            rows.append(f"| `{prefix}{name}` | {default} | {field.description or ''} |")
    for name, spec in rl_fields().items():
        default = "" if spec.default is dataclasses.MISSING else f"`{spec.default!r}`"
        rows.append(f"| `trainer.args.{name}` | {default} | {' '.join(spec.metadata.get('help', '').split())} |")
    rows.append("| `trainer.args.*` | | any other `transformers.TrainingArguments` field |")
    return "\n".join(rows)


def render(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> int:
    text = PAGE.read_text()
    new = render(text)
    if "--check" in sys.argv:
        if new != text:
            print("docs/configuration.md's table is out of date: run python scripts/gen_config_table.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
