"""The algorithm seam: a loss or an advantage swapped by one key or one argument.

- the example loss (examples/custom_loss.py) against a hand computation;
- RLTrainer with ``loss_fn=`` logs whatever statistics the loss returns, under the convention;
- real ``vf-train`` runs against the real server with ``loss_type = "custom_loss:gspo_loss"``
  (the example, by config key only), with the built-in ``dapo`` + ``group_mean_std``, and with
  each of TRL's loss types (``grpo``, ``dr_grpo``, ``bnpo``, ``gspo``);
- the trainer gives a loss the whole batch's totals, so a per-sample mean spans micro batches.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import write_cpu_config

from vf_rl.algorithm.loss import LossInputs, LossOutput, grpo_loss, micro_batch_loss

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
from custom_loss import gspo_loss  # noqa: E402


def test_example_loss_matches_hand_computation():
    """Two sequences: s = exp(mean log r) per sequence, clipped, times A, over the loss tokens."""
    log_r = [[0.1, -0.3, 0.05], [0.4, 0.2, 0.0]]
    mask = torch.tensor([[True, True, True], [True, True, False]])
    trainer = torch.tensor(log_r, requires_grad=True)
    adv = torch.tensor([1.0, -2.0])
    inputs = LossInputs(trainer, torch.zeros(2, 3), adv, mask, torch.zeros(2, 3))
    loss, stats = micro_batch_loss(gspo_loss, inputs, SimpleNamespace(epsilon_low=0.2, epsilon_high=0.28, beta=0.0), 5.0)
    s0, s1 = math.exp((0.1 - 0.3 + 0.05) / 3), math.exp((0.4 + 0.2) / 2)  # 0.951 (inside), 1.350 (above 1.28)
    # A < 0 with s above the range: min(s*A, clip*A) = s*A, unclipped
    expected = (-3 * s0 * 1.0 - 2 * (s1 * -2.0)) / 5.0
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert trainer.grad[0].tolist() == pytest.approx([-s0 / 5] * 3, rel=1e-5)
    assert trainer.grad[1].tolist() == pytest.approx([2 * s1 / 5, 2 * s1 / 5, 0.0], rel=1e-5)
    assert stats["sequence_ratio"].item() == pytest.approx(3 * s0 + 2 * s1, rel=1e-5)


def test_trainer_logs_what_a_loss_returns(model_dir, tmp_path):
    """A loss passed as ``loss_fn`` is called on every micro batch; its per-token losses are
    masked and divided by the batch's loss tokens by the trainer; its sums are logged as means
    per loss token and its ``/max`` keys as maxima, nothing else is added or dropped."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.orchestrator.samples import Sample

    calls = []

    def counting_loss(inputs: LossInputs, args) -> LossOutput:
        mask = inputs.loss_mask
        per_token = -(inputs.trainer_logprobs * inputs.advantages[:, None])  # not masked: the trainer masks
        calls.append(float((per_token.detach() * mask).sum()))
        return LossOutput(per_token, {"ones": mask.sum().float(), "rows/max": torch.tensor(float(len(mask)))})

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = RLConfig(output_dir=str(tmp_path), use_cpu=True, batch_size=4, rollouts_per_example=2, micro_batch_size=2,
                    max_steps=1, report_to=[])
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    trainer = RLTrainer(model=model, env=env, args=args, processing_class=tokenizer, served_model_name="t",
                        loss_fn=counting_loss)
    samples = [Sample(list(range(10, 10 + p + c)), [0] * p + [1] * c, [0.0] * (p + c), a)
               for p, c, a in ((5, 3, 1.0), (4, 2, -1.0), (6, 4, 0.5), (3, 1, -0.5))]
    loss, stats = trainer._train_on_batch(trainer.model, Batch(step=0, samples=samples, rollouts=[]))
    assert len(calls) == 2 and float(loss) == pytest.approx(sum(calls) / 10.0, rel=1e-5)  # 10 loss tokens
    assert stats == {"ones": 1.0, "rows/max": 2.0, "tokens/loss": 10.0, "tokens/trained": 28.0}


