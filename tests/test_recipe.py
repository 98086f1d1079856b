"""The RL recipe against the real CPU server: online difficulty filtering, KL to the
reference policy, several environments in one run, deeper off-policy generation."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_cpu_config
from test_algorithm import run_vf_train

from vf_rl.config.sections import OrchestratorConfig
from vf_rl.orchestrator.filtering import DifficultyFilter
from vf_rl.orchestrator.orchestrator import Orchestrator


def spread_env():
    """Rows answered ``"flat"`` always score 0.5 (no spread: no gradient); the others score the
    parity of the completion's length (spread at temperature 1)."""
    from datasets import Dataset

    from vf_rl.env_api import Rubric, SingleTurnEnv

    def parity_or_flat(completion, answer, **kwargs) -> float:
        return 0.5 if answer == "flat" else float(len(completion[-1]["content"]) % 2)

    rows = [{"question": f"Write a word with {i} letters.", "answer": "flat" if i % 2 else "varied"}
            for i in range(2, 14)]
    return SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=Rubric(funcs=[parity_or_flat]))


def filtered_batch(server, rows, env, difficulty_filter, step=0):
    orch = Orchestrator(env, rows, base_url=f"{server.base_url}/v1", model_name=server.model,
                        difficulty_filter=difficulty_filter,
                        config=OrchestratorConfig(batch_size=8, rollouts_per_example=4,
                                                  sampling_args={"max_tokens": 8, "temperature": 1.0}, max_seq_len=256))
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
    """For every loss, built-in or custom (examples/custom_loss.py), the trainer adds beta * k3
    on the loss tokens / N and logs kl_ref."""
    import torch

    from vf_rl.algorithm.loss import LossInputs, cispo_loss, dapo_loss, micro_batch_loss
    from vf_rl.config.rl_config import RLConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from custom_loss import gspo_loss

    args = RLConfig(output_dir="/tmp/unused", use_cpu=True, batch_size=4, rollouts_per_example=2, micro_batch_size=2,
                    beta=0.5, report_to="none")
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0, -3.0]])
    mask = torch.tensor([[True, True, False]])
    d = [-0.5, 0.0]  # ref - logp on the loss tokens
    k3 = sum(math.exp(x) - x - 1 for x in d)
    for loss_fn in (cispo_loss, dapo_loss, gspo_loss):
        inputs = LossInputs(logp, logp.detach().clone(), torch.tensor([1.0]), mask, torch.zeros(1, 3))
        without, stats_without = micro_batch_loss(loss_fn, inputs, args, 2.0)
        inputs.ref_logprobs = ref
        with_kl, stats = micro_batch_loss(loss_fn, inputs, args, 2.0)
        assert stats["kl_ref"].item() == pytest.approx(k3)
        assert (with_kl - without).item() == pytest.approx(0.5 * k3 / 2.0)
        assert "kl_ref" not in stats_without


