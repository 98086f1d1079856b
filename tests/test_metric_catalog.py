"""Every key a run logs is declared once, in ``vf_rl.config.metric_catalog`` (meaning, unit, healthy
range, what to do), and docs/metrics.md is generated from it. The keys are taken from the code, not
from a hand list:

- the metrics dicts ``src/vf_rl`` builds (every dict key or stored item of the form ``a/b``, read
  from the source: GPU-only, multi-server and fault paths included);
- each built-in loss's statistics, computed by ``micro_batch_loss`` with a KL reference;
- the rollout statistics, under their own names and as ``eval/<key>``;
- the metrics.jsonl files of real GPU runs kept under benchmarks/results;
- a real 2-step ``vf-train`` run against the session's CPU server, with evaluation, a KL
  reference and difficulty filtering on: every key of its metrics.jsonl (transformers' own too);
  and every declared entry is seen in one of these.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vf_rl.config.metric_catalog import GROUPS, METRICS, find, step_line_keys

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vf_rl"
SHAPE = re.compile(r"^[a-z_]+(?:/(?:[a-z_]+|\{\}))+$")  # a metric key as the source writes it ({} for an f-string field)
# declared for code landing beside this declaration (the trainer's health rules, the out-of-memory split, the
# repeated-completions statistic): not yet required to be seen; drop a key from here once its code is in
DECLARED_AHEAD = {"oom/splits"}


def how_to_declare(keys, where: str) -> str:
    """The failure message: which keys lack an entry, and exactly what to add."""
    return (f"{where} logs {sorted(keys)}, which src/vf_rl/config/metric_catalog.py does not declare. Add to METRICS "
            f"there, in its group (one of GROUPS), one entry per key: Metric(\"<key>\", <GROUP>, \"<unit>\", "
            f"\"<meaning>\", \"<healthy range>\", \"<what to do when out of it>\"[, when=\"<when it is logged>\", "
            f"console=\"<its step-line label>\", rollouts=True if it is a rollout statistic also logged as eval/<key>]); "
            f"a family of keys is one entry with a <placeholder> (\"health/<rule>\", \"reward/<func>\"). Then run "
            f"python scripts/gen_metrics_page.py (docs/metrics.md is generated from it).")


def source_keys() -> dict[str, str]:
    """``{key: "file:line"}`` of every ``a/b`` key that a dict literal, a dict comprehension or an
    item assignment in ``src/vf_rl`` writes; an f-string's fields become ``{}``."""
    def text(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        return None

    found = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            keys = (node.keys if isinstance(node, ast.Dict) else [node.key] if isinstance(node, ast.DictComp)
                    else [node.slice] if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) else [])
            for key in filter(None, keys):
                if (t := text(key)) and SHAPE.match(t):
                    found.setdefault(t, f"{path.relative_to(ROOT)}:{key.lineno}")
    return found


def declared(key: str) -> bool:
    """A concrete key, or a source key with ``{}`` fields: some entry declares it (a field matches
    a placeholder, or the exact keys it can be, ``timing/{}`` -> ``timing/wait_s``)."""
    if "{}" not in key:
        return find(key) is not None
    shape = re.compile("^" + re.escape(key).replace(r"\{\}", ".+") + "$")
    return find(key.replace("{}", "x")) is not None or any(shape.match(m.key) for m in METRICS)


def loss_stat_keys() -> set[str]:
    """The statistics of every built-in loss and the example's, as ``micro_batch_loss`` returns them
    with a KL reference (``kl_ref``); seeded tensors of two sequences."""
    sys.path.insert(0, str(ROOT / "examples"))
    from types import SimpleNamespace

    from custom_loss import gspo_loss as example_loss

    from vf_rl.algorithm.loss import LossInputs, micro_batch_loss
    from vf_rl.config.choices import builtin_functions

    g = torch.Generator().manual_seed(0)
    args = SimpleNamespace(mask_ratio_low=0.125, mask_ratio_high=8.0, epsilon_low=0.2, epsilon_high=0.28, beta=0.1,
                           max_tokens=4, max_seq_len=8)
    keys = set()
    losses = [*builtin_functions("loss").values(), "custom_loss:gspo_loss"]
    assert len(losses) >= 7, losses  # cispo, dapo, grpo, dr_grpo, bnpo, gspo and the example
    for name in losses:
        fn = example_loss if name == "custom_loss:gspo_loss" else _import(name)
        inputs = LossInputs(torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g), torch.tensor([1.0, -1.0]),
                            torch.tensor([[True, True, True, False], [True, True, False, False]]),
                            torch.rand(2, 4, generator=g), torch.randn(2, 4, generator=g))
        _, stats = micro_batch_loss(fn, inputs, args, 5.0)
        keys |= set(stats)
    return keys


def _import(path: str):
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def rollout_stat_keys() -> set[str]:
    """``rollout_metrics`` and ``env_metrics`` of real rollouts: failed ones (every error kind), tool
    calls, two reward functions, a mixture of two environments."""
    from vf_rl.env_api.errors import KINDS
    from vf_rl.env_api.rollout import Rollout, Turn
    from vf_rl.orchestrator.metrics import env_metrics, rollout_metrics

    turn = Turn([1, 2], [3, 4], [-0.5, -0.25])
    rollouts = [Rollout(i, [{"role": "user", "content": "q"}], turns=[turn], reward=i / 4, state={"tool_calls": 1},
                        metrics={"lcs_reward_func": i / 4, "format_reward": 1.0}) for i in range(4)]
    rollouts[1].error, rollouts[1].error_kind = "boom", KINDS[0]
    rows = [{"env": "reverse-text"}, {"env": "alphabet-sort"}]
    return {*rollout_metrics(rollouts, 2), *env_metrics(rows, rollouts, 2)}


