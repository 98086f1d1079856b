"""Regenerate the configuration reference (docs/configuration.md) from the schema (RLArgs and the
TOML sections): one table per TOML table, and ``[trainer.args]`` in groups by task, the groups
being the comment lines that head each run of fields in ``RLArgs`` (``src/vf_rl/config/args.py``).
The docs site also renders it at build time (scripts/docs_hooks.py).

    python scripts/gen_config_table.py          # rewrite docs/configuration.md between the markers
    python scripts/gen_config_table.py --check  # exit 1 if docs/configuration.md is out of date
"""

import dataclasses
import json
import re
import sys
from pathlib import Path

from generated_page import replace_between, write_or_check
from pydantic import BaseModel

from vf_rl.config import args as args_module
from vf_rl.config.args import rl_fields
from vf_rl.config.schema import EnvSection, InferenceSection, TrainerSection, VfRlConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"

# each RLArgs comment group's title on the page (by the comment's first words)
GROUP_TITLES = {"TrainingArguments fields": "The run: length, learning rate, output", "Batch": "Batch sizes and lengths",
                "Sampling": "Sampling", "LoRA": "LoRA", "Algorithm": "Loss and advantage", "Loss masks": "Loss masks",
                "KL to the reference": "KL to the reference", "Off-policy depth": "Off-policy depth",
                "Online difficulty filtering": "Difficulty filtering", "Inference server": "Inference server",
                "Weight sync": "Weight sync", "Other": "Speed and memory"}
# keys whose task is another group than the comment above them says, and groups of their own
EVALUATION, CHECKPOINTS, LOGGING, PRECISION = ("Evaluation", "Checkpoints and resume", "Checks and logging",
                                               "Precision and data loading")
KEY_GROUP = {"shuffle_dataset": "Batch sizes and lengths", "preflight": LOGGING, "health_stop": LOGGING, "logging_steps": LOGGING,
             "log_rollouts_every": LOGGING, "report_to": LOGGING, "wandb": LOGGING, "save_steps": CHECKPOINTS,
             "save_only_model": CHECKPOINTS, "resume_from_checkpoint": CHECKPOINTS, "eval_on_start": EVALUATION,
             "num_eval_examples": EVALUATION, "eval_rollouts_per_example": EVALUATION, "bf16": PRECISION,
             "remove_unused_columns": PRECISION, "dataloader_pin_memory": PRECISION}
ORDER = ["The run: length, learning rate, output", "Batch sizes and lengths", "Sampling", "LoRA", "Loss and advantage",
         "Loss masks", "KL to the reference", "Off-policy depth", "Difficulty filtering", EVALUATION, CHECKPOINTS, LOGGING,
         "Inference server", "Weight sync", "Speed and memory", PRECISION]
"""The groups in the page's order (a group not named here: at the end)."""
GROUP_NOTES = {EVALUATION: "Evaluation during training is turned on by two `TrainingArguments` fields: "
                           "`eval_strategy = \"steps\"` and `eval_steps = N`."}
SECTIONS = [("Top level", "", VfRlConfig), ("`[env]`", "env.", EnvSection), ("`[inference]`", "inference.", InferenceSection),
            ("`[trainer]`", "trainer.", TrainerSection)]


def default_of(value) -> str:
    """A default as a TOML file writes it (``true``, ``"none"``, ``[]``); ``None`` as ``unset``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (int, float)):
        return f"`{value!r}`"
    return f"`{json.dumps(value)}`"


def cell(value: str) -> str:
    """A meaning for a table cell: ``|`` escaped, and ``<`` outside code written as a character (not a tag)."""
    parts = value.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def trainer_arg_groups() -> dict[str, list[str]]:
    """``{title: [key, ...]}`` of RLArgs' fields, grouped by the comment line above each run of
    fields in its source (or :data:`KEY_GROUP`), in :data:`ORDER` (a group it does not name: at the end)."""
    fields = rl_fields()
    groups: dict[str, list[str]] = {}
    title = "Other"
    source = Path(args_module.__file__).read_text().split("class RLArgs", 1)[1]
    for line in source.splitlines():
        if m := re.match(r"^    # (.+)$", line):
            words = m.group(1)
            title = next((t for start, t in GROUP_TITLES.items() if words.startswith(start)),
                         re.sub(r"\s*\(.*", "", words))
        elif (m := re.match(r"^    (\w+):", line)) and m.group(1) in fields:
            groups.setdefault(KEY_GROUP.get(m.group(1), title), []).append(m.group(1))
    placed = {k for keys in groups.values() for k in keys}
    assert placed == set(fields), f"RLArgs fields not found in its source: {sorted(set(fields) - placed)}"
    return dict(sorted(groups.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))


def table() -> str:
    head = ["| key | default | meaning |", "|---|---|---|"]
    out = ["## The file's tables", ""]
    for title, prefix, model in SECTIONS:
        rows = []
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) or name == "resolved":
                continue  # a section itself, or the marker of a resolved file
            default = "required" if field.is_required() else default_of(field.get_default(call_default_factory=True))
            rows.append(f"| `{prefix}{name}` | {default} | {cell(field.description or '')} |")
        out += [f"### {title}", "", *head, *rows, ""]
    out += ["## `[trainer.args]`", "",
            "vf-rl's trainer keys by task, then the `transformers.TrainingArguments` defaults it changes for RL; any "
            "other `TrainingArguments` field (`trainer.args.*`: `warmup_steps`, `max_grad_norm`, "
            "`gradient_checkpointing`, `seed`...) may be set too.", ""]
    fields = rl_fields()
    for title, keys in trainer_arg_groups().items():
        out += [f"### {title}", "", *([GROUP_NOTES[title], ""] if title in GROUP_NOTES else []), *head]
        for name in keys:
            spec = fields[name]
            default = (default_of(spec.default_factory()) if spec.default_factory is not dataclasses.MISSING
                       else "" if spec.default is dataclasses.MISSING else default_of(spec.default))
            out.append(f"| `trainer.args.{name}` | {default} | {cell(' '.join(spec.metadata.get('help', '').split()))} |")
        out.append("")
    return "\n".join(out).rstrip()


def render(text: str) -> str:
    return replace_between(text, START, END, table())


def main() -> int:
    return write_or_check(PAGE, render, "gen_config_table.py")


if __name__ == "__main__":
    sys.exit(main())
