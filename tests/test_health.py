"""Health rules (trainer/health.py): each rule on metric streams, one alarm per problem, the line and
the flags, health_stop inside the callback, the key's check, and recorded healthy runs replayed
through every rule without an alarm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_cpu_config
from transformers import TrainerControl, TrainerState

from vf_rl.config.rules import HEALTH_RULES
from vf_rl.trainer import health
from vf_rl.trainer.health import RULES, Health, replay

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
HEALTHY = {"reward": 0.3, "reward/zero_std_fraction": 0.0, "completions/duplicate_fraction": 0.02, "entropy": 1.5,
           "mismatch_kl": 0.002, "truncated/rate": 0.1, "grad_norm": 0.5, "errors/rate": 0.0}


def steps(n: int, start: int = 1, **changes) -> list[dict]:
    """``n`` healthy step records from step ``start``; ``changes``: a key's value, or a function of the
    record's index (0-based) giving it."""
    records = []
    for i in range(n):
        record = {"step": start + i, **HEALTHY}
        for key, value in changes.items():
            record[key.replace("__", "/")] = value(i) if callable(value) else value
        records.append(record)
    return records


def raised_at(records: list[dict]) -> dict[str, int]:
    """The step at which each rule was first raised."""
    first = {}
    for step, name, raised, _ in replay(records)[1]:
        if raised:
            first.setdefault(name, step)
    return first


def test_rule_names_are_the_keys_names():
    assert tuple(RULES) == HEALTH_RULES
    for rule in RULES.values():  # each says its threshold, window and source
        doc = rule.read.__doc__
        assert doc and "Measured" in doc and ("arXiv" in doc or "guides" in doc or "pre-flight" in doc), rule.name


def test_a_healthy_stream_raises_nothing():
    assert raised_at(steps(60)) == {}


def test_no_signal_after_five_steps_without_spread():
    assert raised_at(steps(12, reward__zero_std_fraction=1.0)) == {"no_signal": 5}
    # most groups, not all, for long: still raised; a run whose spread comes and goes is not
    assert raised_at(steps(12, reward__zero_std_fraction=0.92)) == {"no_signal": 5}
    assert raised_at(steps(30, reward__zero_std_fraction=lambda i: 1.0 if i % 2 else 0.7)) == {}


def test_entropy_collapse_is_a_fall_to_nearly_nothing_without_reward():
    collapse = steps(20, entropy=lambda i: 3.0 if i < 8 else 0.01, reward=lambda i: 0.3 if i < 8 else 0.0)
    assert raised_at(collapse) == {"entropy_collapse": 10}
    slow = steps(200, entropy=lambda i: 4.0 * 0.985 ** i)  # 4 -> 0.2 over 200 steps, as the CPU demo
    assert raised_at(slow) == {}
    # a run that converged: nearly deterministic, its reward up (a GPU run: 0.23 -> 0.013 nats, reward 0.86 -> 0.99)
    converged = steps(100, entropy=lambda i: 0.23 * 0.97 ** i, reward=lambda i: 0.86 + 0.0013 * i)
    assert raised_at(converged) == {}
    one_step = steps(20, entropy=lambda i: 0.001 if i == 10 else 3.0, reward=0.0)
    assert raised_at(one_step) == {}


def test_mismatch():
    assert raised_at(steps(10, mismatch_kl=lambda i: 0.002 if i < 5 else 0.3)) == {"mismatch": 7}
    assert raised_at(steps(10, mismatch_kl=lambda i: 3.0 if i == 5 else 0.002)) == {}  # one step: median
    assert raised_at(steps(10, mismatch_kl=0.05)) == {}


def test_length_growth_needs_a_rise_to_the_limit():
    growth = steps(20, truncated__rate=lambda i: min(0.1 + 0.1 * i, 1.0))
    assert raised_at(growth) == {"length_growth": 10}
    assert raised_at(steps(20, truncated__rate=0.6)) == {}  # cut from the start: the pre-flight's business


