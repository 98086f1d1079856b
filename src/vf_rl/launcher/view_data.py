"""What ``vf-rl view`` reads of a run directory, without a web page: its metrics
(``metrics.jsonl``: each step's record, the held-out evaluations, ``health/<rule>`` alarms), its
resolved config (``resolved.toml``) and its recorded rollouts (``rollouts/step-NNNNNN.jsonl.gz``,
``trainer/rollout_log.py``). Imports neither torch nor the web framework."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from vf_rl.config.errors import ConfigError
from vf_rl.config.schema import tomllib
from vf_rl.trainer.rollout_log import read_rollouts, recorded_steps, rollouts_path

SECONDS_KEY = "timing/elapsed_s"
"""A step record's seconds since training started: the x axis of the curves against time."""

HEALTH_PREFIX = "health/"
"""Keys ``health/<rule>``: 1 while the rule's alarm is raised at that step, else 0."""


@dataclass
class Run:
    """One run directory as the page shows it.

    Attributes:
        path: the run directory. label: its name on the page (unique among the runs shown).
        steps: the records of ``metrics.jsonl`` with a training step's metrics (``reward`` or
            ``loss``), in file order. evals: the records with ``eval/`` keys (held-out evaluations).
        config: ``resolved.toml`` flattened to dotted keys (``trainer.args.learning_rate``);
            empty when the run has none.
    """

    path: Path
    label: str
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def seconds_at(self, step: int) -> float | None:
        """Seconds since training started when ``step`` ended (0 for step 0, ``None`` when unknown)."""
        if step == 0:
            return 0.0
        return next((r[SECONDS_KEY] for r in self.steps if r.get("step") == step and SECONDS_KEY in r), None)

    def series(self, key: str, against: str = "step") -> tuple[list[float], list[float]]:
        """``(x, y)`` of metric ``key`` over the run: x the step, or with ``against = "seconds"``
        the seconds since training started (points whose time is unknown left out)."""
        rows = self.evals if key.startswith("eval/") else self.steps
        xs, ys = [], []
        for r in rows:
            value = r.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            x = r.get("step") if against == "step" else self.seconds_at(int(r.get("step", -1)))
            if x is not None:
                xs.append(x)
                ys.append(float(value))
        return xs, ys

    def metric_keys(self) -> set[str]:
        """Every numeric key of the run's step and eval records."""
        return {k for r in self.steps + self.evals for k, v in r.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "epoch")}

    def rollout_steps(self) -> list[int]:
        """The steps whose rollouts the run recorded."""
        return recorded_steps(self.path)

    def rollouts(self, step: int) -> list[dict]:
        """The records of step ``step``'s rollouts file (``trainer/rollout_log.py`` lists the fields).

        Raises:
            ConfigError: no such file, or one that cannot be read (one line naming it).
        """
        path = rollouts_path(self.path, step)
        try:
            return read_rollouts(path)
        except (OSError, EOFError, ValueError) as exc:
            raise ConfigError(f"{path}: cannot read the rollouts ({exc})") from None


def flat(table: dict, prefix: str = "") -> dict:
    """A TOML document's nested tables as one dict of dotted keys; arrays are kept as values."""
    out = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flat(value, name + ".")
        else:
            out[name] = value
    return out


def load_run(path: str | Path, label: str | None = None) -> Run:
    """Read run directory ``path``.

    Raises:
        ConfigError: ``path`` is not a directory, has no ``metrics.jsonl``, or a file of it is not
            what it should be (one line naming the file).
    """
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: no such run directory")
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"{metrics} not found (is {path} a vf-rl run directory? a run writes it from its first step)")
    run = Run(path, label or path.name)
    lines = metrics.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # the last line of a run still writing it
            raise ConfigError(f"{metrics}:{number}: not a JSON line") from None
        if any(k.startswith("eval/") for k in record):
            run.evals.append(record)
        if "reward" in record or "loss" in record:
            run.steps.append(record)
    resolved = path / "resolved.toml"
    if resolved.is_file():
        try:
            run.config = flat(tomllib.loads(resolved.read_text()))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{resolved}: not TOML ({exc})") from None
    return run


def labels(paths: list[Path]) -> list[str]:
    """A name for each run directory: its folder name, with as many parent folders as tell it
    apart from the others (``a/run``, ``b/run`` and ``c``); a directory given twice is numbered."""
    resolved = [Path(p).resolve() for p in paths]
    depth = [1] * len(resolved)
    while True:
        names = ["/".join(p.parts[-d:]) for p, d in zip(resolved, depth)]
        clashing = [i for i, name in enumerate(names) if depth[i] < len(resolved[i].parts)
                    and any(other == name and resolved[j] != resolved[i] for j, other in enumerate(names))]
        if not clashing:
            break
        for i in clashing:
            depth[i] += 1
    seen: dict[str, int] = {}
    for i, name in enumerate(names):  # a directory given twice
        seen[name] = seen.get(name, 0) + 1
        names[i] = name if seen[name] == 1 else f"{name} ({seen[name]})"
    return names


def load_runs(paths: list[str | Path]) -> list[Run]:
    """:func:`load_run` for each directory, named by :func:`labels`.

    Raises:
        ConfigError: the first directory that cannot be read.
    """
    return [load_run(p, label) for p, label in zip(paths, labels([Path(p) for p in paths]))]


def config_differences(runs: list[Run], everything: bool = False) -> list[dict]:
    """Rows ``{"key": k, <label>: value, ...}`` for the resolved-config keys whose values differ
    between the runs (a key missing from a run counts as different; shown as ``""``), sorted by
    key; with ``everything`` (or a single run), every key. Values are shown as TOML would write them."""
    keys = sorted(set().union(*(r.config for r in runs))) if runs else []
    rows = []
    for key in keys:
        values = [r.config.get(key, _MISSING) for r in runs]
        if everything or len(runs) == 1 or any(v != values[0] for v in values[1:]):
            rows.append({"key": key, **{r.label: _shown(v) for r, v in zip(runs, values)}})
    return rows


_MISSING = object()


def _shown(value) -> str:
    if value is _MISSING:
        return ""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def alarms(run: Run) -> dict[str, int]:
    """Each ``health/<rule>`` that was raised (1) at some step of ``run``: the first such step."""
    first = {}
    for r in run.steps:
        for key, value in r.items():
            if key.startswith(HEALTH_PREFIX) and value and key not in first:
                first[key] = r.get("step")
    return first


def message_text(messages) -> str:
    """Chat messages as text, one ``role: content`` paragraph per message (tool calls named); text
    (a completion-style environment's prompt or completion) as it is."""
    if isinstance(messages, str):
        return messages
    parts = []
    for m in messages or []:
        if not isinstance(m, dict):
            parts.append(str(m))
            continue
        text = str(m.get("content") or "")
        calls = m.get("tool_calls") or []
        text += "".join(f"\n[tool call] {json.dumps(c, ensure_ascii=False)}" for c in calls)
        parts.append(f"{m.get('role', '?')}: {text}")
    return "\n\n".join(parts)


def groups(records: list[dict]) -> list[list[dict]]:
    """A step's rollout records split into their groups (same ``group``), in order."""
    out: dict[int, list[dict]] = {}
    for r in records:
        out.setdefault(int(r.get("group", 0)), []).append(r)
    return [out[g] for g in sorted(out)]