@pytest.mark.parametrize("use_lora", [True, False])
def test_kl_reference_is_the_initial_policy(model_dir, tmp_path, use_lora):
    """kl_ref is 0 while the policy equals the reference and grows once the trained weights move;
    LoRA: the reference is the base model with the adapter off (no copy); full weights: a frozen copy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.orchestrator.samples import Sample

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


def test_custom_loss_with_kl_equals_built_in_cispo(model_dir, tmp_path):
    """beta > 0 with a custom loss that re-implements CISPO in a few lines: the trainer adds the
    KL and normalises, so the loss, kl_ref and the gradients equal the built-in's; with all
    advantages 0 only the KL moves the weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.algorithm.loss import LossOutput, log_importance_ratio
    from vf_rl.env_api import load_environment
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.orchestrator.samples import Sample

    def my_cispo(inputs, args):
        ratio = torch.exp(log_importance_ratio(inputs))
        keep = (ratio >= args.mask_ratio_low) & (ratio <= args.mask_ratio_high)
        return LossOutput((-ratio * inputs.advantages[:, None]) * keep, {})

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
    results = {}
    for name, loss_fn in (("cispo", None), ("custom", my_cispo)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        args = RLConfig(output_dir=str(tmp_path / name), use_cpu=True, batch_size=4, rollouts_per_example=2,
                        micro_batch_size=2, max_steps=1, report_to=[], beta=0.1, use_lora=True)
        trainer = RLTrainer(model=model, env=env, args=args, processing_class=tokenizer, served_model_name="t",
                            loss_fn=loss_fn)
        with torch.no_grad():  # move the adapter away from the reference (the base model)
            generator = torch.Generator().manual_seed(1)
            for pname, p in trainer.model.named_parameters():
                if "lora_B" in pname:
                    p.add_(torch.randn(p.shape, generator=generator) * 0.02)
        for advantage in (1.0, 0.0):
            samples = [Sample(list(range(100, 100 + p + c)), [0] * p + [1] * c, [-1.0] * (p + c), a * advantage)
                       for p, c, a in ((5, 3, 1.0), (4, 2, -1.0), (6, 4, 0.5), (3, 1, -0.5))]
            trainer.model.zero_grad()
            loss, stats = trainer._train_on_batch(trainer.model, Batch(step=0, samples=samples, rollouts=[]))
            grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
            results[name, advantage] = float(loss), stats["kl_ref"], grads
    for advantage in (1.0, 0.0):
        (loss_a, kl_a, grad_a), (loss_b, kl_b, grad_b) = results["cispo", advantage], results["custom", advantage]
        assert kl_a > 1e-4 and kl_b == pytest.approx(kl_a, rel=1e-5)
        assert loss_b == pytest.approx(loss_a, rel=1e-5)
        assert float((grad_a - grad_b).norm() / grad_a.norm()) < 1e-5
    assert float(results["custom", 0.0][2].norm()) > 0  # the KL term alone trains


@pytest.mark.slow
@pytest.mark.server
def test_two_steps_ahead_with_kl_trains_and_ratios_stay_sane(server, model_dir, tmp_path, restore_base_weights):
    """max_off_policy_steps = 2 (given by its older name) and beta > 0 against the real server:
    batches 2 and 3 were submitted two steps before they trained (staleness 2), the importance
    ratio stays near 1, and kl_ref is 0 at step 1 (adapter still zero) and positive later."""
    out = tmp_path / "ahead"
    config = write_cpu_config(tmp_path / "ahead.toml", model_dir, out, server.port, max_steps=4, batch_size=8,
                              rollouts_per_example=4, micro_batch_size=8, max_tokens=12, num_batches_ahead=2,
                              beta=0.1)
    steps = run_vf_train(config, out)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert [s["off_policy/staleness"] for s in steps] == [0, 1, 2, 2]
    for s in steps:
        assert math.isfinite(s["loss"]) and 0.5 < s["importance_ratio"] < 2.0 and s["mismatch_kl"] < 0.1
        assert s["tokens/masked_fraction"] < 0.2
    assert steps[0]["kl_ref"] < 1e-6 < steps[-1]["kl_ref"]


def test_mixture_rows_are_a_pure_function_of_the_step():
    """Weights 2:1 split each batch's prompts 2:1 on average; a fresh mixture asked for step 9
    first (as after a resume) gives the same rows as one that went through steps 0..9."""
    from vf_rl.env_api.mixture import EnvMixture

    envs = {"a": object(), "b": object()}
    rows = [{"env": "a", "i": i} for i in range(7)] + [{"env": "b", "i": i} for i in range(5)]
    walked = EnvMixture(envs, {"a": 2.0, "b": 1.0}, seed=1)
    steps = [walked.rows_for_step(rows, s, 4) for s in range(10)]
    assert EnvMixture(envs, {"a": 2.0, "b": 1.0}, seed=1).rows_for_step(rows, 9, 4) == steps[9]
    assert all(len(batch) == 4 for batch in steps)
    share_a = sum(row["env"] == "a" for batch in steps for row in batch) / 40
    assert 0.55 < share_a < 0.8
    a_rows = [row["i"] for batch in steps for row in batch if row["env"] == "a"]
    assert a_rows[:8] == [0, 1, 2, 3, 4, 5, 6, 0]  # each environment goes through its rows in order


def test_env_tables_parse_and_bad_weight_is_one_line(tmp_path):
    import tomli_w

    from vf_rl.config.schema import ConfigError, load_config

    data = {"model": "Qwen/Qwen3-4B-Instruct-2507", "inference": {"gpus": 0}, "trainer": {"gpus": 0, "args": {}},
            "env": [{"id": "reverse-text", "weight": 2.0}, {"id": "alphabet-sort"}]}
    path = tmp_path / "two.toml"
    path.write_text(tomli_w.dumps(data))
    assert [(e.id, e.weight) for e in load_config(path).envs] == [("reverse-text", 2.0), ("alphabet-sort", 1.0)]
    data["env"][1]["weight"] = 0
    path.write_text(tomli_w.dumps(data))
    with pytest.raises(ConfigError, match=r"env\.1\.weight: .*greater than 0"):
        load_config(path)


@pytest.mark.server
def test_two_environments_train_and_log_each_reward(server, model_dir, tmp_path, restore_base_weights):
    """reverse-text + alphabet-sort with weights 2:1 (batch of 3 prompts: 2 and 1 each step)."""
    import tomli_w

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    out = tmp_path / "mix"
    config = write_cpu_config(tmp_path / "mix.toml", model_dir, out, server.port, max_steps=2, batch_size=6,
                              rollouts_per_example=2, micro_batch_size=6, max_tokens=12)
    data = tomllib.loads(config.read_text())
    data["env"] = [{"id": "reverse-text", "weight": 2.0, "args": {"few_shot": 2, "source": "offline"}},
                   {"id": "alphabet-sort", "weight": 1.0,
                    "args": {"source": "offline", "min_turns": 1, "max_turns": 1, "max_names_per_turn": 2}}]
    config.write_text(tomli_w.dumps(data))
    steps = run_vf_train(config, out)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["env/reverse-text/rollouts"] == 4 and s["env/alphabet-sort/rollouts"] == 2
        assert 0 <= s["env/reverse-text/reward"] <= 1 and 0 <= s["env/alphabet-sort/reward"] <= 1
        rollouts = 4 * s["env/reverse-text/reward"] + 2 * s["env/alphabet-sort/reward"]
        assert rollouts / 6 == pytest.approx(s["reward"], abs=1e-6)
    # resume for one more step: batch 3 takes the rows a fresh mixture assigns to step 3
    data["trainer"]["args"]["max_steps"] = 3
    config.write_text(tomli_w.dumps(data))
    result = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config), "--resume"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recorded] == [1, 2, 3]
    from transformers import AutoTokenizer

    from vf_rl.config.schema import load_config
    from vf_rl.env_api.registry import load_environments
    from vf_rl.orchestrator.samples import prompt_rows

    cfg = load_config(config)
    mixture = load_environments(cfg.envs, seed=42)
    rows = prompt_rows(mixture.get_dataset(), AutoTokenizer.from_pretrained(model_dir), 512, shuffle_seed=42)
    expected = [[row["row_id"] for row in mixture.rows_for_step(rows, step, 3)] for step in range(3)]
    assert [r["rows"] for r in recorded] == expected


def test_recipe_keys_are_in_the_generated_table():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    for key in ("trainer.args.use_difficulty_filtering", "trainer.args.difficulty_threshold",
                "trainer.args.difficulty_min_reward", "trainer.args.difficulty_max_reward",
                "trainer.args.oversampling_factor", "trainer.args.max_filter_rounds", "trainer.args.beta",
                "trainer.args.max_off_policy_steps", "env.weight"):
        assert f"| `{key}` |" in readme, key