def recorded_keys() -> set[str]:
    """The keys of the real runs' metrics.jsonl files under benchmarks/results (GPU runs: memory, pushes);
    ``run`` labels the run a line came from where one file holds several runs, and is no metric."""
    files = sorted((ROOT / "benchmarks" / "results").glob("*.metrics.jsonl"))
    assert files
    return {k for f in files for line in f.read_text().splitlines() if line.strip() for k in json.loads(line)} - {"run"}


def test_metrics_page_is_generated_from_the_catalog():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_metrics_page.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_entry_is_whole():
    assert len({m.key for m in METRICS}) == len(METRICS), "a key declared twice"
    for m in METRICS:
        assert m.group in GROUPS and m.unit and m.meaning and m.action, m
        assert m.meaning.endswith(".") and m.action.endswith("."), f"{m.key}: whole sentences"


def test_every_key_the_source_builds_is_declared():
    found = source_keys()
    assert {"reward/std", "errors/{}", "timing/{}", "memory/peak_gib", "servers/{}/rollouts"} <= set(found)
    missing = {f"{k} ({where})" for k, where in found.items() if not declared(k)}
    assert not missing, how_to_declare(missing, "the source")


def test_every_loss_statistic_is_declared():
    keys = loss_stat_keys()
    assert {"importance_ratio", "kl_ref", "masked/low_fraction", "clipped/high_fraction", "sequence_ratio"} <= keys
    missing = {k for k in keys if find(k) is None}
    assert not missing, how_to_declare(missing, "a built-in loss (LossOutput.stats)")


def test_rollout_statistics_are_declared_for_training_and_evaluation():
    keys = rollout_stat_keys()
    assert {"errors/model", "tools/calls", "reward/format_reward", "env/alphabet-sort/reward"} <= keys
    missing = {k for k in keys if find(k) is None}
    assert not missing, how_to_declare(missing, "orchestrator/metrics.py")
    not_eval = {k for k in keys if find(f"eval/{k}") is None}
    assert not not_eval, (f"an evaluation logs eval/<key> for {sorted(not_eval)}: set rollouts=True on their "
                          "entries in src/vf_rl/config/metric_catalog.py")
    assert find("eval/timing_s").key == "eval/timing_s" and find("eval/loss") is None  # loss is no rollout statistic


def test_recorded_runs_log_only_declared_keys():
    keys = recorded_keys()
    assert {"memory/peak_gib", "timing/sync_push_s"} <= keys
    missing = {k for k in keys if find(k) is None}
    assert not missing, how_to_declare(missing, "a recorded run (benchmarks/results/*.metrics.jsonl)")


def test_step_line_shows_the_keys_declared_with_its_labels(capsys):
    """The Trainer pane's step line, given a distinct value for each key: each declared label shows its
    key's value, and the line has no other field."""
    from vf_rl.trainer import display

    shown = step_line_keys()
    logs = {key: 1000.0 + i for i, (_, key) in enumerate(shown)}
    display.step_line(3, 30, logs)
    line = capsys.readouterr().out
    for label, key in shown:
        assert re.search(rf"\b{re.escape(label)}[= ]{logs[key]:.0f}\.", line), (label, key, line)
    fields = re.findall(r"\b([a-z_]+)[= ]\d", line.split(":", 1)[1])
    assert sorted(fields) == sorted(label for label, _ in shown), (
        f"the step line shows {fields}; set console=\"<label>\" on the entries of src/vf_rl/config/metric_catalog.py")


@pytest.mark.server
def test_a_real_run_logs_only_declared_keys(server, model_dir, tmp_path, restore_base_weights):
    """Two steps of ``vf-train`` with evaluation (at step 0 and 2), a KL reference and difficulty
    filtering: every key of its metrics.jsonl is declared; every declared entry is logged by this run,
    built by the source, computed by a loss or a rollout statistic, or recorded by a GPU run."""
    from conftest import write_cpu_config

    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "run.toml", model_dir, out, server.port, max_steps=2, batch_size=8,
                              rollouts_per_example=4, micro_batch_size=8, max_tokens=12, beta=0.01,
                              use_difficulty_filtering=True, eval_strategy="steps", eval_steps=2,
                              num_eval_examples=2, eval_rollouts_per_example=2, save_steps=100)
    result = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    logged = {k for r in records for k in r}
    assert {"reward", "kl_ref", "filter/rounds", "eval/reward", "grad_norm", "train_runtime"} <= logged, logged
    missing = {k for k in logged if find(k) is None}
    assert not missing, how_to_declare(missing, "metrics.jsonl of a real vf-train run")
    seen = logged | recorded_keys() | loss_stat_keys() | rollout_stat_keys() | {"eval/" + k for k in rollout_stat_keys()}
    static = list(source_keys())
    unseen = [m.key for m in METRICS if m.key not in DECLARED_AHEAD and not any(m.pattern().match(k) for k in seen)
              and not any(re.fullmatch(re.escape(k).replace(r"\{\}", ".+"), m.key) or m.pattern().match(k.replace("{}", "x"))
                          for k in static)]
    assert not unseen, (f"src/vf_rl/config/metric_catalog.py declares {unseen}, which nothing logs: remove the entries "
                        "(or name where they are logged)")
