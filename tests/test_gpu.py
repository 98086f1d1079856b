"""On real GPUs (skipped without two): each weight-sync transport moves the trainer's weights
(cuda:1, bf16) into a real vf-vllm on GPU 0 so that the server's log-probs match the trainer's; with
three GPUs, ``nccl`` reaches every worker of a server on two (tensor- or data-parallel).

Run on a GPU machine: ``VF_RL_GPU_MODEL=/path/to/SmolLM2-135M-Instruct pytest -m gpu tests/test_gpu.py -s``
(the model directory must hold bf16 or fp32 safetensors; ``VF_RL_GPU_TP_MODEL``: one whose attention heads split
over 2 GPUs, e.g. ``scripts/gpu/make_random_model.py --config llama-1b``, for the tensor-parallel case).
Writes the measured differences to ``$VF_RL_GPU_REPORT`` (JSON lines) when set.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs")]


@pytest.fixture(scope="module")
def model_dir() -> str:
    path = os.environ.get("VF_RL_GPU_MODEL")
    if not path:
        from vf_rl.launcher.prepare_model import default_model_dir

        path = str(default_model_dir())
    return path


def _serve(model_dir: str, workdir: Path, lora: bool, gpu: str = "0", *extra: str):
    """vf-vllm on GPU(s) ``gpu`` on a free port (with runtime LoRA loading when ``lora``; ``extra`` flags)."""
    from vf_rl.inference.client import InferenceClient
    from vf_rl.inference.communicator import free_port

    port = free_port()
    log = workdir / "server.log"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    argv = [sys.executable, "-m", "vf_rl.inference.server", "--model", model_dir, "--port", str(port),
            "--enforce-eager", "--max-model-len", "1024", "--gpu-memory-utilization", "0.3"]
    if lora:
        argv += ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "1"]
    argv += list(extra)
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    client = InferenceClient(port=port, timeout=300)
    try:
        client.wait_until_ready(400, poll=1.0)
    except TimeoutError:
        process.kill()
        pytest.fail(log.read_text()[-4000:])
    yield client, port
    os.killpg(process.pid, 15)
    process.wait(timeout=60)


@pytest.fixture(scope="module")
def plain_server(model_dir, tmp_path_factory):
    yield from _serve(model_dir, tmp_path_factory.mktemp("gpu-vllm"), lora=False)


@pytest.fixture(scope="module")
def second_server(model_dir, tmp_path_factory):
    """Another vf-vllm, on GPU 1 (next to the trainer of the scale-out test)."""
    yield from _serve(model_dir, tmp_path_factory.mktemp("gpu-vllm-2"), lora=False, gpu="1")


@pytest.fixture(scope="module")
def lora_server(model_dir, tmp_path_factory):
    yield from _serve(model_dir, tmp_path_factory.mktemp("gpu-vllm-lora"), lora=True)


def sampled(port: int, model: str, n: int = 8):
    """Rollouts of reverse-text (temperature 1, 32 tokens) from the server."""
    from openai import AsyncOpenAI

    from vf_rl.env_api import load_environment

    env = load_environment("reverse-text", few_shot=2, source="offline")
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
    rows = [env.get_dataset()[i] for i in range(n // 2)]
    return asyncio.run(env.generate(client, model, rows, 2, {"max_tokens": 32, "temperature": 1.0}))


def logprob_diff(model, rollouts, pad_token_id) -> tuple[float, float]:
    """(mean, max) |trainer - server| log-prob over the sampled tokens (``model`` on any GPU)."""
    from vf_rl.orchestrator.samples import rollout_to_samples
    from vf_rl.trainer.batching import micro_batches
    from vf_rl.trainer.speed.logprobs import selective_logprobs

    samples = [s for r in rollouts for s in rollout_to_samples(r.turns, 0.0, 1024)]
    diffs = []
    for mb in micro_batches(samples, 8, pad_token_id):
        mb = {k: v.to(model.device) for k, v in mb.items()}
        with torch.no_grad():
            logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
        lp, _ = selective_logprobs(logits[:, :-1], mb["input_ids"][:, 1:], 1.0)
        mask = mb["loss_mask"][:, 1:]
        diffs.append((lp - mb["sampling_logprobs"][:, 1:])[mask].abs().float())
    d = torch.cat(diffs)
    return d.mean().item(), d.max().item()


def lora_policy(model_dir: str, device: str):
    """SmolLM2 bf16 with a "trained" LoRA adapter, far enough from the base to tell them apart."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device),
                            LoraConfig(r=16, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return policy.eval()


def merged_reference(model_dir: str, policy):
    """The plain model holding ``W + BA`` rounded to bf16: exactly what a merged push sends."""
    from transformers import AutoModelForCausalLM

    from vf_rl.trainer.weights import merged_state_dict

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(policy.device)
    reference.load_state_dict(merged_state_dict(policy, device=None), strict=False)
    return reference


# ipc: the trainer on GPU 0 with the server (shared = true); the others: the trainer on GPU 1
@pytest.mark.parametrize("transport", ["filesystem", "nccl", "ipc", "lora"])
def test_transport_moves_server_logprobs_to_the_trainers(request, model_dir, tmp_path, transport):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl.trainer.weight_sync import LORA_NAME, make_weight_sync

    # full-weight reloads need a server without --enable-lora (vLLM 0.26 wraps the layers)
    client, port = request.getfixturevalue("lora_server" if transport == "lora" else "plain_server")
    device = "cuda:0" if transport == "ipc" else "cuda:1"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    policy = lora_policy(model_dir, device)
    sync = make_weight_sync(transport, client, tmp_path, torch.device(device), bucket_mb=64)
    served = LORA_NAME if transport == "lora" else model_dir
    times = []
    try:
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            sync.push(policy)
            times.append(time.perf_counter() - start)
        rollouts = sampled(port, served)
        # vLLM applies a hot-loaded adapter unmerged, as peft does; the others hold W + BA in bf16
        reference = policy if transport == "lora" else merged_reference(model_dir, policy)
        mean, worst = logprob_diff(reference, rollouts, tokenizer.pad_token_id)
        unmerged_mean, _ = logprob_diff(policy, rollouts, tokenizer.pad_token_id)
        base_mean, _ = logprob_diff(base, rollouts, tokenizer.pad_token_id)
    finally:
        if transport != "lora":  # put the base weights back for the next transport
            make_weight_sync("filesystem", client, tmp_path / "base", torch.device(device)).push(base)
        sync.close()
    report = {"transport": transport, "push_s": times, "logprob_diff_mean": mean, "logprob_diff_max": worst,
              "unmerged_lora_diff_mean": unmerged_mean, "base_model_diff_mean": base_mean,
              "device": torch.cuda.get_device_name(device)}
    print(json.dumps(report))
    if os.environ.get("VF_RL_GPU_REPORT"):
        with open(os.environ["VF_RL_GPU_REPORT"], "a") as f:
            f.write(json.dumps(report) + "\n")
    # bf16 on both sides, different attention/matmul kernels: 0.045-0.058 on H200s (RESULTS.md)
    assert mean < 0.1 and worst < 2.0
    assert base_mean > 3 * mean  # the server serves the policy, not the base model


@pytest.mark.parametrize("transport", ["nccl", "ipc"])
def test_overlapped_push_sends_the_snapshot_while_the_trainer_goes_on(plain_server, model_dir, tmp_path, transport):
    """``push_async`` on GPUs: the adapter changes on the trainer's stream right after the push
    starts (as the next step's optimizer would), the server still gets the weights of the
    moment the push started; with ``ipc`` the server reads the trainer's own GPU memory."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl.trainer.weight_sync import make_weight_sync

    client, port = plain_server
    device = "cuda:0" if transport == "ipc" else "cuda:1"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = lora_policy(model_dir, device)
    reference = merged_reference(model_dir, copy.deepcopy(policy))
    sync = make_weight_sync(transport, client, tmp_path, torch.device(device), bucket_mb=64)
    try:
        sync.push(policy)  # buffers, handles and the NCCL communicator made outside the timing
        pushing = sync.push_async(policy)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.mul_(-1.0)  # a large change, queued right behind the snapshot
        assert pushing.result(timeout=120) == [0]
        rollouts = sampled(port, model_dir)
        mean, _ = logprob_diff(reference, rollouts, tokenizer.pad_token_id)
        changed_mean, _ = logprob_diff(merged_reference(model_dir, policy), rollouts, tokenizer.pad_token_id)
    finally:
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
        make_weight_sync("filesystem", client, tmp_path / "base", torch.device(device)).push(base)
        sync.close()
    report = {"transport": f"{transport}-overlapped", "push_s": [sync.last_push_s], "logprob_diff_mean": mean,
              "changed_weights_diff_mean": changed_mean, "device": torch.cuda.get_device_name(device)}
    print(json.dumps(report))
    if os.environ.get("VF_RL_GPU_REPORT"):
        with open(os.environ["VF_RL_GPU_REPORT"], "a") as f:
            f.write(json.dumps(report) + "\n")
    assert mean < 0.1 and changed_mean > 3 * mean


def test_two_servers_feed_one_trainer(plain_server, second_server, model_dir, tmp_path):
    """Two GPUs: vf-vllm on GPU 0 and on GPU 1 feed one ``vf-train`` (GPU 1, LoRA,
    filesystem sync) for 3 steps; every step draws rollouts from both, and afterwards both servers
    serve the weights of the last sync: those of optimizer step 2 (the sync before batch 3; step 3's
    update is never pushed), compared through log-probs of their own samples against checkpoint-2."""
    import tomli_w
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl.trainer.weights import merged_state_dict

    (_, port_a), (_, port_b) = plain_server, second_server
    urls = [f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"]
    out = tmp_path / "run"
    config = tmp_path / "two-servers.toml"
    config.write_text(tomli_w.dumps({
        "model": model_dir, "env": {"id": "reverse-text", "args": {"few_shot": 2, "source": "offline"}},
        "inference": {"gpus": 1}, "trainer": {"gpus": 1, "args": {
            "output_dir": str(out), "vllm_server_port": port_a, "vllm_server_urls": urls, "weight_sync": "filesystem",
            "max_steps": 3, "batch_size": 64, "rollouts_per_example": 8, "micro_batch_size": 16, "max_tokens": 32,
            "max_seq_len": 512, "learning_rate": 2e-3, "save_steps": 1}}}))
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], capture_output=True, text=True,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"}, timeout=600)
    wall = time.perf_counter() - start
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["servers/0/rollouts"] > 0 and r["servers/1/rollouts"] > 0 and r["errors/rate"] == 0 for r in steps)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda:1")

    def merged(checkpoint: str):  # W + BA in bf16: what a filesystem sync of that checkpoint's model sends
        policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16),
                                           str(out / checkpoint)).to("cuda:1")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda:1")
        model.load_state_dict(merged_state_dict(policy, device=None), strict=False)
        return model

    trained, last = merged("checkpoint-2"), merged("checkpoint-3")
    report = {"test": "two_servers", "wall_s": wall, "device": torch.cuda.get_device_name(1),
              "importance_ratio": [r.get("importance_ratio") for r in steps],
              "mismatch_kl": [r.get("mismatch_kl") for r in steps],
              "rollouts_per_server": [[r["servers/0/rollouts"], r["servers/1/rollouts"]] for r in steps]}
    for name, port in (("gpu0", port_a), ("gpu1", port_b)):
        rollouts = sampled(port, model_dir, n=16)
        report[f"{name}_diff_mean"], report[f"{name}_diff_max"] = logprob_diff(trained, rollouts,
                                                                               tokenizer.pad_token_id)
        report[f"{name}_base_diff_mean"], _ = logprob_diff(base, rollouts, tokenizer.pad_token_id)
        report[f"{name}_step3_diff_mean"], _ = logprob_diff(last, rollouts, tokenizer.pad_token_id)
    print(json.dumps(report))
    if os.environ.get("VF_RL_GPU_REPORT"):
        with open(os.environ["VF_RL_GPU_REPORT"], "a") as f:
            f.write(json.dumps(report) + "\n")
    for name in ("gpu0", "gpu1"):  # both serve step 2's weights: closer to them than to the base or step 3
        assert report[f"{name}_diff_mean"] < 0.1 and report[f"{name}_diff_max"] < 3.0
        assert report[f"{name}_base_diff_mean"] > 2 * report[f"{name}_diff_mean"]
        assert report[f"{name}_step3_diff_mean"] > report[f"{name}_diff_mean"]


@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="needs 3 NVIDIA GPUs")
@pytest.mark.parametrize("layout", ["tp2", "dp2"])
def test_nccl_reaches_every_worker_of_a_server_on_two_gpus(model_dir, tmp_path, layout):
    """vf-vllm on GPUs 0-1 as one engine in two tensor-parallel shards (``tp2``) or two data-parallel
    engines (``dp2``, what vf-rl starts for ``inference.gpus = 2``); the trainer on GPU 2 pushes a
    LoRA policy through ``nccl`` (one group: the trainer and both workers). Rollouts spread over the
    workers then score as the policy's, not the base model's: a worker left out would serve the base."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vf_rl.trainer.weight_sync import make_weight_sync

    model = model_dir
    if layout == "tp2":
        model = os.environ.get("VF_RL_GPU_TP_MODEL") or pytest.skip("VF_RL_GPU_TP_MODEL: a model for 2 shards")
    flag = "--tensor-parallel-size" if layout == "tp2" else "--data-parallel-size"
    serving = _serve(model, tmp_path, False, "0,1", flag, "2")
    client, port = next(serving)
    device = "cuda:2"
    tokenizer = AutoTokenizer.from_pretrained(model)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).to(device)
    policy = lora_policy(model, device)
    sync = make_weight_sync("nccl", client, tmp_path, torch.device(device), bucket_mb=64)
    times = []
    try:
        workers = client.weight_sync_info()["workers"]
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            sync.push(policy)
            times.append(time.perf_counter() - start)
        rollouts = sampled(port, model, n=32)
        mean, worst = logprob_diff(merged_reference(model, policy), rollouts, tokenizer.pad_token_id)
        base_mean, _ = logprob_diff(base, rollouts, tokenizer.pad_token_id)
    finally:
        sync.close()
        next(serving, None)
    report = {"transport": f"nccl-{layout}", "workers": workers, "push_s": times, "logprob_diff_mean": mean,
              "logprob_diff_max": worst, "base_model_diff_mean": base_mean, "model": model,
              "device": torch.cuda.get_device_name(device)}
    print(json.dumps(report))
    if os.environ.get("VF_RL_GPU_REPORT"):
        with open(os.environ["VF_RL_GPU_REPORT"], "a") as f:
            f.write(json.dumps(report) + "\n")
    assert workers == 2
    assert mean < 0.1 and base_mean > 3 * mean
