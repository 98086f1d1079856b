"""Scaling out, on the CPU with real processes on loopback only:

- two real vf-vllm servers feeding one trainer (``vllm_server_urls``): rollouts land on both,
  every sync reaches both (their log-probs agree after training), one killed mid-run and the
  run finishes on the other;
- the weight-update secret: a wrong one gets 401 and ``vf-train`` stops with one line;
  ``vf-vllm`` refuses to listen beyond loopback without one;
- two trainer "nodes" (two ``torchrun --nnodes 2`` invocations, gloo on 127.0.0.1) training
  2 steps against a real server; ``vf-rl --print-commands`` prints each node's command.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import free_port, start_server, write_cpu_config

pytestmark = pytest.mark.server
SECRET = "scale-out-test-secret"


@pytest.fixture(scope="module")
def second_server(model_dir, tmp_path_factory):
    """Another real vf-vllm, with a weight-update secret (the session's server has none)."""
    yield from start_server(model_dir, tmp_path_factory.mktemp("vf-vllm-2"), env={"VF_RL_WEIGHT_SECRET": SECRET})


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def greedy_logprobs(server) -> tuple[list[int], list[float]]:
    from openai import AsyncOpenAI

    async def ask():
        client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
        response = await client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "Reverse the text: blue sky"}], max_tokens=8,
            temperature=0.0, logprobs=True, extra_body={"return_token_ids": True})
        await client.close()
        choice = response.choices[0]
        return list(choice.token_ids), [t.logprob for t in choice.logprobs.content]

    return asyncio.run(ask())


def vf_train(config, env_extra=None, **popen):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, **popen)


