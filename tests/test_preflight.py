"""`vf-rl @ cfg --preflight`: the ranked problems on the CPU demo model with a real server (the
shipped demo config ready, a constant reward's fatal problem first), the time estimate from the
run's measured first steps, the JSON report's fields, bad input, and the ranking rules on
constructed reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import write_cpu_config

from vf_rl.env_api.environment import Rollout, Turn
from vf_rl.orchestrator.preflight import THRESHOLDS, measure, problems, verdict

REPO = Path(__file__).resolve().parents[1]

CONSTANT_ENV = '''
import vf_rl as vf
from datasets import Dataset


def load_environment(value=0.5, **kwargs):
    colors = ["sky", "grass", "snow", "coal", "blood", "sun", "sea", "night"]
    dataset = Dataset.from_list([{"question": f"One word only: what colour is the {c}?", "answer": ""} for c in colors])
    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[lambda completion, **kw: value]))
'''

# reverse-text with a sampling seed: one request per group (n = rollouts_per_example), whose
# children vLLM seeds seed, seed + 1, ... (vllm/v1/engine/parallel_sampling.py), so a group's
# rollouts differ and the same prompts give the same rollouts whatever ran before
SEEDED_REVERSE_TEXT = '''
from vf_rl.environments.reverse_text import load_environment as reverse_text


def load_environment(sampling_seed=1234, **kwargs):
    env = reverse_text(**kwargs)
    env.sampling_args = {**env.sampling_args, "seed": sampling_seed}
    return env
'''

REPORT_KEYS = {"config", "model", "env", "prompts", "rollouts_per_example", "seconds", "sampling_args", "reward",
               "held_out", "groups", "truncation", "lengths", "failures", "verdict", "problems", "memory",
               "generation", "timing", "estimate"}


def preflight(config, server=None, *extra, cwd=None, prompts=4):
    argv = [sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--preflight", "--preflight-prompts", str(prompts),
            *(["--base-url", f"{server.base_url}/v1"] if server is not None else []), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=1200, cwd=cwd)


@pytest.mark.server
@pytest.mark.parametrize("env_args,max_tokens,expected", [
    # a fatal verdict first: test_constant_reward_names_the_fatal_problem_first_and_estimates_the_time in the default tier
    pytest.param({"few_shot": 0, "source": "offline"}, 64, "too_hard", marks=pytest.mark.slow),
    ({"few_shot": 2, "source": "offline"}, 1, "lengths"),
], ids=["no-few-shot-too-hard", "max-tokens-far-too-small"])
def test_verdicts_on_reverse_text(server, model_dir, tmp_path, env_args, max_tokens, expected):
    """Sampling seeded (SEEDED_REVERSE_TEXT), so the verdict does not depend on the test order."""
    (tmp_path / "seeded_reverse_text.py").write_text(SEEDED_REVERSE_TEXT)
    config = write_cpu_config(tmp_path / "rt.toml", model_dir, tmp_path / "run", server.port,
                              env_id="seeded-reverse-text", env_args=env_args, rollouts_per_example=4, batch_size=16,
                              micro_batch_size=16, max_tokens=max_tokens)
    result = preflight(config, server, "--json", str(tmp_path / "report.json"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) == REPORT_KEYS
    first = report["problems"][0]
    assert report["verdict"] == first and first["name"] == expected and first["severity"] in ("fatal", "serious"), report
    assert f"verdict: not ready: {expected} ({first['severity']}):" in result.stdout
    assert "ready: the run can learn" not in result.stdout
    assert report["prompts"] == 4 and report["rollouts_per_example"] == 4 and report["groups"]["count"] == 4
    assert report["lengths"]["max_tokens"] == max_tokens
    assert report["held_out"] is not None  # reverse-text has an eval split
    assert len(report["generation"]["batch_s"]) == 1 and report["generation"]["rollouts_per_batch"] == 16
    assert "--base-url" in report["timing"]["skipped"] and report["estimate"] is None  # no steps against a given server
    if expected == "too_hard":  # no reward, or rarely (vf-rl's parser reads an unclosed tag) in most groups none
        assert report["reward"]["mean"] < 0.1 and report["groups"]["no_spread_share"] >= 0.5
    else:
        assert report["truncation"]["rollouts_share"] == 1.0
        assert report["lengths"]["completion_tokens"]["max"] == 1
    assert not (tmp_path / "run").exists()  # nothing written to output_dir


@pytest.mark.server
def test_demo_config_is_ready(server, tmp_path):
    """The shipped CPU demo config, its sampling seeded (SEEDED_REVERSE_TEXT): most of its answers
    are cut at max_tokens = 24, yet the cut answers score and every group has spread, so the run
    can learn (it does: benchmarks/RESULTS.md, the CPU demo); the cuts are an advisory."""
    demo = tomllib.loads((REPO / "configs/vf-rl/reverse-text-cpu.toml").read_text())
    assert demo["model"].replace("~", str(Path.home())) == server.model, "the session server serves another model"
    (tmp_path / "seeded_reverse_text.py").write_text(SEEDED_REVERSE_TEXT)
    shipped = (REPO / "configs/vf-rl/reverse-text-cpu.toml").read_text()
    config = tmp_path / "demo.toml"
    config.write_text(shipped.replace('id = "reverse-text"', 'id = "seeded-reverse-text"').replace(
        "[trainer.args]\n", f'[trainer.args]\noutput_dir = "{tmp_path / "run"}"\n'))
    result = preflight(config, server, "--json", str(tmp_path / "report.json"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"]["name"] == "ready", report["problems"]
    assert "\nready: the run can learn (mean reward" in result.stdout, result.stdout
    assert all(p["severity"] == "advisory" for p in report["problems"]), report["problems"]
    assert report["prompts"] == 4 and report["rollouts_per_example"] == 8  # one batch of the run's 32 rollouts
    assert report["sampling_args"]["max_tokens"] == 24
    assert THRESHOLDS["ready_low"] <= report["reward"]["mean"] <= THRESHOLDS["ready_high"], report["reward"]
    assert report["groups"]["no_spread_share"] < THRESHOLDS["no_spread_share"] and report["groups"]["mean_std"] > 0
    assert set(report["reward"]["functions"]) >= {"lcs_reward_func"}


@pytest.mark.server
def test_constant_reward_names_the_fatal_problem_first_and_estimates_the_time(model_dir, tmp_path):
    """Without --base-url the pre-flight starts vf-vllm as the run would, runs the run's trainer for
    two steps against it, estimates the run's time from them, and stops the server. A constant
    reward with max_tokens = 16: 'no learning signal' comes first, the cuts after it."""
    import socket

    from conftest import free_port

    (tmp_path / "constant_env.py").write_text(CONSTANT_ENV)
    port = free_port()
    config = write_cpu_config(tmp_path / "c.toml", model_dir, tmp_path / "run", port, env_id="constant-env",
                              env_args={}, inference_args={"enforce_eager": True, "max_model_len": 512},
                              rollouts_per_example=4, batch_size=8, micro_batch_size=8, max_tokens=16, max_steps=10,
                              save_steps=5)
    result = preflight(config, None, "--json", str(tmp_path / "report.json"), cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    first = report["problems"][0]
    assert (first["severity"], first["name"]) == ("fatal", "constant_reward"), report["problems"]
    assert "1. fatal: constant_reward: every rollout scored 0.500" in result.stdout, result.stdout
    assert "verdict: not ready: constant_reward (fatal)" in result.stdout
    assert [p["severity"] for p in report["problems"]] == sorted(
        (p["severity"] for p in report["problems"]), key=("fatal", "serious", "advisory").index)
    with socket.socket() as s:  # the server it started is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert not (tmp_path / "run").exists()  # nothing written to output_dir
    # the time: two steps of the run's trainer measured, the estimate for max_steps = 10 built from them
    t, e = report["timing"], report["estimate"]
    assert "error" not in t and "skipped" not in t, t
    assert t["first_step_s"] > 0 and t["train_s"] > 0 and t["init_s"] > 0 and t["server_start_s"] > 0
    assert t["generation_s"] > 0 and t["step_s"] >= t["train_s"] + t["sync_s"]
    assert e["unit"] == "CPU-hours" and e["steps"] == 10
    assert e["step_s"] == pytest.approx(max(e["generation_s"], t["train_s"] + t["other_s"]) + t["sync_s"])
    assert e["parts"]["steps"] == pytest.approx(9 * e["step_s"]) and e["parts"]["first_step"] == t["first_step_s"]
    assert e["parts"]["checkpoints"] == pytest.approx(t["end_s"])  # step 5's; step 10's is in the end
    assert e["total_s"] == pytest.approx(sum(e["parts"].values()))
    assert e["hours"] == pytest.approx(e["total_s"] / 3600 * e["devices"])
    assert f"wall clock for 10 steps, {e['hours']:.2f} CPU-hours" in result.stdout, result.stdout


def test_bad_config_exits_2_with_the_dry_run_line(model_dir, tmp_path):
    config = write_cpu_config(tmp_path / "bad.toml", model_dir, tmp_path / "run", 8000, rollouts_per_example=3,
                              batch_size=16)
    dry = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--dry-run"],
                         capture_output=True, text=True, timeout=300)
    result = preflight(config)
    assert dry.returncode == result.returncode == 2
    assert result.stderr.strip() == dry.stderr.strip() and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_unreachable_server_exits_1_in_one_line(model_dir, tmp_path):
    from conftest import free_port

    config = write_cpu_config(tmp_path / "rt.toml", model_dir, tmp_path / "run", 8000, rollouts_per_example=4,
                              batch_size=16, micro_batch_size=16, max_tokens=8)
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--preflight",
                             "--base-url", f"http://127.0.0.1:{free_port()}/v1"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("vf-rl: pre-flight: error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr


def test_bad_input_exits_2_in_one_line(model_dir, tmp_path):
    """A config the launch refuses (two GPUs asked for, none visible) is bad input here too: exit
    status 2 and vf-rl's one line, not a pre-flight failure."""
    import os

    config = write_cpu_config(tmp_path / "rt.toml", model_dir, tmp_path / "run", 8000, rollouts_per_example=4,
                              batch_size=16, micro_batch_size=16, max_tokens=8)
    config.write_text(config.read_text().replace("[inference]\ngpus = 0", "[inference]\ngpus = 2"))
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--preflight"],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [f"vf-rl: error: {config}: inference.gpus + trainer.gpus = 2 GPUs, "
                                                  "but 0 are visible (CUDA_VISIBLE_DEVICES / nvidia-smi); use gpus = 0 "
                                                  "to run a side on the CPU"], result.stderr