def test_trainer_gives_each_micro_batch_the_batch_totals(model_dir, tmp_path):
    """RLTrainer on SmolLM2 with TRL's ``grpo`` over five samples of different lengths (one without
    loss tokens) in several micro batches: the step's loss is the mean over the four trained samples
    of each one's token mean, as if the whole batch were one pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.orchestrator.samples import Sample

    rows = []

    def recording_grpo(inputs: LossInputs, args) -> LossOutput:
        out = grpo_loss(inputs, args)
        rows.extend(float(out.per_token.detach()[b][inputs.loss_mask[b]].mean()) for b in range(len(inputs.loss_mask))
                    if inputs.loss_mask[b].any())
        return out

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = RLConfig(output_dir=str(tmp_path), use_cpu=True, batch_size=4, rollouts_per_example=2, micro_batch_size=2,
                    padding_free=False, max_steps=1, report_to=[])
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    trainer = RLTrainer(model=model, env=env, args=args, processing_class=tokenizer, served_model_name="t",
                        loss_fn=recording_grpo)
    g = torch.Generator().manual_seed(0)
    samples = [Sample(list(range(10, 10 + p + c)), [0] * p + [1] * c, [0.0] + (-torch.rand(p + c - 1, generator=g)).tolist(), a)
               for p, c, a in ((5, 3, 1.0), (4, 2, -1.0), (6, 0, 0.5), (6, 7, 0.5), (3, 1, -0.5))]
    loss, stats = trainer._train_on_batch(trainer.model, Batch(step=0, samples=samples, rollouts=[]))
    assert len(rows) == 4 and stats["tokens/loss"] == 13.0
    assert float(loss) == pytest.approx(sum(rows) / 4, rel=1e-5)


def run_vf_train(config: Path, out: Path, pythonpath: str | None = None) -> list[dict]:
    """``vf-train @ config`` to the end; the logged training steps of ``out/metrics.jsonl``."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], capture_output=True,
                            text=True, env=env, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if "tokens/loss" in r]


@pytest.mark.server
def test_example_loss_trains_by_config_key_alone(server, model_dir, tmp_path, restore_base_weights):
    config = write_cpu_config(tmp_path / "gspo.toml", model_dir, tmp_path / "gspo", server.port, max_steps=2,
                              batch_size=8, rollouts_per_example=4, micro_batch_size=4, max_tokens=12,
                              loss_type="custom_loss:gspo_loss")
    steps = run_vf_train(config, tmp_path / "gspo", pythonpath=str(EXAMPLES))
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert 0.5 < s["sequence_ratio"] < 2.0 and 0.5 < s["importance_ratio"] < 2.0
        assert math.isfinite(s["loss"]) and s["tokens/loss"] > 0 and "masked/low_fraction" not in s


@pytest.mark.server
@pytest.mark.slow  # formulas: test_loss.py (dapo), test_batching.py (group_mean_std); the seam trains below (grpo)
def test_builtin_dapo_and_grpo_advantage_train(server, model_dir, tmp_path, restore_base_weights):
    config = write_cpu_config(tmp_path / "dapo.toml", model_dir, tmp_path / "dapo", server.port, max_steps=2,
                              batch_size=8, rollouts_per_example=4, micro_batch_size=8, max_tokens=12,
                              loss_type="dapo", advantage_type="group_mean_std")
    steps = run_vf_train(config, tmp_path / "dapo")
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert {"clipped/low_fraction", "clipped/high_fraction", "entropy", "logprob_diff/max"} <= set(s)
        assert 0.5 < s["importance_ratio"] < 2.0 and math.isfinite(s["loss"])
        # GRPO's advantage: within a group with any spread, |advantages| average about 1
        assert s["advantage/absmean"] == 0.0 or 0.3 < s["advantage/absmean"] < 1.5


@pytest.mark.server
@pytest.mark.slow
# each formula is checked in the default tier (test_loss.py:
# test_trl_losses_match_their_formulas_over_micro_batches_and_processes), each name's resolution there too
# (test_losses_resolve_by_name_and_module_path), and a loss chosen by config key trains there
# (test_example_loss_trains_by_config_key_alone)
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "bnpo", "gspo"])
def test_trl_loss_types_train(server, model_dir, tmp_path, restore_base_weights, loss_type):
    """TRL's loss names train by the config key alone: two steps of vf-train each, with the clip's statistics
    (GSPO's sequence ratio besides)."""
    out = tmp_path / loss_type
    config = write_cpu_config(tmp_path / f"{loss_type}.toml", model_dir, out, server.port, max_steps=2, batch_size=8,
                              rollouts_per_example=4, micro_batch_size=4, max_tokens=12, loss_type=loss_type)
    steps = run_vf_train(config, out)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert {"clipped/low_fraction", "clipped/high_fraction", "entropy"} <= set(s) and "masked/low_fraction" not in s
        assert 0.5 < s["importance_ratio"] < 2.0 and math.isfinite(s["loss"]) and s["tokens/loss"] > 0
        assert ("sequence_ratio" in s) == (loss_type == "gspo")