def test_held_out_drop_needs_reward_up_and_held_out_down():
    records = steps(20, reward=lambda i: 0.2 + 0.02 * i)
    evals = {0: 0.30, 5: 0.31, 10: 0.22, 15: 0.15}
    merged = []
    for step, value in evals.items():
        merged += [r for r in records if step - 5 < r["step"] <= step]
        merged.append({"step": step, "eval/reward": value})
    merged += [r for r in records if r["step"] > 15]
    assert raised_at(merged) == {"held_out_drop": 10}
    # the same held-out fall with the training reward falling too: not this rule's
    flat = [{**r, "reward": 0.5 - 0.01 * r["step"]} if "reward" in r else r for r in merged]
    assert "held_out_drop" not in raised_at(flat)
    # evaluation noise: 0.01-0.02 between evaluations
    noisy = [{**r, "eval/reward": 0.30 - 0.015 * (r["step"] % 10 == 0)} if "eval/reward" in r else r for r in merged]
    assert raised_at(noisy) == {}
    # a run that found a shortcut converges on it: its groups then repeat one answer and lose their spread
    converging = [{**r, "completions/duplicate_fraction": 0.8, "reward/zero_std_fraction": 1.0}
                  if "reward" in r and r["step"] > 10 else r for r in merged]
    assert raised_at(converging) == {"held_out_drop": 10}
    # it learns the shortcut fast: its gradient norm jumps to a new level (a seeded CPU run: 0.05 to 0.29)
    jumping = [{**r, "grad_norm": 0.3 if r["step"] >= 12 else 0.03} if "reward" in r else r for r in merged]
    assert raised_at(jumping) == {"held_out_drop": 10}
    before = [{**r, "grad_norm": 0.3 if r["step"] >= 8 else 0.03} if "reward" in r else r for r in merged]
    assert raised_at(before) == {"held_out_drop": 10, "grad_spike": 8}  # a jump before the drop is its own


def test_repeated_completions():
    assert raised_at(steps(10, completions__duplicate_fraction=lambda i: 0.8 if i >= 3 else 0.0)) == {
        "repeated_completions": 7}


def test_grad_spike_against_the_median_before():
    assert raised_at(steps(30, grad_norm=lambda i: 9.0 if i == 20 else 0.5 + 0.1 * (i % 3))) == {"grad_spike": 21}
    assert raised_at(steps(30, grad_norm=lambda i: 0.02 * 1.3 ** i)) == {}  # a rising trend, not a jump
    assert raised_at(steps(30, grad_norm=0.0)) == {}  # no gradient at all: nothing to compare with


def test_errors():
    assert raised_at(steps(10, errors__rate=lambda i: 0.5 if i >= 4 else 0.0)) == {"errors": 6}
    assert raised_at(steps(10, errors__rate=lambda i: 0.5 if i == 4 else 0.0)) == {}  # one bad step


def test_one_problem_one_alarm_and_clearing():
    # a learning rate far too high, as measured: a mismatch first, then entropy to nothing and the reward to 0, so no
    # spread and repeated answers; the mismatch itself is over after a few steps, the rest lasts
    collapse = steps(30, mismatch_kl=lambda i: 3.0 if 1 <= i <= 4 else 0.001,
                     entropy=lambda i: 4.0 if i < 2 else 0.01, reward=lambda i: 0.1 if i < 2 else 0.0,
                     completions__duplicate_fraction=lambda i: 0.0 if i < 3 else 0.7,
                     reward__zero_std_fraction=lambda i: 0.0 if i < 2 else 1.0)
    monitor, changes = replay(collapse)
    assert [(step, name, raised) for step, name, raised, _ in changes] == [(3, "mismatch", True)]
    assert monitor.held_by == {"entropy_collapse": "mismatch", "no_signal": "mismatch",
                               "repeated_completions": "mismatch"}
    assert monitor.flags() == {f"health/{name}": float(name == "mismatch") for name in HEALTH_RULES}
    # the held ones gone, the alarm clears
    recovered = collapse + steps(10, start=31)
    assert [(step, name, raised) for step, name, raised, _ in replay(recovered)[1]][-1] == (32, "mismatch", False)
    # an alarm clears, with a line, when its figure is back under the threshold
    changes = replay(steps(12, errors__rate=lambda i: 0.5 if 3 <= i < 6 else 0.0))[1]
    assert [(step, name, raised) for step, name, raised, _ in changes] == [(5, "errors", True), (8, "errors", False)]
    text = health.line("errors", changes[0][3], True)
    assert text == ("[vf-rl] health: errors: 33% of rollouts failed over steps 3-5 (threshold 20%); next: "
                    + RULES["errors"].next_step)
    assert health.line("errors", changes[1][3], False).endswith("; next: nothing (cleared)")


