"""vf-vllm with vLLM's ``api_server_count = 2`` (``[inference.args]``): several API-server processes in front
of one engine. Requests on fresh connections spread over both processes; a weight update posted to whichever
process the connection reaches changes what every process samples, since the weights live in the one engine."""

from __future__ import annotations

import httpx
import pytest
import torch
from conftest import start_server
from test_server import TOLERANCE, env, max_logprob_diff, tokenizer, trained_lora_policy  # noqa: F401, F811 (fixtures)
from transformers import AutoModelForCausalLM

from vf_rl.inference.client import InferenceClient
from vf_rl.trainer.weight_sync import FilesystemSync
from vf_rl.trainer.weights import export_weights

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def two_api_servers(model_dir, tmp_path_factory):
    """A real vf-vllm started with ``--api-server-count 2``."""
    yield from start_server(model_dir, tmp_path_factory.mktemp("vf-vllm-api2"), "--api-server-count", "2")


def test_two_api_servers_serve_weight_routes_and_take_weight_updates(two_api_servers, env, tokenizer, tmp_path):  # noqa: F811
    server = two_api_servers
    log = server.log.read_text()
    assert "Started 2 API server processes" in log, log[-2000:]
    for _ in range(6):  # a new connection each time: both processes answer vf-rl's routes
        info = httpx.get(f"http://127.0.0.1:{server.port}/weight_sync_info", timeout=30).json()
        assert info == {"workers": 1, "devices": ["cpu"]}
    policy = trained_lora_policy(server.model)
    original = AutoModelForCausalLM.from_pretrained(server.model, dtype=torch.float32)
    client = InferenceClient(port=server.port)
    sync = FilesystemSync(client, tmp_path / "w")
    try:
        sync.push(policy)
        assert max_logprob_diff(policy, server, env, tokenizer) < TOLERANCE
        assert max_logprob_diff(original, server, env, tokenizer) > 20 * TOLERANCE
        sync.push(original)
        assert max_logprob_diff(original, server, env, tokenizer) < TOLERANCE
    finally:
        export_weights(original, tmp_path / "orig")
        client.update_weights(str(tmp_path / "orig"))
        sync.close()
