"""`vf-rl @ cfg --preflight`: the verdicts on the CPU demo model with a real server, the JSON
report's fields, bad input, and the verdict rules on constructed reports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import write_cpu_config

from vf_rl.env_api.environment import Rollout, Turn
from vf_rl.orchestrator.preflight import THRESHOLDS, measure, verdict

CONSTANT_ENV = '''
import vf_rl as vf
from datasets import Dataset


def load_environment(value=0.5, **kwargs):
    colors = ["sky", "grass", "snow", "coal", "blood", "sun", "sea", "night"]
    dataset = Dataset.from_list([{"question": f"One word only: what colour is the {c}?", "answer": ""} for c in colors])
    return vf.SingleTurnEnv(dataset=dataset, rubric=vf.Rubric(funcs=[lambda completion, **kw: value]))
'''

REPORT_KEYS = {"config", "model", "env", "prompts", "rollouts_per_example", "seconds", "sampling_args", "reward",
               "held_out", "groups", "truncation", "lengths", "failures", "verdict", "memory"}


def preflight(config, server=None, *extra, cwd=None, prompts=4):
    argv = [sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--preflight", "--preflight-prompts", str(prompts),
            *(["--base-url", f"{server.base_url}/v1"] if server is not None else []), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=1200, cwd=cwd)


@pytest.mark.server
@pytest.mark.parametrize("env_args,max_tokens,expected", [
    ({"few_shot": 0, "source": "offline"}, 64, "too_hard"),
    ({"few_shot": 2, "source": "offline"}, 1, "lengths"),
], ids=["no-few-shot-too-hard", "max-tokens-far-too-small"])
def test_verdicts_on_reverse_text(server, model_dir, tmp_path, env_args, max_tokens, expected):
    config = write_cpu_config(tmp_path / "rt.toml", model_dir, tmp_path / "run", server.port, env_args=env_args,
                              rollouts_per_example=4, batch_size=16, micro_batch_size=16, max_tokens=max_tokens)
    result = preflight(config, server, "--json", str(tmp_path / "report.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) == REPORT_KEYS
    assert report["verdict"]["name"] == expected, report
    assert f"verdict: {expected}:" in result.stdout
    assert report["prompts"] == 4 and report["rollouts_per_example"] == 4 and report["groups"]["count"] == 4
    assert report["lengths"]["max_tokens"] == max_tokens
    assert report["held_out"] is not None  # reverse-text has an eval split
    if expected == "too_hard":  # no reward, or rarely (vf-rl's parser reads an unclosed tag) in most groups none
        assert report["reward"]["mean"] < 0.1 and report["groups"]["no_spread_share"] >= 0.5
    else:
        assert report["truncation"]["rollouts_share"] == 1.0
        assert report["lengths"]["completion_tokens"]["max"] == 1
    assert not (tmp_path / "run").exists()  # nothing written to output_dir


@pytest.mark.server
def test_few_shot_gives_spread_and_a_baseline_in_range(server, model_dir, tmp_path):
    # max_tokens well above the ~30-token answers; the rollouts are unseeded (a shared seed would make a
    # group's rollouts one), and SmolLM2 now and then rambles to the limit on a few prompts' every rollout:
    # at 64 one run in many, at 128 one in dozens, had half of the 32 cut, the "lengths" verdict's threshold.
    # What this test is about (few-shot gives spread and a baseline in range) holds either way.
    config = write_cpu_config(tmp_path / "rt.toml", model_dir, tmp_path / "run", server.port,
                              rollouts_per_example=4, batch_size=16, micro_batch_size=16, max_tokens=128)
    result = preflight(config, server, "--json", str(tmp_path / "report.json"), prompts=8)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"]["name"] in ("ready", "lengths"), report["verdict"]
    assert report["verdict"]["name"] == "ready" or report["truncation"]["rollouts_share"] >= 0.5, report
    assert 0.05 <= report["reward"]["mean"] <= THRESHOLDS["ready_high"], report["reward"]
    assert report["groups"]["no_spread_share"] < 1.0 and report["groups"]["mean_std"] > 0
    assert set(report["reward"]["functions"]) >= {"lcs_reward_func"}


@pytest.mark.server
def test_constant_reward_has_no_spread_with_the_server_the_run_starts(model_dir, tmp_path):
    """Without --base-url the pre-flight starts vf-vllm as the run would, and stops it."""
    from conftest import free_port

    (tmp_path / "constant_env.py").write_text(CONSTANT_ENV)
    port = free_port()
    config = write_cpu_config(tmp_path / "c.toml", model_dir, tmp_path / "run", port, env_id="constant-env",
                              env_args={}, inference_args={"enforce_eager": True, "max_model_len": 512},
                              rollouts_per_example=4, batch_size=16, micro_batch_size=16, max_tokens=64)
    result = preflight(config, None, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "verdict: no_spread: 100% of the groups" in result.stdout, result.stdout
    import socket

    with socket.socket() as s:  # the server it started is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0


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


@pytest.mark.parametrize("rewards,truncated,errors,expected", [
    ([0.0] * 8, 0, 0, "too_hard"),
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3], 0, 0, "too_hard"),  # one success in eight: most groups all 0
    ([0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5], 0, 0, "no_spread"),
    ([0.0, 0.5, 0.2, 0.3, 0.1, 0.0, 0.4, 0.2], 0, 0, "ready"),
    ([0.5] * 8, 0, 0, "no_spread"),
    ([1.0, 0.9, 1.0, 0.8, 0.9, 1.0, 1.0, 0.7], 0, 0, "too_easy"),
    ([0.0, 0.5, 0.2, 0.3, 0.1, 0.0, 0.4, 0.2], 8, 0, "lengths"),
    ([0.0] * 8, 8, 0, "lengths"),  # nothing scores because every answer is cut: lengths first
    ([0.0] * 8, 5, 0, "too_hard"),  # no reward, and some answers end: too hard before lengths
    ([0.0, 0.5, 0.2, 0.3, 0.1, 0.0, 0.4, 0.2], 0, 5, "failing"),
])
def test_verdict_rules(rewards, truncated, errors, expected):
    rollouts = [rollout(r, 16 if i < truncated else 5, truncated=i < truncated, error="boom" if i < errors else None)
                for i, r in enumerate(rewards)]
    report = measure(rollouts, group_size=4, max_tokens=16, max_seq_len=256)
    assert verdict(report, "2 x 4").name == expected
    assert report["groups"]["count"] == 2


@pytest.mark.server
@pytest.mark.parametrize("mode", ["strict", "warn"])
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
    assert "[vf-rl] pre-flight of batch 1: too_hard: no reward in 2 x 4 attempts" in result.stdout, result.stdout[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if "tokens/loss" in line] if (out / "metrics.jsonl").exists() else []
    if mode == "strict":
        assert result.returncode == 1, result.stderr[-3000:]
        errors = [line for line in result.stderr.splitlines() if "vf-train: error:" in line]
        assert len(errors) == 1 and 'vf-train: error: pre-flight (preflight = "strict"): too_hard' in errors[0], errors
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
