"""weight_sync = "lora": only the adapter moves, hot-loaded into a real vf-vllm (CPU) with
--enable-lora, and rollouts through the orchestrator use it."""

from __future__ import annotations

import pytest
import torch
from conftest import start_server
from test_server import TOLERANCE, max_logprob_diff, trained_lora_policy
from transformers import AutoModelForCausalLM, AutoTokenizer

from vf_rl.env_api import load_environment
from vf_rl.inference.client import InferenceClient
from vf_rl.trainer.weight_sync import LORA_NAME, LoraSync

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def lora_server(model_dir, tmp_path_factory):
    yield from start_server(model_dir, tmp_path_factory.mktemp("vf-vllm-lora"), "--enable-lora",
                            "--max-lora-rank", "8", "--max-loras", "1")


def test_lora_adapter_is_hot_loaded_in_place_and_served(lora_server, model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = load_environment("reverse-text", few_shot=2, source="offline")
    client = InferenceClient(port=lora_server.port)
    sync = LoraSync(client, tmp_path / "weights")
    policy = trained_lora_policy(model_dir)
    sync.push(policy)
    assert (tmp_path / "weights" / "lora" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "weights" / ".lora-tmp").exists()
    assert max_logprob_diff(policy, lora_server, env, tokenizer, LORA_NAME) < TOLERANCE
    # the base model stays served unchanged under its own name
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert max_logprob_diff(base, lora_server, env, tokenizer) < TOLERANCE
    assert max_logprob_diff(base, lora_server, env, tokenizer, LORA_NAME) > 20 * TOLERANCE
    # a second push under the same name replaces the adapter in place
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.0)
    sync.push(policy)
    assert max_logprob_diff(policy, lora_server, env, tokenizer, LORA_NAME) < TOLERANCE


def test_lora_transport_without_enable_lora_says_how_to_fix(server, model_dir, tmp_path):
    sync = LoraSync(InferenceClient(port=server.port), tmp_path / "weights")
    with pytest.raises(RuntimeError, match="--enable-lora"):
        sync.push(trained_lora_policy(model_dir))
