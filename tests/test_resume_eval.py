"""Kill -9 between checkpoints and resume: same steps, same dataset rows, same LR schedule,
nothing lost. Evaluation during training (with a step-0 baseline) and wandb offline logging.

Runs real ``vf-train`` processes against the session's real vf-vllm server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import write_cpu_config
from safetensors.torch import load_file

pytestmark = pytest.mark.server

def write_config(tmp_path, name, server, model_dir, **extra):
    """Run ``name``: 4 steps of 4 rollouts, a checkpoint every 2 steps, linear LR schedule."""
    return write_cpu_config(tmp_path / f"{name}.toml", model_dir, tmp_path / name, server.port, run_name="resume",
                            micro_batch_size=4, rollouts_per_example=2, batch_size=4, max_steps=4, max_tokens=8,
                            lr_scheduler_type="linear", save_steps=2, **extra)


def train(config, *extra, **popen):
    return subprocess.Popen([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run_and_eval_runs(server, model_dir, tmp_path, restore_base_weights):
    # A: uninterrupted, with evaluation every 2 steps (and at step 0) and wandb offline
    config_a = write_config(tmp_path, "a", server, model_dir, eval_strategy="steps", eval_steps=2, num_eval_examples=2,
                            eval_rollouts_per_example=2, save_total_limit=1, report_to="wandb",
                            wandb={"project": "vf-rl-test", "name": "resume-a"})
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    run_a = train(config_a, env=env)
    out_a, _ = run_a.communicate(timeout=900)
    assert run_a.returncode == 0, out_a[-4000:]
    # B: killed with SIGKILL after checkpoint-2, while step 4 trains, then resumed
    config_b = write_config(tmp_path, "b", server, model_dir)
    run_b = train(config_b)
    b = tmp_path / "b"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and run_b.poll() is None:
        # step 3 logged (so step 4 is training now), checkpoint-2 on disk
        try:
            logged = [r["step"] for r in jsonl(b / "metrics.jsonl") if "reward" in r]
        except (FileNotFoundError, json.JSONDecodeError):  # not there yet, or a line half-written
            logged = []
        if (b / "checkpoint-2").is_dir() and 3 in logged:
            break
        time.sleep(0.05)
    assert run_b.poll() is None, "run B finished before it could be killed"
    run_b.send_signal(signal.SIGKILL)
    run_b.wait()
    assert not (b / "checkpoint-4").exists()
    assert 3 in [r["step"] for r in jsonl(b / "metrics.jsonl")]  # step 3 was logged; it is after checkpoint-2, so redone
    resumed = train(config_b, "--resume")
    out_b, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out_b[-4000:]
    assert "Resuming from" in out_b and "(step 2)" in out_b

    a = tmp_path / "a"
    assert not (a / "checkpoint-2").exists() and (b / "checkpoint-2").exists()  # save_total_limit = 1 in A
    for run in (a, b):
        state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
        assert state["global_step"] == 4
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "adapter_model.safetensors",
                     "tokenizer.json"):
            assert (run / "checkpoint-4" / name).is_file(), name
        assert not list(run.glob(".tmp-checkpoint-*"))
    # the same rows in the same order, step by step (evaluation did not disturb them)
    rows_a = {r["step"]: r["rows"] for r in jsonl(a / "batches.jsonl")}
    rows_b = {r["step"]: r["rows"] for r in jsonl(b / "batches.jsonl")}
    assert sorted(rows_a) == sorted(rows_b) == [1, 2, 3, 4]
    assert rows_a == rows_b
    assert [r["step"] for r in jsonl(b / "batches.jsonl")] == [1, 2, 3, 4]  # the killed step 3 was replaced
    # metrics: every step once, the learning-rate schedule continued
    train_a = {r["step"]: r for r in jsonl(a / "metrics.jsonl") if "reward" in r}
    train_b = [r for r in jsonl(b / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in train_b] == [1, 2, 3, 4]
    for r in train_b:
        assert r["learning_rate"] == pytest.approx(train_a[r["step"]]["learning_rate"])
    assert train_b[0]["learning_rate"] > train_b[3]["learning_rate"]  # linear decay, not restarted
    # the checkpoint written before the kill is intact
    assert load_file(str(b / "checkpoint-2" / "adapter_model.safetensors"))
    # evaluation: a baseline at step 0, then every 2 steps, with per-function rewards
    evals = [r for r in jsonl(a / "metrics.jsonl") if "eval/reward" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    for r in evals:
        assert 0.0 <= r["eval/reward"] <= 1.0 and "eval/reward/lcs_reward_func" in r
    # metrics the docs tell users to watch
    for key in ("reward", "reward/std", "reward/lcs_reward_func", "advantage/absmean", "loss", "entropy",
                "importance_ratio", "mismatch_kl", "grad_norm", "learning_rate", "tokens/completion",
                "tokens/masked_fraction", "errors/rate", "timing/generation_s", "timing/train_s", "timing/sync_s",
                "timing/wait_s", "throughput/train_tokens_per_s", "throughput/generation_tokens_per_s"):
        assert key in train_a[4], key
    # wandb (offline): a run directory with the history was written
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert (a / "metrics.png").is_file()  # plotted at the end of the run