def rollout(reward: float, completion: int, truncated: bool = False, error: str | None = None) -> Rollout:
    return Rollout(example_id=0, prompt=[], reward=reward, is_truncated=truncated, error=error,
                   error_kind="model" if error else None,
                   turns=[Turn(prompt_ids=[1] * 10, completion_ids=[2] * completion, completion_logprobs=[0.0] * completion)])


SPREAD = [0.0, 0.5, 0.2, 0.3, 0.1, 0.0, 0.4, 0.2]  # two groups of four, both with spread; mean 0.21


@pytest.mark.parametrize("rewards,truncated,errors,extra,expected", [
    (SPREAD, 0, 0, {}, []),
    ([0.0] * 8, 0, 0, {}, [("fatal", "too_hard")]),
    ([0.5] * 8, 6, 0, {}, [("fatal", "constant_reward"), ("advisory", "lengths")]),  # no signal first, the cuts after
    ([0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5], 0, 0, {}, [("fatal", "no_spread")]),
    ([0.0] * 8, 8, 0, {}, [("fatal", "lengths")]),  # nothing scores because every answer is cut: lengths, alone
    ([0.0] * 8, 5, 0, {}, [("fatal", "too_hard"), ("advisory", "lengths")]),  # no reward, and some answers end
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3], 0, 0, {}, [("serious", "too_hard")]),  # one success in eight
    ([0.0, 0.0, 0.0, 0.0, 0.1, 0.5, 0.3, 0.4], 0, 0, {}, [("serious", "no_spread")]),
    (SPREAD, 6, 0, {}, [("advisory", "lengths")]),  # 75% cut, cut answers score: the demo's case
    (SPREAD, 8, 0, {}, [("serious", "lengths")]),  # every answer cut: no finished answer to learn from
    (SPREAD, 0, 5, {}, [("serious", "failing")]),
    (SPREAD, 0, 1, {}, [("advisory", "failing")]),
    ([0.0] * 8, 0, 8, {}, [("fatal", "failing")]),  # nothing to judge: the failures alone
    ([1.0, 0.9, 1.0, 0.8, 0.9, 1.0, 1.0, 0.7], 0, 0, {}, [("advisory", "too_easy")]),
    (SPREAD, 6, 0, {"memory": {"fits": False, "line": "trainer memory per GPU (estimate): 90 GiB"},
                    "timing": {"error": "vf-train exited with status 1: CUDA out of memory"}},
     [("fatal", "training"), ("serious", "memory"), ("advisory", "lengths")]),
])
def test_problem_ranking(rewards, truncated, errors, extra, expected):
    # the cut rollouts are the first `truncated` (16 tokens, at max_tokens), the failed ones the first `errors`
    rollouts = [rollout(r, 16 if i < truncated else 5, truncated=i < truncated, error="boom" if i < errors else None)
                for i, r in enumerate(rewards)]
    report = measure(rollouts, group_size=4, max_tokens=16, max_seq_len=256) | extra
    found = problems(report, "2 x 4")
    assert [(p.severity, p.name) for p in found] == expected, [p.line() for p in found]
    assert report["groups"]["count"] == 2
    top = verdict(report, "2 x 4", found)
    if not expected or expected[0][0] == "advisory":
        assert top.name == "ready" and top.reason.startswith("the run can learn") and top.severity is None
    else:
        assert top is found[0]


