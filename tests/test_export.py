"""A run ends with something to use: the summary it prints (from its own metrics.jsonl), no
weight-sync file left behind, and ``vf-rl export`` turning its last checkpoint into a model
directory that transformers loads (logits equal to the merged policy's) and ``vf-rl eval --serve``
serves and evaluates. Full-weight checkpoints export too; bad input is one line, exit status 2.

The end-to-end test runs a real ``vf-train`` against the session's real vf-vllm (SmolLM2 on the CPU)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest
import torch
from conftest import write_cpu_config

import vf_rl  # noqa: F401  first: hides a CUDA torchvision beside CPU torch before transformers loads

PROMPT = "Reverse the text character by character: hello world"


def vf_rl_cmd(*argv, timeout=900):
    return subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", *map(str, argv)], capture_output=True,
                          text=True, timeout=timeout)


def logits(model, tokenizer) -> torch.Tensor:
    """Next-token logits [1, T, V] (float32) of :data:`PROMPT` under ``model``."""
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits.float()


def in_base_dtype(model_dir, state_dict: dict[str, torch.Tensor]):
    """The base model (bfloat16, RoPE buffers in float32 as ``from_pretrained`` makes them) with
    ``state_dict``'s weights cast to bfloat16: what an export of those weights must load as."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state_dict.items()})
    return model


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.server
def test_run_ends_with_summary_then_export_loads_and_serves(server, model_dir, tmp_path, restore_base_weights):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    config = write_cpu_config(tmp_path / "export.toml", model_dir, run, server.port, run_name="export",
                              micro_batch_size=4, rollouts_per_example=2, batch_size=4, max_steps=2, max_tokens=8,
                              save_steps=2, learning_rate=2e-3, seed=0, eval_strategy="steps", eval_steps=2,
                              num_eval_examples=2, eval_rollouts_per_example=2)
    trained = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], capture_output=True,
                             text=True, timeout=900)
    assert trained.returncode == 0, trained.stdout[-4000:] + trained.stderr[-4000:]

    # the output ends with the summary, and its numbers are those of metrics.jsonl
    lines = trained.stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("Run summary ("))
    summary = "\n".join(lines[start:])
    assert (run / "summary.txt").read_text() == summary + "\n"
    steps = [r for r in records(run) if "reward" in r]
    evals = [r for r in records(run) if "eval/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and [r["step"] for r in evals] == [0, 2]
    mean = statistics.fmean(r["reward"] for r in steps)  # 2 steps: the first and last "5" are both steps 1-2
    best = max(steps, key=lambda r: r["reward"])
    seconds = steps[-1]["timing/elapsed_s"]
    assert f"steps:           2 of 2, {seconds:.0f} s of training ({seconds / 2:.1f} s per step)" in summary
    assert (f"reward:          first {mean:.3f} (mean of steps 1-2), last {mean:.3f} (mean of steps 1-2), "
            f"best {best['reward']:.3f} (step {best['step']})") in summary
    assert (f"held-out reward: {evals[0]['eval/reward']:.3f} at step 0 -> {evals[1]['eval/reward']:.3f} at step 2"
            in summary)
    assert f"last checkpoint: {run / 'checkpoint-2'}" in summary
    assert f"vf-rl export {run} {run / 'model'}" in summary
    # only checkpoints hold weights: the weight-sync file (and its directory) went with the run's end
    assert not (run / "weights").exists()

    # export the run directory: its last checkpoint, LoRA merged into the base model, in its dtype
    out = tmp_path / "exported"
    exported = vf_rl_cmd("export", run, out)
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.splitlines()[-1] == str(out)
    assert not list(tmp_path.glob(".exported.tmp-*"))
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16  # the base model's dtype (training ran in float32)
    assert (out / "generation_config.json").is_file() and (out / "tokenizer.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy = PeftModel.from_pretrained(base, str(run / "checkpoint-2")).merge_and_unload()  # merged in float32
    expected = logits(in_base_dtype(model_dir, policy.state_dict()), tokenizer)
    assert torch.equal(logits(model, tokenizer), expected)
    # the adapter moved the policy: what is exported is not the base model
    assert not torch.equal(expected, logits(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer))

    # vf-rl eval serves the exported directory with vf-vllm and evaluates it
    rollouts = tmp_path / "eval.jsonl"
    evaluated = vf_rl_cmd("eval", "reverse-text", "-m", out, "--serve", "--vllm-args=--enforce-eager --max-model-len 1024",
                          "-n", 2, "-r", 2, "-t", 8, "-a", json.dumps({"source": "offline", "few_shot": 2}),
                          "-o", rollouts)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    written = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert len(written) == 4
    for r in written:
        assert r["error"] is None and 0.0 <= r["reward"] <= 1.0 and r["completion_tokens"] > 0


def test_full_weights_checkpoint_exports_in_the_base_dtype(model_dir, tmp_path):
    """A full-weight checkpoint written by RLTrainer's own checkpoint save (``use_lora = false``,
    float32 training of a bfloat16 base) exports as its weights in bfloat16, logits equal."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.config.resolved_toml import record_python_run
    from vf_rl.env_api import load_environment
    from vf_rl.trainer.export import export

    run = tmp_path / "run"
    args = RLConfig(output_dir=str(run), use_cpu=True, use_lora=False, batch_size=4, rollouts_per_example=2,
                    micro_batch_size=4, max_steps=1, report_to=[], save_only_model=True)
    env = load_environment("reverse-text", source="offline", few_shot=2)
    trainer = RLTrainer(model=str(model_dir), env=env, args=args)
    with torch.no_grad():  # a policy that is not the base model's
        for p in trainer.model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.01)
    record_python_run(trainer.args, trainer.served_model_name, trainer.env)  # what train() writes first
    trainer.state.global_step = 1
    trainer._save_checkpoint(trainer.model, None)
    assert (run / "checkpoint-1" / "model.safetensors").is_file()

    out, checkpoint, kind = export(run, tmp_path / "exported")
    assert (checkpoint, kind) == (run / "checkpoint-1", "full")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert torch.equal(logits(model, tokenizer), logits(in_base_dtype(model_dir, trainer.model.state_dict()), tokenizer))


def test_summary_reads_the_last_run_of_the_file_across_a_resume(tmp_path):
    """The summary of a metrics.jsonl that an earlier fresh run also wrote, with a resume in the
    last run (its ``timing/elapsed_s`` starts again), and the last complete checkpoint by step."""
    from vf_rl.trainer.callbacks import run_summary

    earlier = [{"step": s, "reward": 0.9, "timing/elapsed_s": 50.0 * s} for s in (1, 2, 3)]
    rewards = [0.1, 0.2, 0.3, 0.4, 0.5, 0.9]
    elapsed = [2.0, 4.0, 6.0, 3.0, 6.0, 9.0]  # resumed from step 3's checkpoint: 6 s, then 9 s more
    last = [{"step": 0, "eval/reward": 0.05},
            *({"step": s, "reward": r, "timing/elapsed_s": e} for s, r, e in zip(range(1, 7), rewards, elapsed)),
            {"step": 6, "eval/reward": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier + last))
    for name in ("checkpoint-4", "checkpoint-12", ".tmp-checkpoint-14/checkpoint-14", "checkpoint-20"):
        (tmp_path / name).mkdir(parents=True)
    for name in ("checkpoint-4", "checkpoint-12", ".tmp-checkpoint-14/checkpoint-14"):
        (tmp_path / name / "adapter_config.json").write_text("{}")
    assert run_summary(tmp_path, 6).splitlines()[1:] == [
        "  steps:           6 of 6, 15 s of training (2.5 s per step)",
        "  reward:          first 0.300 (mean of steps 1-5), last 0.460 (mean of steps 2-6), best 0.900 (step 6)",
        "  held-out reward: 0.050 at step 0 -> 0.250 at step 6 (eval/reward)",
        f"  last checkpoint: {tmp_path / 'checkpoint-12'}",
        f"  use it:          vf-rl export {tmp_path} {tmp_path / 'model'}   (vf-rl export --help)"]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    def refused(source, out, expected):
        result = vf_rl_cmd("export", source, out, timeout=120)
        assert result.returncode == 2, (source, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("vf-rl export: error: "), result.stderr
        assert expected in result.stderr, result.stderr

    run, out = tmp_path / "run", tmp_path / "out"
    refused(tmp_path / "missing", out, "no such directory")
    (run / "logs").mkdir(parents=True)
    refused(run, out, "no checkpoint-<step> directory")
    (run / "checkpoint-3").mkdir()
    (run / "checkpoint-3" / "adapter_config.json").write_text("{}")
    refused(run, out, "checkpoint-3: no weights file (adapter_model.safetensors, adapter_model.bin)")
    (run / "checkpoint-3" / "adapter_model.safetensors").write_bytes(b"")
    refused(run, out, "resolved.toml: config file not found")
    (run / "resolved.toml").write_text("[trainer]\ngpus = 0\n")
    refused(run, out, "resolved.toml: no 'model' key")
    (run / "resolved.toml").write_text(f'model = "{tmp_path / "gone"}"\n')
    refused(run / "checkpoint-3", out, f"base model: local model directory '{tmp_path / 'gone'}' does not exist")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.json").write_text("{}")
    refused(run, tmp_path / "taken", "exists and is not an empty directory")
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))
