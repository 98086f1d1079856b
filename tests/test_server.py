"""Against a real vf-vllm on the CPU: token ids, log-probs and weight updates."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time

import httpx
import pytest
import torch
from openai import AsyncOpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from vf_rl.config.schema import read_toml
from vf_rl.config.sections import OrchestratorConfig
from vf_rl.env_api import load_environment
from vf_rl.env_api.errors import AllRolloutsFailed
from vf_rl.inference.client import InferenceClient
from vf_rl.orchestrator.orchestrator import Orchestrator
from vf_rl.orchestrator.samples import rollout_to_samples
from vf_rl.trainer.batching import micro_batches
from vf_rl.trainer.speed.logprobs import selective_logprobs
from vf_rl.trainer.weight_sync import BroadcastSync, FilesystemSync
from vf_rl.trainer.weights import export_weights

pytestmark = pytest.mark.server
TOLERANCE = 1e-3  # observed: max |diff| about 3e-5 nats (fp32 on both sides)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def env():
    return load_environment("reverse-text", few_shot=2, source="offline")


def trainer_logprobs(model, samples, temperature, pad_token_id):
    """The trainer's log-probs for ``samples`` (padded micro batch, as in training), flattened
    over loss tokens, next to the server's."""
    mine, theirs = [], []
    for mb in micro_batches(samples, 4, pad_token_id):
        with torch.no_grad():
            logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
        lp, _ = selective_logprobs(logits[:, :-1], mb["input_ids"][:, 1:], temperature)
        mask = mb["loss_mask"][:, 1:]
        mine.append(lp[mask])
        theirs.append(mb["sampling_logprobs"][:, 1:][mask])
    return torch.cat(mine), torch.cat(theirs)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_orchestrator_batch_tokens_and_logprobs_match_trainer(server, env, tokenizer, temperature):
    rows = [env.get_dataset()[i] for i in range(4)]
    orch = Orchestrator(env, rows, base_url=f"{server.base_url}/v1", model_name=server.model,
                        config=OrchestratorConfig(batch_size=8, rollouts_per_example=4,
                                                  sampling_args={"max_tokens": 16, "temperature": temperature},
                                                  max_seq_len=256))
    try:
        batch = orch.wait(0)
    finally:
        orch.close()
    assert len(batch.rollouts) == 8 and not any(r.error for r in batch.rollouts)
    assert [r.prompt for r in batch.rollouts[:4]] == [rows[0]["prompt"]] * 4  # a group shares its prompt
    for rollout in batch.rollouts:
        turn = rollout.turns[0]
        # the server keeps special tokens in the text (skip_special_tokens=False), e.g. a sampled
        # <|endoftext|>, but not the final stop token: compare everything else exactly
        ids = list(turn.completion_ids)
        # cut inside a multi-byte character: vLLM's incremental detokenizer holds back the whole text of
        # the tokens since the last complete character (a token such as "\u05d9" + a lead byte included)
        while rollout.is_truncated and ids and tokenizer.decode(ids, skip_special_tokens=False).endswith("\ufffd"):
            ids.pop()
        text = tokenizer.decode(ids, skip_special_tokens=False)
        content = rollout.completion[0]["content"]
        for special in [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]:
            text, content = text.replace(special, ""), content.replace(special, "")
        assert text == content, (text, content)
        templated = tokenizer.apply_chat_template(rollout.prompt, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False)
        assert turn.prompt_ids == templated
    group_means = [sum(r.reward for r in batch.rollouts[i:i + 4]) / 4 for i in (0, 4)]
    assert batch.metrics["reward"] == pytest.approx(sum(group_means) / 2)
    model = AutoModelForCausalLM.from_pretrained(server.model, dtype=torch.float32)
    mine, theirs = trainer_logprobs(model, batch.samples, temperature, tokenizer.pad_token_id)
    assert len(mine) == sum(len(r.turns[0].completion_ids) for r in batch.rollouts)
    assert (mine - theirs).abs().max().item() < TOLERANCE


