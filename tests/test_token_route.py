"""vf-vllm's own ``POST /inference/v1/generate`` (vf_rl.inference.token_route), on a real vf-vllm started
with ``--no-enable-scale-out``: vLLM 0.32 then has no token route of its own (it answers 403 there), as
vLLM 0.26-0.31 have none, and the routes middleware answers it with the engine client.

- through ``renderers.client.generate`` (verifiers v1's sampling client, with the model's renderer): greedy
  token ids and sampling log-probs equal ``/v1/completions``' for the same prompt token ids;
- ``max_tokens`` ends a reply with finish_reason "length";
- bad bodies get a 400 with a one-line message naming the problem;
- a verifiers v1 environment's rollouts and (slow tier) two training steps, the existing tests, run against this
  server;
- the server runs two API-server processes (vLLM's ``api_server_count``): both answer vf-rl's routes, and a weight
  update through either reaches the one engine.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from conftest import start_server
from test_server import TOLERANCE, env, max_logprob_diff, tokenizer, trained_lora_policy  # noqa: F401, F811 (fixtures)
from test_verifiers_envs import vf_envs_on_path  # noqa: F401  (the fixture, for the v1 rollouts)
from transformers import AutoModelForCausalLM

from vf_rl.inference.client import InferenceClient
from vf_rl.trainer.weight_sync import FilesystemSync
from vf_rl.trainer.weights import export_weights

pytestmark = pytest.mark.server
MESSAGES = [{"role": "user", "content": "Reverse the text: blue sky"}]


@pytest.fixture(scope="module")
def shim_server(model_dir, tmp_path_factory):
    """A real vf-vllm whose vLLM serves no /inference/v1/generate of its own, with two API-server processes
    (vLLM's ``api_server_count``; one server for both, to keep the suite's memory down)."""
    yield from start_server(model_dir, tmp_path_factory.mktemp("vf-vllm-shim"), "--no-enable-scale-out",
                            "--api-server-count", "2")


def model_renderer(server):
    """SmolLM2's renderer, built as verifiers' train client builds it."""
    from renderers import create_renderer
    from renderers.base import load_tokenizer

    return create_renderer(load_tokenizer(server.model), None)


def renderers_generate(server, sampling_params: dict, prompt_ids: list[int] | None = None) -> dict:
    """``renderers.client.generate`` against ``server`` with the model's renderer, for ``MESSAGES`` or
    ``prompt_ids``."""
    from openai import AsyncOpenAI
    from renderers.client import generate

    renderer = model_renderer(server)

    async def ask():
        client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
        try:
            return await generate(client=client, renderer=renderer, messages=MESSAGES, model=server.model,
                                  prompt_ids=prompt_ids, sampling_params=sampling_params)
        finally:
            await client.close()

    return asyncio.run(ask())


def post_generate(server, body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/inference/v1/generate", json=body, timeout=120)


def test_vllm_has_no_route_of_its_own(shim_server):
    assert "Scale-out endpoints are disabled" in shim_server.log.read_text()


def test_greedy_tokens_and_logprobs_match_completions(shim_server):
    result = renderers_generate(shim_server, {"max_tokens": 12, "temperature": 0.0})
    prompt_ids, ids, logprobs = result["prompt_ids"], result["completion_ids"], result["completion_logprobs"]
    assert ids and len(logprobs) == len(ids) and result["request_id"]
    assert result["finish_reason"] in ("stop", "length") and result["usage"]["completion_tokens"] == len(ids)
    assert result["usage"]["prompt_tokens"] == len(prompt_ids)

    stop_ids = model_renderer(shim_server).get_stop_token_ids()  # what renderers sends
    completion = httpx.post(f"{shim_server.base_url}/v1/completions", timeout=120, json={
        "model": shim_server.model, "prompt": prompt_ids, "max_tokens": 12, "temperature": 0.0, "logprobs": 0,
        "return_token_ids": True, "stop_token_ids": stop_ids}).json()["choices"][0]
    assert completion["token_ids"] == ids
    assert completion["logprobs"]["token_logprobs"] == pytest.approx(logprobs, abs=1e-3)

    # the raw answer: vLLM 0.32's text-mode shape
    body = {"model": shim_server.model, "token_ids": prompt_ids,
            "sampling_params": {"max_tokens": 12, "temperature": 0.0, "logprobs": 1, "stop_token_ids": stop_ids}}
    data = post_generate(shim_server, body).json()
    (choice,) = data["choices"]
    assert data["prompt_token_ids"] == prompt_ids and choice["token_ids"] == ids and choice["index"] == 0
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in ids]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(logprobs, abs=1e-3)
    assert isinstance(choice["text"], str) and data["usage"]["total_tokens"] == len(prompt_ids) + len(ids)


def test_max_tokens_ends_with_length(shim_server):
    result = renderers_generate(shim_server, {"max_tokens": 3, "temperature": 1.0, "seed": 1, "ignore_eos": True})
    assert len(result["completion_ids"]) == 3 and result["finish_reason"] == "length"
    data = post_generate(shim_server, {"token_ids": result["prompt_ids"], "sampling_params": {
        "max_tokens": 2, "ignore_eos": True, "logprobs": 1}}).json()
    assert len(data["choices"][0]["token_ids"]) == 2 and data["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("body,words", [
    ({"token_ids": [1, 2], "sampling_params": {"max_tokens": 2, "bogus_knob": 1}}, ["unknown", "bogus_knob"]),
    ({"sampling_params": {"max_tokens": 2}}, ["token_ids"]),
    ({"token_ids": [1, "2"]}, ["token_ids"]),
    ({"token_ids": [1, 2], "content_parts": [{"type": "image_url", "url": "http://x/y.png"}]},
     ["content_parts", "--enable-scale-out"]),
    ({"token_ids": [1, 2], "features": {"mm_hashes": {}}}, ["features", "--enable-scale-out"]),
    ([1, 2], ["JSON object"]),
    ({"token_ids": [1, 2], "sampling_params": {"temperature": -1.0}}, ["temperature"]),
], ids=["unknown-sampling-key", "no-token-ids", "non-int-token-id", "content-parts", "features", "not-an-object",
        "bad-temperature"])
def test_bad_bodies_get_400_in_one_line(shim_server, body, words):
    response = post_generate(shim_server, body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "\n" not in message and all(w in message for w in words), message


@pytest.mark.usefixtures("vf_envs_on_path")
def test_v1_rollouts_against_the_shim(shim_server):
    """test_verifiers_envs.py's v1 rollouts (verifiers' train client through renderers), on this server."""
    from test_verifiers_envs import test_v1_rollouts_against_real_server

    test_v1_rollouts_against_real_server(shim_server, None)


@pytest.mark.slow  # the rollouts above exercise the same path; this adds the trainer's importance ratio
@pytest.mark.usefixtures("vf_envs_on_path")
def test_v1_env_trains_two_steps_on_the_shim(shim_server, model_dir, tmp_path):
    """test_verifiers_envs.py's two v1 training steps (importance ratio near 1: the shim's sampling log-probs
    are the trainer's), on this server; its weights change, so it runs last."""
    from test_verifiers_envs import test_v1_env_trains_two_steps

    test_v1_env_trains_two_steps(shim_server, model_dir, tmp_path, None, None)


def test_two_api_servers_serve_weight_routes_and_take_weight_updates(shim_server, env, tokenizer, tmp_path):  # noqa: F811
    """With ``api_server_count = 2``, fresh connections spread over both processes, which both answer vf-rl's
    routes; a weight update posted to either changes what both sample (the weights live in the one engine)."""
    server = shim_server
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