def test_truncation_rates_the_cut_answers_rewards():
    """Cut answers that never score above the batch's lowest reward while finished ones do: the
    reward needs a finished answer (serious); the same cuts scoring: an advisory with both means."""
    # two groups, both with spread: 5 of 8 cut (at 0), the finished ones 0.6 | 0.0, 0.8
    needs_end = ([rollout(0.0, 16, truncated=True) for _ in range(3)] + [rollout(0.6, 5)]
                 + [rollout(0.0, 16, truncated=True) for _ in range(2)] + [rollout(0.0, 5), rollout(0.8, 5)])
    report = measure(needs_end, group_size=4, max_tokens=16, max_seq_len=256)
    assert report["truncation"]["cut_reward"] == {"mean": 0.0, "max": 0.0}
    assert report["truncation"]["ended_reward"]["max"] == 0.8
    found = problems(report, "2 x 4")
    assert [(p.severity, p.name) for p in found] == [("serious", "lengths")], [p.line() for p in found]
    assert "needs a finished answer" in found[0].reason
    scoring = [rollout(r, 16, truncated=True) for r in (0.1, 0.3, 0.2, 0.0, 0.4)] + [rollout(r, 5) for r in (0.6, 0.0, 0.8)]
    found = problems(measure(scoring, group_size=4, max_tokens=16, max_seq_len=256), "2 x 4")
    assert [(p.severity, p.name) for p in found] == [("advisory", "lengths")]
    assert "cut answers score 0.200 on average, finished ones 0.467" in found[0].reason


