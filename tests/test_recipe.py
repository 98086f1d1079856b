"""The RL recipe of issue 15 against the real CPU server: online difficulty filtering, KL to the
reference policy, several environments in one run, deeper off-policy generation."""

from __future__ import annotations

import math

import pytest
from conftest import write_cpu_config
from test_algorithm import run_vf_train

from vf_rl.trainer.filtering import DifficultyFilter
from vf_rl.trainer.orchestrator import Orchestrator


def spread_env():
    """Rows answered ``"flat"`` always score 0.5 (no spread: no gradient); the others score the
    parity of the completion's length (spread at temperature 1)."""
    from datasets import Dataset

    from vf_rl.envs import Rubric, SingleTurnEnv

    def parity_or_flat(completion, answer, **kwargs) -> float:
        return 0.5 if answer == "flat" else float(len(completion[-1]["content"]) % 2)

    rows = [{"question": f"Write a word with {i} letters.", "answer": "flat" if i % 2 else "varied"}
            for i in range(2, 14)]
    return SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=Rubric(funcs=[parity_or_flat]))


def filtered_batch(server, rows, env, difficulty_filter, step=0):
    orch = Orchestrator(env, rows, base_url=f"{server.base_url}/v1", model_name=server.model, batch_size=8,
                        rollouts_per_example=4, sampling_args={"max_tokens": 8, "temperature": 1.0},
                        max_seq_len=256, difficulty_filter=difficulty_filter)
    try:
        return orch.wait(step)
    finally:
        orch.close()


def test_extra_rows_are_a_function_of_step_and_round():
    rows = [{"row_id": i} for i in range(50)]
    f = DifficultyFilter(seed=3)
    assert f.extra_rows(rows, 7, 1, 5) == f.extra_rows(rows, 7, 1, 5)
    assert f.extra_rows(rows, 7, 1, 5) != f.extra_rows(rows, 7, 2, 5)
    assert f.keep([0.0, 1.0]) and not f.keep([0.5, 0.5]) and not f.keep([1.0, 1.0 + 1e-9])
    assert not DifficultyFilter(max_reward=0.4).keep([0.0, 1.0])  # mean 0.5: too easy


@pytest.mark.server
def test_filtering_drops_groups_without_spread_and_refills(server, capfd):
    env = spread_env()
    rows = list(env.get_dataset())  # alternating flat / varied: the step's own rows are half flat
    batch = filtered_batch(server, rows, env, DifficultyFilter(oversampling_factor=1.5, max_rounds=8))
    groups = [batch.rollouts[i:i + 4] for i in range(0, 8, 4)]
    assert len(batch.rollouts) == 8 and len(batch.row_ids) == 2
    for group in groups:  # every kept group has reward spread, so none is a "flat" row
        assert group[0].answer == "varied" and len({r.reward for r in group}) > 1
    assert batch.metrics["filter/filtered_fraction"] > 0 and batch.metrics["filter/extra_rollouts"] >= 4
    assert batch.metrics["advantage/absmean"] > 0
    assert "groups had reward spread" not in capfd.readouterr().err


@pytest.mark.server
def test_hopeless_batch_ends_after_max_rounds_with_a_message(server, capfd):
    env = spread_env()
    flat = [row for row in env.get_dataset() if row["answer"] == "flat"]
    batch = filtered_batch(server, flat, env, DifficultyFilter(max_rounds=2))
    assert len(batch.rollouts) == 8 and batch.metrics["filter/rounds"] == 2
    assert batch.metrics["filter/filtered_fraction"] == 1.0
    assert "only 0/2 groups had reward spread after 2 round(s)" in capfd.readouterr().err


@pytest.mark.server
def test_vf_train_with_filtering_logs_its_metrics(server, model_dir, tmp_path, restore_base_weights):
    out = tmp_path / "filter"
    config = write_cpu_config(tmp_path / "filter.toml", model_dir, out, server.port, max_steps=2, batch_size=8,
                              rollouts_per_example=4, micro_batch_size=8, max_tokens=12,
                              use_difficulty_filtering=True, max_filter_rounds=3)
    steps = run_vf_train(config, out)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert 0 <= s["filter/filtered_fraction"] <= 1 and s["filter/rounds"] >= 1
        assert s["filter/extra_rollouts"] == 0 or s["filter/filtered_fraction"] > 0
        assert math.isfinite(s["loss"]) and 0.5 < s["importance_ratio"] < 2.0


def test_kl_penalty_is_beta_times_k3_per_loss_token():
    import torch

    from vf_rl.config.rl_config import RLConfig
    from vf_rl.trainer.loss import LossInputs, cispo_loss, dapo_loss

    args = RLConfig(output_dir="/tmp/unused", use_cpu=True, batch_size=4, rollouts_per_example=2, micro_batch_size=2,
                    beta=0.5, report_to="none")
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, -3.0]])
    mask = torch.tensor([[True, True, False]])
    d = [-0.5, 0.0]  # ref - logp on the loss tokens
    k3 = sum(math.exp(x) - x - 1 for x in d)
    for loss_fn in (cispo_loss, dapo_loss):
        inputs = LossInputs(logp, logp.detach().clone(), torch.tensor([1.0]), mask, torch.zeros(1, 3), 2.0)
        without = loss_fn(inputs, args)
        inputs.ref_logprobs = ref
        with_kl = loss_fn(inputs, args)
        assert with_kl.stats["kl_ref"].item() == pytest.approx(k3)
        assert (with_kl.loss - without.loss).item() == pytest.approx(0.5 * k3 / 2.0)
        assert "kl_ref" not in without.stats


@pytest.mark.parametrize("use_lora", [True, False])
def test_kl_reference_is_the_initial_policy(model_dir, tmp_path, use_lora):
    """kl_ref is 0 while the policy equals the reference and grows once the trained weights move;
    LoRA: the reference is the base model with the adapter off (no copy); full weights: a frozen copy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.envs import load_environment
    from vf_rl.trainer.batching import Sample
    from vf_rl.trainer.orchestrator import Batch

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = RLConfig(output_dir=str(tmp_path), use_cpu=True, batch_size=4, rollouts_per_example=2, micro_batch_size=2,
                    max_steps=1, report_to=[], beta=0.1, use_lora=use_lora)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    trainer = RLTrainer(model=model, env=env, args=args, processing_class=tokenizer, served_model_name="t")
    assert (trainer.ref_model is None) == use_lora
    samples = [Sample(list(range(100, 100 + p + c)), [0] * p + [1] * c, [0.0] * (p + c), a)
               for p, c, a in ((5, 3, 1.0), (4, 2, -1.0), (6, 4, 0.5), (3, 1, -0.5))]
    batch = Batch(step=0, samples=samples, rollouts=[])
    _, stats = trainer._train_on_batch(trainer.model, batch)
    assert abs(stats["kl_ref"]) < 1e-6
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if p.requires_grad and ("lora_B" in name or not use_lora):
                p.add_(torch.randn_like(p) * 0.02)
    trainer.model.zero_grad()
    _, stats = trainer._train_on_batch(trainer.model, batch)
    assert stats["kl_ref"] > 1e-4
