"""Two training steps through `vf-rl` in real tmux, with a real vf-vllm, from a script (--wait)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import free_port, write_cpu_config

# slow: vf-rl --wait in tmux trains 2 steps in the default tier in test_quiet_panes.py and CI's scripts/test_wheel.sh
pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_two_steps_through_vf_rl_in_tmux(model_dir, tmp_path):
    out = tmp_path / "run"
    session = f"vf-rl-e2e-{free_port()}"
    port = free_port()
    config = write_cpu_config(tmp_path / "rt.toml", model_dir, out, port, env_id="primeintellect/reverse-text",
                              inference_args={"enforce_eager": True, "max_model_len": 512}, run_name="e2e",
                              micro_batch_size=8, rollouts_per_example=4, batch_size=16, max_steps=2, max_tokens=16,
                              save_steps=50)
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "-s", session, "--wait"],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path)
    trainer_log = (out / "logs" / "trainer.log").read_text() if (out / "logs" / "trainer.log").exists() else ""
    assert result.returncode == 0, (result.stdout, result.stderr, trainer_log[-3000:])
    assert "trainer exited with status 0" in result.stdout
    assert (out / "logs" / "trainer.exit").read_text().strip() == "0"
    # the last step is always saved, although save_steps is 50
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / "adapter_config.json").is_file()
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 0.0 <= r["reward"] <= 1.0 and r["tokens/loss"] > 0 and "importance_ratio" in r and "loss" in r
    assert steps[1]["timing/sync_s"] > 0  # weights were pushed before batch 2 was generated
    assert "Step 2/2: reward=" in trainer_log
    # the start-up split: the trainer's own start, then its wait for the server (launched together)
    ready = re.search(r"vf-vllm ready: the trainer process ran ([\d.]+) s before it asked, then waited ([\d.]+) s",
                      trainer_log)
    assert ready and float(ready[1]) > 0, trainer_log[:3000]
    # the launcher's checks and vf-vllm's own start, each timed from its process's start
    assert re.search(rf"tmux session '{session}' started [\d.]+ s after vf-rl did", result.stdout), result.stdout
    assert re.search(r"vf-vllm: vLLM starts [\d.]+ s after vf-vllm did", (out / "logs" / "inference.log").read_text())
    # a clean log: no progress refresh line (test_quiet_panes.py), no warning meant for developers
    assert b"\r" not in (out / "logs" / "trainer.log").read_bytes()
    assert not any(line.startswith("Generating batch 1: 0/") for line in trainer_log.splitlines())
    warnings = [line for line in trainer_log.splitlines() if "warning" in line.lower()]
    assert not warnings, warnings
    assert "Step 1 samples" in trainer_log and "completion" in trainer_log  # the sample table
    inference_log = (out / "logs" / "inference.log").read_text()
    assert "Application startup complete" in inference_log
    python_warnings = re.findall(r"\.py:\d+: [A-Z]\w*Warning: [^\n]*", inference_log)
    assert not python_warnings, python_warnings
    # both sides read the resolved config vf-rl wrote: the server's max_model_len is the file's, the
    # trainer names the file
    resolved = out / "resolved.toml"
    assert f"(config: {resolved})" in trainer_log
    assert "--max-model-len 512 " in inference_log and 'max_model_len = 512' in resolved.read_text()
    # the session is closed and the inference server stopped
    assert subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(resolved) not in processes and str(config) not in processes