def test_estimate_overlaps_generation_and_training(tmp_path, model_dir):
    """A step of the steady state costs max(generation, training) + weight sync; the launch the
    later of the server's and the trainer's start; each checkpoint before the last what the end
    cost; max_time_s caps the steps."""
    from vf_rl.config.rl_config import RLConfig
    from vf_rl.config.schema import load_config
    from vf_rl.launcher.run_time import estimate

    path = write_cpu_config(tmp_path / "c.toml", model_dir, tmp_path / "run", 8000, rollouts_per_example=4,
                            batch_size=8, micro_batch_size=8, max_steps=31, save_steps=10)
    config = load_config(path)
    timing = {"launcher_s": 5.0, "server_start_s": 60.0, "init_s": 40.0, "first_step_s": 30.0, "step_s": 21.0,
              "wait_s": 0.0, "sync_s": 2.0, "train_s": 18.0, "other_s": 1.0, "generation_s": 12.0, "end_s": 4.0,
              "server_stop_s": 3.0}
    report = {"timing": timing, "generation": {"batch_s": [11.0, 13.0], "rollouts_per_batch": 8, "held_out_s": None}}
    e = estimate(config, RLConfig(**config.trainer.args), report, cores=2)
    assert e["step_s"] == 21.0 and e["bound"] == "training"  # max(12, 18 + 1) + 2
    assert e["parts"] == {"launch": 65.0, "first_step": 30.0, "steps": 30 * 21.0, "checkpoints": 3 * 4.0,
                          "evaluations": 0.0, "end": 7.0}
    assert e["total_s"] == 65 + 30 + 630 + 12 + 7 and e["hours"] == pytest.approx(e["total_s"] / 3600 * 2)
    slow = estimate(config, RLConfig(**config.trainer.args), {**report, "timing": {**timing, "generation_s": 50.0}}, 2)
    assert slow["step_s"] == 52.0 and slow["bound"] == "generation"
    capped = RLConfig(**{**config.trainer.args, "max_time_s": 100})
    assert estimate(config, capped, report, 2)["steps"] == 1 + 5  # the first step ending 100 s after step 1