def sample_once(server, env, temperature=1.0, model=None):
    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
    rows = [env.get_dataset()[0]]
    rollouts = asyncio.run(env.generate(client, model or server.model, rows, 2,
                                        {"max_tokens": 12, "temperature": temperature}))
    return [r for r in rollouts]


def trained_lora_policy(model_dir, r=8):
    """SmolLM2 with a LoRA adapter whose B matrices are non-zero (as after training)."""
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy = get_peft_model(base, LoraConfig(r=r, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return policy


def max_logprob_diff(model, server, env, tokenizer, served_name=None) -> float:
    """Sample from the server, then max |trainer - server| log-prob over the sampled tokens."""
    rollouts = sample_once(server, env, model=served_name)
    samples = [s for r in rollouts for s in rollout_to_samples(r.turns, 0.0, 512)]
    mine, theirs = trainer_logprobs(model, samples, 1.0, tokenizer.pad_token_id)
    return (mine - theirs).abs().max().item()


@pytest.mark.parametrize("transport", ["filesystem", "upload", "broadcast"])
def test_weight_update_moves_server_logprobs_to_the_trainers(server, env, tokenizer, tmp_path, transport):
    """The merged-weight transports: a safetensors file read from our disk or sent in the
    request (``/upload_weights``, for a server on another host), and the NCCL transport's
    protocol (group, buckets, HTTP announcement, reload) over gloo, the CPU backend of the same code."""
    policy = trained_lora_policy(server.model)
    original = AutoModelForCausalLM.from_pretrained(server.model, dtype=torch.float32)
    client = InferenceClient(port=server.port)
    if transport in ("filesystem", "upload"):
        sync = FilesystemSync(client, tmp_path / "w", upload=transport == "upload")
    else:  # 64 MiB buckets: the fp32 135M model goes in several broadcasts
        sync = BroadcastSync(client, torch.device("cpu"), backend="gloo", bucket_bytes=64 << 20, timeout_s=120)
    try:
        sync.push(policy)
        if transport == "broadcast":
            assert sync.buckets_sent > 5
        assert max_logprob_diff(policy, server, env, tokenizer) < TOLERANCE
        # the server really changed: the base model's log-probs are far off now
        assert max_logprob_diff(original, server, env, tokenizer) > 20 * TOLERANCE
        sync.push(original)  # a second update through the same group
        assert max_logprob_diff(original, server, env, tokenizer) < TOLERANCE
        if transport == "broadcast":  # a new trainer (a restart, a resume) forms a new group with the same server
            sync.close()
            sync = BroadcastSync(client, torch.device("cpu"), backend="gloo", timeout_s=120)
            sync.push(policy)
            assert sync.buckets_sent == 1  # default 1 GiB buckets: the 540 MB fp32 model in one
            assert max_logprob_diff(policy, server, env, tokenizer) < TOLERANCE
    finally:  # restore the base weights for the other tests
        export_weights(original, tmp_path / "orig")
        client.update_weights(str(tmp_path / "orig"))
        sync.close()
    assert max_logprob_diff(original, server, env, tokenizer) < TOLERANCE


def test_a_tied_lm_head_follows_the_pushed_embedding(server, env, tokenizer, tmp_path, restore_base_weights):
    """SmolLM2's LM head is its input embedding (``tie_word_embeddings``); the export leaves
    ``lm_head.weight`` out, and the CPU server keeps a prepacked copy of the head for the logits.
    After a push whose embedding differs from the base, the server's log-probs are the pushed
    model's: the head was repacked from the new embedding, not left at the base's."""
    policy = AutoModelForCausalLM.from_pretrained(server.model, dtype=torch.float32)
    assert policy.lm_head.weight is policy.model.embed_tokens.weight
    with torch.no_grad():
        policy.model.embed_tokens.weight.mul_(1.5)  # the head scales with it: logits x 1.5
    FilesystemSync(InferenceClient(port=server.port), tmp_path / "w").push(policy)
    assert max_logprob_diff(policy, server, env, tokenizer) < TOLERANCE


def test_overlapped_push_sends_the_weights_of_the_moment_it_was_started(server, env, tokenizer, tmp_path):
    """``push_async`` (the nccl transport over gloo): the weights are snapshotted when the push
    starts, so a training step that changes them while it is on its way does not leak into
    what the server gets, and a batch submitted ``after`` the push is sampled with the pushed
    weights (its sampling log-probs are the snapshot's)."""
    from vf_rl.orchestrator.orchestrator import Orchestrator

    policy = trained_lora_policy(server.model)
    snapshot = copy.deepcopy(policy)  # the weights as they are when the push starts
    original = AutoModelForCausalLM.from_pretrained(server.model, dtype=torch.float32)
    client = InferenceClient(port=server.port)
    sync = BroadcastSync(client, torch.device("cpu"), backend="gloo", timeout_s=120)
    orchestrator = Orchestrator(env, [env.get_dataset()[i] for i in range(2)], base_url=f"{server.base_url}/v1",
                                model_name=server.model,
                                config=OrchestratorConfig(batch_size=4, rollouts_per_example=2,
                                                          sampling_args={"max_tokens": 8, "temperature": 1.0}, max_seq_len=512))
    try:
        assert sync.overlaps
        pushing = sync.push_async(policy)
        with torch.no_grad():  # "the next step" changes the adapted weights in place at once
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.add_(torch.randn_like(p) * 0.05)
        orchestrator.submit(0, policy_step=0, after=pushing)
        batch = orchestrator.wait(0)
        assert pushing.done() and pushing.result() == [0] and sync.last_push_s > 0
        mine, theirs = trainer_logprobs(snapshot, batch.samples, 1.0, tokenizer.pad_token_id)
        assert (mine - theirs).abs().max().item() < TOLERANCE  # generated with the pushed snapshot
        assert max_logprob_diff(snapshot, server, env, tokenizer) < TOLERANCE
        assert max_logprob_diff(policy, server, env, tokenizer) > 20 * TOLERANCE  # not the changed weights
    finally:  # restore the base weights for the other tests
        orchestrator.close()
        export_weights(original, tmp_path / "orig")
        client.update_weights(str(tmp_path / "orig"))
        sync.close()


TRAINER_DIES_MID_BROADCAST = """
import os, signal, sys
import torch
from transformers import AutoModelForCausalLM
from vf_rl.inference.client import InferenceClient
from vf_rl.inference.communicator import BroadcastGroup
from vf_rl.trainer.weight_sync import BroadcastSync

real = BroadcastGroup.broadcast
sent = []

def broadcast(self, tensor, *args, **kwargs):  # the trainer process dies once two buckets have gone out
    real(self, tensor, *args, **kwargs)
    sent.append(1)
    if len(sent) == 2:
        print("two buckets sent", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

BroadcastGroup.broadcast = broadcast
model = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32)
BroadcastSync(InferenceClient(port=int(sys.argv[1])), torch.device("cpu"), backend="gloo", timeout_s=120,
              bucket_bytes=16 << 20).push(model)
"""


def test_a_trainer_that_dies_mid_broadcast_leaves_the_server_serving_and_a_new_group_works(
        server, env, tokenizer, tmp_path, restore_base_weights):
    """A trainer process SIGKILLed in the middle of a broadcast weight update (the ``nccl``
    transport's code over gloo), once two of its ~31 buckets have gone out: vf-vllm's worker
    prints one line naming the bucket it was waiting for and the trainer, leaves the group and keeps
    serving; the next trainer forms a new group and its update arrives whole (the server's log-probs
    are that trainer's policy's)."""
    import subprocess
    import sys

    script = tmp_path / "dies.py"
    script.write_text(TRAINER_DIES_MID_BROADCAST)
    log_before = server.log.read_text()
    died = subprocess.run([sys.executable, str(script), str(server.port), server.model], capture_output=True,
                          text=True, timeout=600)
    assert died.returncode == -9 and "two buckets sent" in died.stdout, died.stdout + died.stderr[-3000:]
    client = InferenceClient(port=server.port)
    lines = []
    for _ in range(120):  # the worker's line (its broadcast breaks off as the trainer's connections close)
        lines = re.findall(r"^\[vf-rl\] weight update broken off at bucket .*$",
                           server.log.read_text()[len(log_before):], re.M)
        if lines:
            break
        time.sleep(0.5)
    assert len(lines) == 1, server.log.read_text()[len(log_before):][-3000:]
    print(lines[0])
    assert re.match(r"\[vf-rl\] weight update broken off at bucket [23]/\d+: the trainer \(rank 0 of the broadcast "
                    r"group\) stopped sending \(\w+: [^[].*\)$", lines[0]), lines[0]
    assert client.is_healthy()
    policy = trained_lora_policy(server.model)
    sync = BroadcastSync(client, torch.device("cpu"), backend="gloo", timeout_s=120)
    try:
        assert sync.push(policy) == [0]
        assert max_logprob_diff(policy, server, env, tokenizer) < TOLERANCE
    finally:
        sync.close()


@pytest.mark.parametrize("shares_gpu", [False, True])
def test_trainer_overlaps_the_push_with_the_next_step(server, tmp_path, monkeypatch, restore_base_weights, capfd,
                                                      shares_gpu):
    """RLTrainer with an overlapping transport (the nccl transport's code over gloo, chosen by
    patching only the transport choice) and compiled layers (aot_eager): the layers compile on a
    synthetic batch before the server is awaited (warmup.py), or after it answered when it starts
    on the trainer's GPU (``server_shares_gpu``), each step after the first logs the push's own time
    (``timing/sync_push_s``) in the step that collects it, every batch after the first is one step off-policy, and the
    run ends with the push collected."""
    from vf_rl import RLConfig, RLTrainer
    from vf_rl.trainer import weight_sync as weight_sync_module

    monkeypatch.setattr(weight_sync_module, "choose_weight_sync", lambda *args, **kwargs: "nccl")
    made = []

    def make(kind, client, *args):
        made.append(BroadcastSync(client, torch.device("cpu"), backend="gloo", timeout_s=120))
        return made[-1]

    monkeypatch.setattr(weight_sync_module, "make_weight_sync", make)
    args = RLConfig(output_dir=str(tmp_path), use_cpu=True, vllm_server_port=server.port, batch_size=4,
                    rollouts_per_example=2, micro_batch_size=4, max_tokens=8, max_steps=3, learning_rate=1e-3,
                    logging_steps=1, save_steps=100, report_to=[], torch_compile=True, torch_compile_backend="aot_eager")
    env = load_environment("reverse-text", source="offline", num_train_examples=8, num_eval_examples=1)
    RLTrainer(model=server.model, env=env, args=args, served_model_name=server.model, server_shares_gpu=shares_gpu).train()
    out = capfd.readouterr().out
    compiled = r"torch_compile: compiled in [0-9.]+ s on synthetic batches of \d+ tokens\n"
    assert re.search(r"Weight sync: .*\n" + compiled if shares_gpu else compiled + "Waiting for vf-vllm", out), out
    assert len(re.findall(compiled, out)) == 1, out
    steps = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert len(steps) == 3 and len(made) == 1 and made[0]._last is None  # closed after the last push
    # step 2 starts a push while it trains, step 3 collects it (and starts its own, collected at the end)
    assert [r.get("timing/sync_push_s", 0.0) > 0 for r in steps] == [False, False, True]
    assert [r["off_policy/staleness"] for r in steps] == [0.0, 1.0, 1.0]
    # a run started from Python records what it used in <output_dir>/resolved.toml too
    recorded = (tmp_path / "resolved.toml").read_text()
    assert recorded.startswith("# vf-rl: the resolved trainer arguments of a run started from Python")
    assert re.search(r"^learning_rate = 0.001 +# set$", recorded, re.M), recorded
    record = read_toml(tmp_path / "resolved.toml")
    assert record["env"] == {"id": "reverse-text", "args": {"source": "offline", "num_train_examples": 8,
                                                           "num_eval_examples": 1}}
    assert record["trainer"]["args"]["max_steps"] == 3 and record["trainer"]["args"]["eval_rollouts_per_example"] == 2


def test_weight_routes_reject_bad_requests(server):
    assert httpx.get(f"{server.base_url}/weight_sync_info").json() == {"workers": 1, "devices": ["cpu"]}
    assert httpx.post(f"{server.base_url}/update_weights", json={"nope": 1}).status_code == 400
    missing = httpx.post(f"{server.base_url}/update_weights", json={"path": "/no/such/weights"})
    assert missing.status_code == 404 and "no safetensors" in missing.json()["error"]
    assert httpx.post(f"{server.base_url}/update_weights_ipc", json={"buckets": []}).status_code == 400
    # well-formed, but the counts differ: the worker refuses, the server answers and keeps serving
    mismatched = httpx.post(f"{server.base_url}/update_weights_ipc", json={"buckets": [], "handles": [{}]})
    assert mismatched.status_code == 500 and "1 ipc handles" in mismatched.json()["error"]
    assert httpx.post(f"{server.base_url}/reset_prefix_cache").json() == {"status": "ok"}


def test_failing_rollouts_are_errors_with_reward_zero_and_training_goes_on(server, env, capfd):
    """A reward function that raises makes that rollout an error (reward 0, no loss tokens,
    counted in errors/rate, its cause printed once); a batch where all fail stops the run."""
    from datasets import Dataset

    from vf_rl.env_api import Rubric, SingleTurnEnv

    def picky(completion, answer, **kwargs) -> float:
        if answer == "bad":
            raise KeyError("no score for this row")
        return 1.0

    ds = Dataset.from_list([{"question": "Say hi.", "answer": "ok"}, {"question": "Say yo.", "answer": "bad"}])
    picky_env = SingleTurnEnv(dataset=ds, rubric=Rubric(funcs=[picky]))
    rows = list(picky_env.get_dataset())
    orch = Orchestrator(picky_env, rows, base_url=f"{server.base_url}/v1", model_name=server.model,
                        config=OrchestratorConfig(batch_size=4, rollouts_per_example=2,
                                                  sampling_args={"max_tokens": 4, "temperature": 1.0}, max_seq_len=256))
    try:
        batch = orch.wait(0)
        assert batch.metrics["errors/rate"] == batch.metrics["errors/reward"] == 0.5
        assert batch.metrics["errors/model"] == batch.metrics["errors/environment"] == 0.0
        assert [r.reward for r in batch.rollouts] == [1.0, 1.0, 0.0, 0.0]
        assert all(r.error == "reward function picky raised KeyError: 'no score for this row'"
                   and r.error_kind == "reward" for r in batch.rollouts[2:])
        assert len(batch.samples) == 2  # the failed rollouts carry no training tokens
        printed = capfd.readouterr().err
        assert printed.count("no score for this row") == 1 and "2/4 rollouts failed (reward 0, no loss; reward error)" in printed
        orch.rows = [rows[1]]  # every rollout of the next batch fails
        with pytest.raises(AllRolloutsFailed, match=r"every rollout of batch 2 failed; the first \(reward error\): "
                                                    "reward function picky raised KeyError"):
            orch.wait(1)
    finally:
        orch.close()


def test_vf_eval_against_running_server(server, tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "rollouts.jsonl"
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.eval", "reverse-text", "-m", server.model, "-n", "3",
                             "-r", "2", "-t", "12", "-a", '{"few_shot": 2, "source": "offline"}',
                             "--base-url", f"{server.base_url}/v1", "-o", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for key in ("reward ", "reward/std", "reward/within_group_std", "reward/lcs_reward_func", "errors/rate",
                "time/total_s", "tokens_per_s"):
        assert key in result.stdout, key
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6 and all(0.0 <= r["reward"] <= 1.0 for r in records)
    assert records[0]["prompt"][-1]["role"] == "user" and records[0]["completion"][0]["role"] == "assistant"
    bad = subprocess.run([sys.executable, "-m", "vf_rl.launcher.eval", "reverse-text", "-m", "x", "-a", "[1]"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--env-args must be a JSON object" in bad.stderr
    # every rollout failing (nothing listens on the port) is a failed evaluation, with its first cause
    from conftest import free_port

    closed = subprocess.run([sys.executable, "-m", "vf_rl.launcher.eval", "reverse-text", "-m", server.model, "-n", "2",
                             "-r", "2", "-a", '{"source": "offline"}', "--base-url",
                             f"http://127.0.0.1:{free_port()}/v1", "-o", str(tmp_path / "closed.jsonl")],
                            capture_output=True, text=True, timeout=600)
    assert closed.returncode == 1, closed.stderr[-2000:]
    assert "every rollout failed; the first (model): APIConnectionError: Connection error. (caused by " in closed.stderr
    assert json.loads((tmp_path / "closed.jsonl").read_text().splitlines()[0])["error_kind"] == "model"


def test_rollouts_longer_than_max_seq_len_are_truncated_and_masked(server, env, tokenizer):
    """A rollout the trainer would cut at max_seq_len counts as truncated: in truncated/rate,
    and with mask_truncated_completions it gives no sample."""
    rows = [env.get_dataset()[i] for i in range(2)]
    prompt_len = max(len(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)) for r in rows)
    orch = Orchestrator(env, rows, base_url=f"{server.base_url}/v1", model_name=server.model,
                        config=OrchestratorConfig(batch_size=8, rollouts_per_example=4,
                                                  sampling_args={"max_tokens": 12, "temperature": 1.0},
                                                  max_seq_len=prompt_len + 2, mask_truncated_completions=True))
    try:
        batch = orch.wait(0)
    finally:
        orch.close()
    over = [r for r in batch.rollouts if len(r.turns[0].prompt_ids) + len(r.turns[0].completion_ids) > prompt_len + 2]
    assert over and all(r.is_truncated for r in over)
    assert batch.metrics["truncated/rate"] == sum(r.is_truncated for r in batch.rollouts) / 8 >= len(over) / 8
    assert len(batch.samples) == sum(not r.is_truncated for r in batch.rollouts)



def test_history_past_the_context_ends_the_rollout_as_truncated(server):
    """A multi-turn history that outgrows the server's max_model_len (1024 here; vf-rl sets it to
    max_seq_len) ends the rollout as truncated after its last complete turn, not as an error."""
    import asyncio

    from datasets import Dataset
    from openai import AsyncOpenAI

    from vf_rl.env_api import MultiTurnEnv

    class LongReplies(MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            return [{"role": "user", "content": "word " * 1500}]  # > 1024 tokens

    env = LongReplies(dataset=Dataset.from_list([{"question": "Say hi.", "answer": ""}]), max_turns=3)
    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
    rollouts = asyncio.run(env.generate(client, server.model, [env.get_dataset()[0]], 2,
                                        {"max_tokens": 8, "temperature": 1.0}))
    for r in rollouts:
        assert r.error is None and r.is_truncated and len(r.turns) == 1


def test_string_prompts_train_through_the_orchestrator(server, tokenizer):
    """An environment whose rows have plain-string prompts generates a normal training batch."""
    from datasets import Dataset

    from vf_rl.env_api import SingleTurnEnv
    from vf_rl.orchestrator.samples import prompt_rows

    env = SingleTurnEnv(dataset=Dataset.from_list([{"prompt": "Say hello.", "answer": ""},
                                                   {"prompt": "Say bye.", "answer": ""}]))
    rows = prompt_rows(env.get_dataset(), tokenizer, 512)
    orch = Orchestrator(env, rows, base_url=f"{server.base_url}/v1", model_name=server.model,
                        config=OrchestratorConfig(batch_size=4, rollouts_per_example=2, sampling_args={"max_tokens": 6},
                                                  max_seq_len=256))
    try:
        batch = orch.wait(0)
    finally:
        orch.close()
    assert not any(r.error for r in batch.rollouts) and len(batch.samples) == 4
    assert batch.rollouts[0].prompt == [{"role": "user", "content": "Say hello."}]
