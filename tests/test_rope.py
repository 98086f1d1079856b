"""RoPE's inverse frequencies stay float32 in the trainer's model: DeepSpeed ZeRO-3 builds them in
bf16 (``zero.Init`` casts ``torch.arange``), which bends every angle in proportion to its position;
``float32_rotary_buffers`` (called before the first step by ``Float32Rotary``, which the RL
trainer's ``RunCallback`` and ``vf-sft`` use) recomputes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.trainer_callback import TrainerControl, TrainerState

from vf_rl.trainer.callbacks import RunCallback
from vf_rl.trainer.model import float32_rotary_buffers

POSITIONS = torch.arange(4096)[None]  # [1, 4096]: a long completion's positions


def tiny_llama(rope_theta=5e5, rope_scaling=None) -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=256, max_position_embeddings=8192, rope_theta=rope_theta,
                         rope_scaling=rope_scaling)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def angles(model) -> torch.Tensor:
    """cos of every RoPE angle at POSITIONS, float32 [4096, head_dim]."""
    x = torch.zeros(1, 1, 1, dtype=torch.float32)
    cos, _ = model.model.rotary_emb(x, POSITIONS)
    return cos[0]


@pytest.mark.parametrize("rope_scaling", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 2048}])
def test_rope_buffers_cast_to_bf16_are_recomputed_in_float32(rope_scaling):
    reference = tiny_llama(rope_scaling=rope_scaling)
    cast = tiny_llama(rope_scaling=rope_scaling).to(torch.bfloat16)  # what a blanket cast does to buffers
    assert cast.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    assert (angles(cast) - angles(reference)).abs().max() > 0.1  # far positions are off by a large angle

    assert float32_rotary_buffers(cast) == 1
    rotary = cast.model.rotary_emb
    assert rotary.inv_freq.dtype == rotary.original_inv_freq.dtype == torch.float32
    assert torch.equal(rotary.inv_freq, reference.model.rotary_emb.inv_freq)
    assert torch.equal(angles(cast), angles(reference))
    assert cast.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16  # weights untouched
    assert float32_rotary_buffers(cast) == 0  # nothing left to fix


def test_the_run_callback_fixes_the_model_before_the_first_step(capsys, tmp_path):
    from vf_rl import RLConfig

    model = tiny_llama().to(torch.bfloat16)
    args = RLConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    RunCallback().on_train_begin(args, TrainerState(), TrainerControl(), model=model)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert "inverse frequencies of 1 module(s)" in capsys.readouterr().out


ZERO3_SCRIPT = r"""
import json, os, sys, torch
import deepspeed
from transformers import AutoModelForCausalLM
from transformers.integrations import HfDeepSpeedConfig
from vf_rl.trainer.model import float32_rotary_buffers
deepspeed.init_distributed(dist_backend="gloo")
ds = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}
keep = HfDeepSpeedConfig(ds)  # from_pretrained now builds the model inside deepspeed.zero.Init
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
engine, *_ = deepspeed.initialize(model=model, config=ds, model_parameters=[p for p in model.parameters()])
rotary = model.model.rotary_emb
positions = torch.arange(4096)[None]
x = torch.zeros(1, 1, 1)
before = str(rotary.inv_freq.dtype), rotary(x, positions)[0][0]
fixed = float32_rotary_buffers(engine)
after = rotary(x, positions)[0][0]
torch.save({"before": before[1], "after": after}, sys.argv[2])
print(json.dumps({"dtype_before": before[0], "dtype_after": str(rotary.inv_freq.dtype), "fixed": fixed}))
"""


# Slow tier: on a 2-core machine this one-process DeepSpeed engine (gloo, CPU accelerator) hangs at
# initialisation past the subprocess's 600 s while using about 10 s of CPU; the fix itself
# (float32_rotary_buffers) is exercised on plain models by the default-tier tests above.
@pytest.mark.slow
def test_zero3_builds_bf16_rope_buffers_and_the_fix_restores_them(tmp_path):
    """A real DeepSpeed ZeRO-3 engine (one process, CPU accelerator, bf16): the loaded model's
    angles at 4096 positions match a plain float32-RoPE model's only after the fix."""
    pytest.importorskip("deepspeed")
    tiny_llama().to(torch.bfloat16).save_pretrained(tmp_path / "model")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29600 + os.getpid() % 300),
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    result = subprocess.run([sys.executable, "-c", ZERO3_SCRIPT, str(tmp_path / "model"), str(tmp_path / "cos.pt")],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"dtype_before": "torch.bfloat16", "dtype_after": "torch.float32", "fixed": 1}
    cos = torch.load(tmp_path / "cos.pt")
    reference = angles(tiny_llama())
    assert (cos["before"] - reference).abs().max() > 0.1
    assert torch.allclose(cos["after"], reference, atol=1e-6)