@pytest.mark.server
@pytest.mark.parametrize("mode", ["strict", pytest.param("warn", marks=pytest.mark.slow)])  # the verdict line: both
def test_first_batch_check_in_the_trainer(server, model_dir, tmp_path, restore_base_weights, mode):
    """``[trainer.args] preflight``: the trainer prints the verdict on its first batch; "strict"
    stops a run without reward before its first update (exit 1, one line), "warn" goes on."""
    out = tmp_path / "run"
    (tmp_path / "constant_env.py").write_text(CONSTANT_ENV)
    config = write_cpu_config(tmp_path / "c.toml", model_dir, out, server.port, env_id="constant-env",
                              env_args={"value": 0.0}, preflight=mode, max_steps=2, batch_size=8,
                              rollouts_per_example=4, micro_batch_size=8, max_tokens=96, save_steps=50)
    result = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], capture_output=True,
                            text=True, timeout=900, cwd=tmp_path)
    assert "[vf-rl] pre-flight of batch 1: fatal: too_hard: no reward in 2 x 4 attempts" in result.stdout, result.stdout[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if "tokens/loss" in line] if (out / "metrics.jsonl").exists() else []
    if mode == "strict":
        assert result.returncode == 1, result.stderr[-3000:]
        errors = [line for line in result.stderr.splitlines() if "vf-train: error:" in line]
        assert len(errors) == 1 and 'vf-train: error: pre-flight (preflight = "strict"): too_hard (fatal)' in errors[0], errors
        assert "Traceback" not in result.stderr and steps == []
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert [s["step"] for s in steps] == [1, 2]


def test_preflight_key_is_checked(model_dir, tmp_path):
    config = write_cpu_config(tmp_path / "bad.toml", model_dir, tmp_path / "run", 8000, preflight="loud")
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--dry-run"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "preflight: expected one of warn, strict, off, got 'loud'" in result.stderr, result.stderr