class Args:
    world_size = 1

    def __init__(self, health_stop=()):
        self.health_stop = list(health_stop)


def test_health_stop_saves_and_ends_the_run_at_the_alarm(tmp_path):
    said = []
    state = TrainerState(global_step=0, max_steps=50)
    keep = Health(Args(), state, tmp_path)
    stop = Health(Args(["no_signal"]), state, tmp_path)
    for record in steps(7, reward__zero_std_fraction=1.0):
        state.global_step = record["step"]
        for h in (keep, stop):
            control, logs = TrainerControl(), {k: v for k, v in record.items() if k != "step"}
            h.on_log(Args(), state, control, logs, said.append)
            assert logs["health/no_signal"] == float(record["step"] >= 5)
            if h is stop and record["step"] == 5:
                assert control.should_training_stop and control.should_save
            else:
                assert not control.should_training_stop, (h is stop, record["step"])
    assert keep.stop_reason is None
    assert stop.stop_reason.startswith("[vf-rl] health: no_signal: 100% of groups without reward spread over steps 1-5")
    assert said.count(stop.stop_reason) == 2  # each monitor said it
    assert "[vf-rl] health_stop: ending the run at step 5 with its checkpoint (resume: --resume)" in said


def test_a_resumed_run_goes_on_from_its_records(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps(8, reward__zero_std_fraction=1.0)))
    h = Health(Args(["no_signal"]), TrainerState(global_step=6), tmp_path)  # steps 7-8 are redone
    assert h.monitor.raised["no_signal"] and len(h.monitor.history.steps) == 6
    control, said = TrainerControl(), []
    h.on_log(Args(), TrainerState(global_step=7), control, dict(HEALTHY, **{"reward/zero_std_fraction": 1.0}), said.append)
    assert said == [] and not control.should_training_stop  # raised before the checkpoint: not again


def test_rl_config_takes_health_stop(tmp_path):
    from vf_rl.config.rl_config import RLConfig

    assert RLConfig(output_dir=str(tmp_path)).health_stop is None  # the default: alarms only
    assert RLConfig(output_dir=str(tmp_path), health_stop=["no_signal", "mismatch"]).health_stop == ["no_signal", "mismatch"]
    with pytest.raises(ValueError, match="health_stop: unknown rule 'nope'; the rules are errors, mismatch"):
        RLConfig(output_dir=str(tmp_path), health_stop=["nope"])


def test_unknown_rule_in_health_stop_is_one_line_exit_2(model_dir, tmp_path):
    config = write_cpu_config(tmp_path / "bad.toml", model_dir, tmp_path / "run", 8000, health_stop=["no_signal", "entropy"])
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--dry-run"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip() == ("vf-rl: error: " + str(config) + ": trainer.args.health_stop: unknown rule "
                                     "'entropy'; the rules are " + ", ".join(HEALTH_RULES)), result.stderr


def test_the_cpu_demo_configs_recorded_run_raises_nothing():
    # configs/vf-rl/reverse-text-cpu.toml's 30 steps, evaluated every 5 steps (16 prompts x 8 rollouts)
    records = [json.loads(line) for line in (RESULTS / "health-demo-cpu.metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 31))
    assert len([r for r in records if "eval/reward" in r]) == 7
    assert replay(records)[1] == []


def test_a_recorded_healthy_gpu_run_raises_nothing():
    # a GPU reverse-text run of 1,024 steps that reached reward 0.99 (its entropy fell to 0.013)
    gpu = json.loads((RESULTS / "stability-gpu-reverse-text-1024.json").read_text())["steps"]
    assert replay(gpu)[1] == []
