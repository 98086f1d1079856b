"""Out of memory costs a micro batch, not the run (``trainer/micro_step.py``), on the CPU.

CUDA's out of memory cannot happen on the CPU, so the one simulated part is the failure itself:
``VF_RL_FAIL_ALLOC_ABOVE_TOKENS`` makes every micro batch over K tokens raise
``torch.OutOfMemoryError`` in its forward, or (``K:backward``) in the middle of its backward, after
part of its gradient was added. The rest is real: RLTrainer's step on a small random Llama with
SmolLM2's tokenizer, its planning, packing, loss and backward, the trainer's optimizer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from test_packing import group_samples

from vf_rl.trainer.micro_step import FAIL_ALLOC_ENV, OutOfMemoryStop

SPLIT_LINE = re.compile(r"\[vf-rl\] out of memory on a micro batch of (\d+) tokens \((\d+) samples\); split into 2 and retried")


def _trainer(model_dir: Path, out: Path, **keys):
    """RLTrainer on a random 2-layer Llama (seed 0: every call the same weights), CPU, float32; a
    vocabulary of 1,024 (the samples' tokens are below 1,000, SmolLM2's pad token is 2), so a pass costs little."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.env_api import load_environment

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=1024,
                                         pad_token_id=tokenizer.pad_token_id))
    env = load_environment("reverse-text", source="offline", num_train_examples=8, num_eval_examples=1)
    args = RLConfig(output_dir=str(out), use_cpu=True, batch_size=8, rollouts_per_example=4, micro_batch_size=4,
                    max_seq_len=64, max_steps=2, report_to=[], use_lora=False, save_steps=1000, **keys)
    return RLTrainer(model=model, env=env, args=args, processing_class=tokenizer, served_model_name="t")


def _batch(trainer, spec, seed=3):
    """A batch of groups sharing prompts, with sampling log-probs near the model's own (ratios ~1)."""
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer.speed.logprobs import selective_logprobs

    samples = group_samples(spec, seed=seed)
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.input_ids])
            own, _ = selective_logprobs(trainer.model(input_ids=ids).logits[:, :-1], ids[:, 1:])
            s.sampling_logprobs = [0.0] + (own[0] + 0.05 * torch.randn(len(own[0]), generator=noise)).tolist()
    return Batch(step=0, samples=samples, rollouts=[], metrics={})


def _step(trainer, batch):
    """One training step as ``Trainer`` runs it: the micro batches, the trainer's optimizer steps.
    Returns the stats, the gradient (flat) and the parameters after the step (flat)."""
    trainer.model.zero_grad(set_to_none=True)
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    _, stats = trainer._train_on_batch(trainer.model, batch)
    grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
    trainer.optimizer.step()
    return stats, grad, torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


# three groups, samples of 14-41 tokens; a 96-token budget packs them into micro batches of 69-95 tokens
SPEC = [(9, [20, 5, 32, 14]), (11, [3, 25, 8, 30]), (6, [12, 18, 35, 9])]


@pytest.mark.parametrize("keys, limit", [
    (dict(micro_batch_tokens=96, loss_type="grpo"), "60:backward"),  # packed rows, per-sample weights from the totals
    (dict(micro_batch_tokens=96), "60"),  # packed rows, cispo, in the forward
    (dict(padding_free=False, loss_type="dapo"), "100:backward"),  # padded [4, L] rows of 164 positions
], ids=["packed-grpo-backward", "packed-cispo-forward", "padded-dapo-backward"])
def test_a_micro_batch_out_of_memory_is_split_and_the_step_unchanged(model_dir, tmp_path, monkeypatch, capsys, keys,
                                                                     limit):
    """Micro batches over K tokens run out of memory (in the forward, or half-way through the
    backward, leaving part of their gradient added): each is split and retried, the step completes,
    and its gradient, statistics and the weights after the optimizer's step are those of the same
    step with enough memory; the split is logged with the micro batch's tokens and counted in
    ``oom/splits``; later micro batches of that size are split before they run."""
    clean = _trainer(model_dir, tmp_path / "clean", **keys)
    batch = _batch(clean, SPEC)
    stats_ref, grad_ref, params_ref = _step(clean, batch)
    plan = [mb.input_ids.numel() for mb in _plan(clean, batch)]
    k = int(limit.split(":")[0])
    assert max(plan) > k and len(plan) > 1, plan

    failing = _trainer(model_dir, tmp_path / "failing", **keys)
    monkeypatch.setenv(FAIL_ALLOC_ENV, limit)
    capsys.readouterr()
    stats, grad, params = _step(failing, batch)
    splits = [(int(n), int(s)) for n, s in SPLIT_LINE.findall(capsys.readouterr().out)]
    assert splits and all(n > k and s > 1 for n, s in splits) and splits[0][0] in plan, splits
    assert stats.keys() == stats_ref.keys() and stats["tokens/loss"] == stats_ref["tokens/loss"]
    for key in ("importance_ratio", "mismatch_kl", "entropy"):
        assert stats[key] == pytest.approx(stats_ref[key], rel=1e-5), key
    # float32 sums in another order (and other matmul shapes); a gradient left from the failed
    # backward would add a whole micro batch's share (tens of percent) to some parameters
    assert float((grad - grad_ref).norm() / grad_ref.norm()) < 1e-5
    torch.testing.assert_close(params, params_ref, rtol=1e-5, atol=1e-6)
    failing._timings, failing._started = {"train_s": 1.0}, 0.0
    failing._record(batch, stats)
    assert failing._step_metrics["oom/splits"] >= len(splits)
    clean._timings, clean._started = {"train_s": 1.0}, 0.0
    clean._record(batch, stats_ref)
    assert clean._step_metrics["oom/splits"] == 0.0

    # the next step: micro batches of the failed size are split before they run (no failure, no line)
    _step(failing, batch)
    assert not SPLIT_LINE.search(capsys.readouterr().out)


