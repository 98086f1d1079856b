"""Several trainer processes (DDP, gloo on the CPU) against a real vf-vllm:
only the main process generates, syncs and logs; every process trains on its shard of the
same batch; evaluation and checkpoints work. (On GPUs the same code ran with 2 x H200.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_cpu_config

pytestmark = pytest.mark.server

# both runs: 2 processes x 2 micro batches of 2 per step, evaluation at steps 0 and 2
RUN = dict(micro_batch_size=2, rollouts_per_example=2, batch_size=8, max_steps=2, max_tokens=8, use_cpu=True,
           save_steps=2, eval_strategy="steps", eval_steps=2, num_eval_examples=2, eval_rollouts_per_example=2)


@pytest.mark.slow
def test_two_trainer_processes_share_each_batch(server, model_dir, tmp_path, restore_base_weights):
    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "ddp.toml", model_dir, out, server.port, run_name="ddp", **RUN)
    # torchrun is what `accelerate launch` runs on GPUs; on the CPU the processes talk through gloo
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "-m", "vf_rl.trainer.cli", "@", str(config)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward" in r]
    assert [r["step"] for r in train] == [1, 2]  # logged once, by the main process
    assert [r["step"] for r in rows if "eval/reward" in r] == [0, 2]
    batches = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    assert [b["step"] for b in batches] == [1, 2] and all(len(b["rows"]) == 4 for b in batches)
    for r in train:  # the main process trained on half of the 8 rollouts: its micro batches hold 4 samples
        assert 0 < r["tokens/loss"] and r["grad_norm"] > 0
    assert "Trainer: 2 process(es)" in result.stdout
    assert result.stdout.count("Weight sync: filesystem") == 1  # one process talks to the server
    assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_zero3_trainer_processes_gather_weights_for_the_sync(server, model_dir, tmp_path, restore_base_weights):
    """DeepSpeed ZeRO-3 (CPU accelerator, gloo) with full weights: each process holds a shard of
    every weight; the sync gathers them, so the server gets whole tensors that training changed."""
    pytest.importorskip("deepspeed")
    from safetensors.torch import load_file

    out = tmp_path / "run"
    zero3 = Path(__file__).resolve().parents[1] / "configs" / "deepspeed" / "zero3.json"
    config = write_cpu_config(tmp_path / "zero3.toml", model_dir, out, server.port, run_name="zero3", use_lora=False,
                              learning_rate=1e-3, deepspeed=str(zero3), **RUN)
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "-m", "vf_rl.trainer.cli", "@", str(config)],
                            capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2]
    # DeepSpeed saved its own checkpoint and took one optimizer step per trainer step (not one per
    # micro batch: each process has 2 micro batches per step here)
    assert sorted(p.name for p in (out / "checkpoint-2").glob("global_step*")) == ["global_step2"]
    pushed = load_file(str(out / "weights" / "model.safetensors"))  # the step-1 weights the server reloaded
    base = load_file(str(model_dir / "model.safetensors"))
    assert pushed.keys() == {k for k in base if k != "lm_head.weight"}
    assert all(pushed[k].shape == base[k].shape for k in pushed)  # whole tensors, not ZeRO-3 shards
    assert any(not torch.equal(pushed[k].float(), base[k].float()) for k in pushed)  # and trained
