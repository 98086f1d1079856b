"""Four CPU runs that cannot learn, each raising the right health alarm within 20 steps and no other:
a constant reward (no_signal), a learning rate 100 times the demo's (mismatch), a reward that pays
for length (length_growth), a training reward with a shortcut the held-out reward does not pay
(held_out_drop); and health_stop, which ends a run with exit status 7 and a checkpoint that
resumes. Real vf-train runs against the session's real vf-vllm server, the environments in
tests/health_envs/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_cpu_config

pytestmark = [pytest.mark.server, pytest.mark.slow]

ENVS = Path(__file__).resolve().parent / "health_envs"
REVERSE_TEXT = {"few_shot": 2, "source": "offline"}
# 4 prompts x 4 rollouts, one forward/backward per step, seeded; the demo's learning rate
SMALL = dict(rollouts_per_example=4, batch_size=16, micro_batch_size=16, max_tokens=24, learning_rate=5e-4,
             max_steps=20, seed=0, save_steps=100)


def train(config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config), *extra], capture_output=True,
                          text=True, timeout=2400, cwd=ENVS)


def alarms(out: Path) -> dict[str, int]:
    """The first step at which each ``health/<rule>`` was 1 in ``out/metrics.jsonl``."""
    first = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key.startswith("health/") and value:
                first.setdefault(key.removeprefix("health/"), record["step"])
    return first


@pytest.mark.parametrize("env_id,env_args,args,expected", [
    ("health-constant", {}, {}, "no_signal"),
    ("reverse-text", REVERSE_TEXT, {"learning_rate": 5e-2}, "mismatch"),
    ("health-length", {}, {"max_tokens": 32}, "length_growth"),
    ("health-shortcut", {}, {"eval_strategy": "steps", "eval_steps": 4, "num_eval_examples": 8,
                             "eval_rollouts_per_example": 4}, "held_out_drop"),
], ids=["constant-reward", "learning-rate-100x", "reward-pays-length", "shortcut-reward"])
def test_a_run_that_cannot_learn_raises_its_alarm(server, model_dir, tmp_path, restore_base_weights, env_id, env_args,
                                                  args, expected):
    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "run.toml", model_dir, out, server.port, env_id=env_id, env_args=env_args,
                              **{**SMALL, **args})
    result = train(config)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    raised = alarms(out)
    print(f"{expected}: {raised}")  # the step, for the record (pytest -s)
    assert set(raised) == {expected} and raised[expected] <= 20, raised
    lines = [line for line in result.stdout.splitlines() if line.startswith("[vf-rl] health: ")]
    assert lines and lines[0].startswith(f"[vf-rl] health: {expected}: ") and " (threshold " in lines[0], lines
    assert "; next: " in lines[0]


def test_health_stop_ends_the_run_with_a_checkpoint_that_resumes(server, model_dir, tmp_path, restore_base_weights):
    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "run.toml", model_dir, out, server.port, env_id="health-constant", env_args={},
                              **{**SMALL, "max_steps": 8, "health_stop": ["no_signal"]})
    stopped = train(config)
    assert stopped.returncode == 7, (stopped.stdout + stopped.stderr)[-4000:]
    errors = [line for line in stopped.stderr.splitlines() if line.startswith("vf-train: error:")]
    assert len(errors) == 1 and errors[0].startswith("vf-train: error: health_stop: [vf-rl] health: no_signal: 100% "
                                                     "of groups without reward spread over steps 1-5"), errors
    assert "[vf-rl] health_stop: ending the run at step 5 with its checkpoint" in stopped.stdout
    assert "Traceback" not in stopped.stderr
    assert json.loads((out / "checkpoint-5" / "trainer_state.json").read_text())["global_step"] == 5
    assert [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r] == [
        1, 2, 3, 4, 5]
    resumed = train(config, "--resume")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    assert "(step 5)" in resumed.stdout and (out / "checkpoint-8").is_dir()
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "reward" in r] == list(range(1, 9))
    assert all(r["health/no_signal"] == 1.0 for r in steps if "reward" in r and r["step"] >= 5)
    assert "[vf-rl] health: " not in resumed.stdout  # raised before the checkpoint: not again
