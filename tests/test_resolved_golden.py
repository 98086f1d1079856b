"""The resolved run config is the contract between vf-rl, vf-train and vf-vllm: for every shipped
config and a set of configs shaped like the ones the tests run, ``resolved.toml`` (every value and
where it came from) must stay what it was when these snapshots were taken. A code change that moves
or re-derives the config passes only if it resolves every config to the same file.

``VF_RL_WRITE_GOLDEN=1 pytest tests/test_resolved_golden.py`` writes the snapshots again (after a
deliberate change of a default: review the diff of ``tests/data/resolved/``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import write_cpu_config

from vf_rl.config.resolved_toml import to_toml
from vf_rl.config.schema import load_config

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "resolved"
SHIPPED = sorted((ROOT / "configs" / "vf-rl").glob("*.toml"))

# [trainer.args] of the configs the tests write with conftest.write_cpu_config (one per kind of run)
TEST_RUNS = {
    "cpu-default": {},
    "cpu-dapo": dict(max_steps=2, batch_size=8, rollouts_per_example=4, micro_batch_size=8, max_tokens=12,
                     loss_type="dapo", advantage_type="group_mean_std"),
    "cpu-full-weights": dict(run_name="zero3", use_lora=False, learning_rate=1e-3, max_steps=2, batch_size=8,
                             rollouts_per_example=4, micro_batch_size=4, max_tokens=8),
    "cpu-filtering": dict(max_steps=2, batch_size=8, rollouts_per_example=4, micro_batch_size=8, max_tokens=12,
                          use_difficulty_filtering=True, max_filter_rounds=3),
    "cpu-ahead-kl": dict(max_steps=4, batch_size=8, rollouts_per_example=4, micro_batch_size=8, max_tokens=12,
                         num_batches_ahead=2, beta=0.1),
    "cpu-resume-eval": dict(run_name="resume", micro_batch_size=4, rollouts_per_example=2, batch_size=4, max_steps=4,
                            max_tokens=8, lr_scheduler_type="linear", save_steps=2, eval_strategy="steps",
                            eval_steps=2, num_eval_examples=2, eval_rollouts_per_example=2),
    "cpu-budget": dict(run_name="budget", micro_batch_size=4, rollouts_per_example=2, batch_size=4, max_steps=5,
                       max_tokens=8, save_steps=1000, max_time_s=0.001),
    "cpu-two-servers": dict(vllm_server_urls=["http://127.0.0.1:8123", "http://127.0.0.1:8124"], batch_size=16,
                            rollouts_per_example=4, micro_batch_size=8, max_steps=3, max_tokens=8,
                            learning_rate=2e-3),
    "cpu-sampling": dict(top_p=0.9, rollouts_per_example=2, batch_size=4, micro_batch_size=2),
    "cpu-preflight-strict": dict(preflight="strict", max_steps=2, batch_size=8, rollouts_per_example=4,
                                 micro_batch_size=8, max_tokens=96, save_steps=50),
    "cpu-off-policy-2": dict(max_off_policy_steps=2, max_steps=4, batch_size=8, rollouts_per_example=4,
                             micro_batch_size=8, max_tokens=12),
    "cpu-lora-sync": dict(weight_sync="lora", max_steps=2, batch_size=8, rollouts_per_example=4,
                          micro_batch_size=8, max_tokens=12),
}


@pytest.fixture(autouse=True)
def fixed_host(monkeypatch):
    """The host facts that resolution reads, fixed: 8 CPU cores (vLLM's API-server count follows
    them) and no ``nvidia-smi`` (an 80 GB GPU assumed for the shared split)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _normalised(text: str, **paths: Path) -> str:
    """``text`` with the machine's paths named (``<tmp>``, ``<model>``...) and the help text of
    unset keys cut (a key's help may be reworded; its value and origin may not)."""
    for name, path in paths.items():
        text = text.replace(str(path), f"<{name}>")
    return re.sub(r"(?m)^(# \w+: unset) \(.*\)$", r"\1", text)


def _check(name: str, text: str) -> None:
    golden = GOLDEN / f"{name}.toml"
    if os.environ.get("VF_RL_WRITE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"no snapshot {golden} (VF_RL_WRITE_GOLDEN=1 writes it)"
    assert text == golden.read_text(), f"{name}: resolved.toml differs from {golden}"


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_config_resolves_as_before(path, monkeypatch, model_dir):
    monkeypatch.chdir(ROOT)  # the configs name the CPU model's directory and their outputs relative to the clone
    text = to_toml(load_config(path))
    _check(f"shipped-{path.stem}", _normalised(text, model=model_dir, repo=ROOT, home=Path.home()))


@pytest.mark.parametrize("name", sorted(TEST_RUNS))
def test_test_config_resolves_as_before(name, tmp_path, model_dir):
    path = write_cpu_config(tmp_path / f"{name}.toml", model_dir, tmp_path / "run", 8123, **TEST_RUNS[name])
    text = to_toml(load_config(path))
    _check(f"test-{name}", _normalised(text, tmp=tmp_path, model=model_dir))


def test_mixture_and_shared_gpu_resolve_as_before(tmp_path, model_dir):
    import tomli_w

    env = [{"id": "reverse-text", "weight": 2.0, "args": {"few_shot": 2, "source": "offline"}},
           {"id": "alphabet-sort", "weight": 1.0, "args": {"source": "offline"}}]
    for name, data in {
        "mixture": {"model": str(model_dir), "env": env, "inference": {"gpus": 0},
                    "trainer": {"gpus": 0, "args": {"output_dir": str(tmp_path / "run"), "batch_size": 6,
                                                    "rollouts_per_example": 2, "micro_batch_size": 6}}},
        "shared-gpu": {"model": str(model_dir), "env": {"id": "reverse-text", "args": {"source": "offline"}},
                       "inference": {"gpus": 1, "shared": True},
                       "trainer": {"gpus": 1, "args": {"output_dir": str(tmp_path / "run"), "max_seq_len": 512,
                                                       "batch_size": 128, "rollouts_per_example": 8}}},
        "two-gpus-nccl": {"model": str(model_dir), "env": {"id": "reverse-text", "args": {"source": "offline"}},
                          "inference": {"gpus": 1}, "trainer": {"gpus": 1, "args": {
                              "output_dir": str(tmp_path / "run"), "use_lora": False, "max_off_policy_steps": 2}}},
    }.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(tomli_w.dumps(data))
        _check(f"test-{name}", _normalised(to_toml(load_config(path)), tmp=tmp_path, model=model_dir))