def _plan(trainer, batch):
    from vf_rl.trainer.speed.packing import plan_micro_batches

    a = trainer.args
    return plan_micro_batches(batch.samples, 1, 0, a.micro_batch_size, a.micro_batch_tokens, a.share_prompts,
                              trainer.processing_class.pad_token_id, a.padding_free)


def test_one_sample_that_does_not_fit_stops_with_one_line_and_a_checkpoint(model_dir, tmp_path, monkeypatch):
    """A sample of 45 tokens alone over the memory (40 tokens here): the micro batches are split
    down to it, then the run stops with one line naming the sample's length and the keys to
    change, and the last complete step's checkpoint is saved (here step 1, trained before)."""
    trainer = _trainer(model_dir, tmp_path / "out", micro_batch_tokens=96)
    batch = _batch(trainer, SPEC)
    _step(trainer, batch)  # step 1, complete
    trainer.state.global_step = 1
    trainer.model.zero_grad(set_to_none=True)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    monkeypatch.setenv(FAIL_ALLOC_ENV, "40:backward")
    with pytest.raises(OutOfMemoryStop) as stop:
        trainer._train_on_batch(trainer.model, _batch(trainer, [(9, [20, 36, 14])], seed=4))
    line = str(stop.value)
    assert "\n" not in line and "one sample of 45 tokens" in line, line
    assert "trainer.args.max_seq_len (now 64)" in line and "max_tokens" in line and "gradient_checkpointing" in line
    checkpoint = tmp_path / "out" / "checkpoint-1"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "optimizer.pt").is_file()
    from safetensors.torch import load_file

    saved = load_file(checkpoint / "model.safetensors")
    assert all(torch.equal(saved[k], weights[k]) for k in saved)  # the step's weights, not the failed one's

    # the shared-GPU layout names vLLM's fixed share too
    trainer.server_shares_gpu = 0.45
    with pytest.raises(OutOfMemoryStop, match=r"inference.args.gpu_memory_utilization, now 0.45"):
        trainer._train_on_batch(trainer.model, _batch(trainer, [(9, [36])], seed=4))


@pytest.mark.slow
@pytest.mark.server
def test_vf_train_splits_and_goes_on_then_stops_with_status_4(server, model_dir, tmp_path, restore_base_weights):
    """``vf-train`` against the real server, with micro batches over 256 tokens out of memory (every
    sample is at most ``max_seq_len`` = 256): both steps train, the split lines are in its output and
    ``oom/splits`` in ``metrics.jsonl``; with every micro batch over 8 tokens out of memory, one
    sample alone does not fit: exit status 4 and the one line on stderr."""
    import json
    import os
    import subprocess
    import sys

    from conftest import write_cpu_config

    def vf_train(name: str, limit: str) -> subprocess.CompletedProcess:
        config = write_cpu_config(tmp_path / f"{name}.toml", model_dir, tmp_path / name, server.port, max_steps=2,
                                  batch_size=8, rollouts_per_example=4, micro_batch_size=8, max_tokens=12)
        return subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], capture_output=True,
                              text=True, env={**os.environ, FAIL_ALLOC_ENV: limit}, timeout=900)

    split = vf_train("split", "256")
    assert split.returncode == 0, (split.stdout + split.stderr)[-4000:]
    assert all(int(n) > 256 for n, _ in SPLIT_LINE.findall(split.stdout)) and SPLIT_LINE.search(split.stdout)
    steps = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "tokens/loss" in s]
    assert [s["step"] for s in steps] == [1, 2] and steps[0]["oom/splits"] >= 1 and steps[0]["tokens/loss"] > 0

    stop = vf_train("stop", "8")
    assert stop.returncode == 4, (stop.stdout + stop.stderr)[-4000:]
    lines = [line for line in stop.stderr.splitlines() if line.startswith("vf-train: error:")]
    assert len(lines) == 1 and re.search(r"out of memory in the \w+ of one sample of \d+ tokens", lines[0]), stop.stderr[-2000:]
    assert "Traceback" not in stop.stderr and not list((tmp_path / "stop").glob("checkpoint-*"))