@pytest.mark.slow
def test_two_servers_share_rollouts_and_both_get_every_sync(server, second_server, model_dir, tmp_path,
                                                            restore_base_weights):
    before = greedy_logprobs(server)
    urls = [server.base_url, second_server.base_url]
    config = write_cpu_config(tmp_path / "two.toml", model_dir, tmp_path / "run", server.port, vllm_server_urls=urls,
                              batch_size=16, rollouts_per_example=4, micro_batch_size=8, max_steps=3, max_tokens=8,
                              learning_rate=2e-3)
    run = vf_train(config, {"VF_RL_WEIGHT_SECRET": SECRET})
    out, _ = run.communicate(timeout=900)
    assert run.returncode == 0, out[-4000:]
    steps = [r for r in jsonl(tmp_path / "run" / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # 4 groups per batch, 2 on each server (least in flight first)
        assert r["servers/0/rollouts"] == r["servers/1/rollouts"] == 8 and r["errors/rate"] == 0.0
    ids_a, lp_a = greedy_logprobs(server)
    ids_b, lp_b = greedy_logprobs(second_server)
    assert ids_a == ids_b and max(abs(x - y) for x, y in zip(lp_a, lp_b)) < 1e-4  # the same weights on both
    changed = before[0] != ids_a or max(abs(x - y) for x, y in zip(before[1], lp_a)) > 1e-3
    assert changed, "the servers still serve the base weights"


@pytest.mark.slow
def test_a_server_killed_mid_run_leaves_the_others_training(server, model_dir, tmp_path, restore_base_weights):
    workdir = tmp_path / "doomed"
    workdir.mkdir()
    doomed = start_server(model_dir, workdir)
    victim = next(doomed)
    config = write_cpu_config(tmp_path / "kill.toml", model_dir, tmp_path / "run", server.port,
                              vllm_server_urls=[server.base_url, victim.base_url], batch_size=16,
                              rollouts_per_example=4, micro_batch_size=8, max_steps=4, max_tokens=8)
    run = vf_train(config)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and run.poll() is None:
        try:
            if any(r.get("step") == 1 and "reward" in r for r in jsonl(tmp_path / "run" / "metrics.jsonl")):
                break
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.2)
    os.killpg(victim.process.pid, signal.SIGKILL)
    out, _ = run.communicate(timeout=900)
    assert run.returncode == 0, out[-4000:]
    steps = [r for r in jsonl(tmp_path / "run" / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert steps[-1]["servers/active"] == 1 and steps[-1]["servers/1/rollouts"] == 0
    assert steps[-1]["servers/0/rollouts"] == 16 and steps[-1]["errors/rate"] == 0.0


@pytest.mark.slow  # a server of its own (minutes); default tier: test_vf_vllm_refuses_to_listen_beyond_loopback_without_a_secret
def test_wrong_secret_is_refused_with_one_line(second_server, model_dir, tmp_path):
    config = write_cpu_config(tmp_path / "secret.toml", model_dir, tmp_path / "run", second_server.port,
                              batch_size=8, rollouts_per_example=4, micro_batch_size=8, max_steps=1, max_tokens=8)
    run = vf_train(config, {"VF_RL_WEIGHT_SECRET": "wrong"})
    out, _ = run.communicate(timeout=600)
    assert run.returncode == 2, out[-3000:]
    assert "vf-train: error: vf-vllm at" in out and "missing or wrong weight-update secret" in out
    assert "Traceback" not in out


def test_vf_vllm_refuses_to_listen_beyond_loopback_without_a_secret(model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VF_RL_WEIGHT_SECRET")}
    result = subprocess.run([sys.executable, "-m", "vf_rl.inference.server", "--model", str(model_dir), "--host",
                             "0.0.0.0", "--port", str(free_port())], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 2 and "set VF_RL_WEIGHT_SECRET" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_two_trainer_nodes_train_against_one_server(server, model_dir, tmp_path, restore_base_weights):
    """Two ``torchrun --nnodes 2`` invocations (one process each, gloo over 127.0.0.1), as two
    machines would run them: global rank 0 alone generates, syncs and logs; both train."""
    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "nodes.toml", model_dir, out, server.port, micro_batch_size=2,
                              rollouts_per_example=2, batch_size=8, max_steps=2, max_tokens=8, use_cpu=True)
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(k),
                               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                               "-m", "vf_rl.trainer.cli", "@", str(config)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
    outputs = [p.communicate(timeout=900)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [o[-3000:] for o in outputs]
    steps = [r for r in jsonl(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]  # logged once, by global rank 0
    assert "Trainer: 2 process(es)" in outputs[0] and "Weight sync: filesystem" in outputs[0]
    assert "Weight sync" not in outputs[1]  # rank 1 never talks to the server
    assert all(r["tokens/loss"] > 0 and r["grad_norm"] > 0 for r in steps)


@pytest.mark.parametrize("gpus", [0, 4])
def test_print_commands_gives_every_node_its_command(model_dir, tmp_path, gpus):
    import tomli_w

    path = tmp_path / "multi.toml"
    path.write_text(tomli_w.dumps({
        "model": str(model_dir), "env": {"id": "reverse-text"}, "inference": {"gpus": 1 if gpus else 0},
        "trainer": {"gpus": gpus, "nodes": 3, "main_address": "10.1.2.3:29500",
                    "args": {"batch_size": 48, "rollouts_per_example": 4, "micro_batch_size": 4}}}))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(8))}
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(path), "--print-commands"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "# inference server" and "vf-vllm" in lines[1]
    for rank in range(3):
        line = lines[lines.index(f"# trainer node {rank} of 3") + 1]
        assert f"--num_machines 3 --machine_rank {rank} --main_process_ip 10.1.2.3 --main_process_port 29500" in line
        assert f"--num_processes {max(gpus, 1) * 3}" in line
        if gpus:  # node 0 shares its machine with the server (GPU 0); the other nodes use GPUs 0-3
            assert f"CUDA_VISIBLE_DEVICES={'1,2,3,4' if rank == 0 else '0,1,2,3'}" in line
    bad = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(path), "--node-rank", "3"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "--node-rank 3: trainer.nodes = 3" in bad.stderr
