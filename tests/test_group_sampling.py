"""One request per group (env_api/group_sampling.py) and the orchestrator in its own process
(orchestrator/process.py), against the session's real vf-vllm server."""

from __future__ import annotations

import asyncio
import functools
import pickle
import threading
from concurrent.futures import Future

import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from vf_rl.config.sections import OrchestratorConfig
from vf_rl.env_api import MultiTurnEnv, Rubric, SingleTurnEnv, load_environment
from vf_rl.env_api.environment import Environment, Turn
from vf_rl.env_api.errors import ModelServerError
from vf_rl.env_api.group_sampling import completion_args
from vf_rl.inference.client import openai_client
from vf_rl.orchestrator.orchestrator import Orchestrator, batch_rows
from vf_rl.orchestrator.process import (
    OrchestratorProcess,
    begin_orchestrator,
    env_source,
    start_orchestrator,
)
from vf_rl.orchestrator.samples import prompt_rows


def reverse_text():
    return load_environment("reverse-text", few_shot=2, source="offline")


def generate(server, env, rows, n, sampling_args, path=None):
    """``env.generate`` (or ``path``, an unbound ``generate``) against the server, on a fresh loop."""
    async def go():
        client = openai_client(f"{server.base_url}/v1", "x", 300)
        try:
            return await (path or type(env).generate)(env, client, server.model, rows, n, sampling_args)
        finally:
            await client.close()

    return asyncio.run(go())


def test_completion_args_split_and_refuse_chat_only_arguments():
    args = {"max_completion_tokens": 9, "temperature": 0.7, "seed": 3,
            "extra_body": {"top_k": 5, "min_p": 0.1, "chat_template_kwargs": {"enable_thinking": False}}}
    completion, template = completion_args(args)
    assert completion == {"max_tokens": 9, "temperature": 0.7, "seed": 3, "top_k": 5, "min_p": 0.1}
    assert template == {"chat_template_kwargs": {"enable_thinking": False}}
    assert completion_args({"max_tokens": 4, "tools": [{"type": "function"}]}) is None
    assert completion_args({"max_tokens": 4, "response_format": {"type": "json_object"}}) is None


def test_a_served_turn_needs_token_ids_and_a_logprob_per_token():
    turn = Turn.served((1, 2), (3, 4), ["-0.5", -1])
    assert (turn.prompt_ids, turn.completion_ids, turn.completion_logprobs) == ([1, 2], [3, 4], [-0.5, -1.0])
    with pytest.raises(ModelServerError, match="returned no token ids/logprobs; is it vf-vllm"):
        Turn.served([1], None, [-0.5])
    with pytest.raises(ModelServerError, match="returned no token ids/logprobs"):
        Turn.served(None, [3], [-0.5])
    with pytest.raises(ModelServerError, match="2 token ids but 1 logprobs"):
        Turn.served([1], [3, 4], [-0.5])


@pytest.mark.server
def test_group_request_matches_the_chat_path_token_for_token(server):
    """Greedy, one rollout per row: the same prompt ids, completion ids, log-probs, text and reward
    as one chat completion per rollout."""
    env = reverse_text()
    rows = [dict(r) for r in env.get_dataset().select(range(3))]
    sampling = {"max_tokens": 20, "temperature": 0.0}
    group = generate(server, env, rows, 1, sampling)
    chat = generate(server, env, rows, 1, sampling, path=Environment.generate)
    tokenizer = AutoTokenizer.from_pretrained(server.model)
    for g, c, row in zip(group, chat, rows):
        assert g.error is None and c.error is None, (g.error, c.error)
        assert g.turns[0].prompt_ids == c.turns[0].prompt_ids == tokenizer.apply_chat_template(
            row["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)
        assert g.turns[0].completion_ids == c.turns[0].completion_ids
        assert g.turns[0].completion_logprobs == pytest.approx(c.turns[0].completion_logprobs, abs=1e-3)
        assert g.completion == c.completion and g.reward == c.reward and g.is_truncated == c.is_truncated


@pytest.mark.server
def test_group_request_samples_every_rollout_of_a_row(server):
    """Four rollouts per row, seeded: four distinct samples per row (one seed per child, where
    four seeded chat requests would all be the same), each with a log-prob per token, the
    truncation flag set by max_tokens, and the rows in order."""
    env = reverse_text()
    rows = [dict(r) for r in env.get_dataset().select(range(2))]
    rollouts = generate(server, env, rows, 4, {"max_tokens": 6, "temperature": 1.0, "seed": 11})
    assert [r.example_id for r in rollouts] == [0, 0, 0, 0, 1, 1, 1, 1]
    for i, row in enumerate(rows):
        group = rollouts[4 * i:4 * i + 4]
        assert all(r.error is None and r.prompt == row["prompt"] and r.answer == row["answer"] for r in group)
        assert len({tuple(r.turns[0].completion_ids) for r in group}) > 1
        for r in group:
            turn = r.turns[0]
            assert 0 < len(turn.completion_ids) == len(turn.completion_logprobs) <= 6
            assert all(lp <= 0.0 for lp in turn.completion_logprobs)
            assert r.is_truncated == (len(turn.completion_ids) == 6 and turn.completion_ids[-1] != 2)


@pytest.mark.server
def test_group_request_errors_fail_the_group_not_the_call(server):
    """A request the server refuses (unknown model) makes every rollout of the group an error
    with reward 0; generate still returns them."""
    env = reverse_text()
    rows = [dict(r) for r in env.get_dataset().select(range(2))]

    async def go():
        client = openai_client(f"{server.base_url}/v1", "x", 60)
        try:
            return await env.generate(client, "no-such-model", rows, 2, {"max_tokens": 4, "temperature": 1.0})
        finally:
            await client.close()

    rollouts = asyncio.run(go())
    assert len(rollouts) == 4 and all(r.error and r.reward == 0.0 for r in rollouts)


@pytest.mark.server
def test_an_overridden_rollout_keeps_one_request_per_rollout(server):
    """A SingleTurnEnv subclass with its own ``rollout`` is called once per rollout."""
    calls = []

    class Counting(SingleTurnEnv):
        async def rollout(self, client, model, rollout, sampling_args):
            calls.append(rollout.example_id)
            await super().rollout(client, model, rollout, sampling_args)

    env = Counting(dataset=Dataset.from_list([{"question": "Say hi.", "answer": "hi"}]))
    rollouts = generate(server, env, [env.get_dataset()[0]], 3, {"max_tokens": 4, "temperature": 1.0})
    assert calls == [0, 0, 0] and all(r.error is None and r.turns for r in rollouts)


class GoOn(MultiTurnEnv):
    """Three model turns, the environment answering "Go on." between them; a row whose question
    is "Done." is complete before any turn. Replies end at the first space or newline."""

    async def is_completed(self, messages, state, **kwargs):
        return state["prompt"][-1]["content"] == "Done." or state["turn"] >= 3

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "Go on."}]


def go_on(rows, cls=GoOn):
    def turns(completion, **kwargs):
        return float(sum(m["role"] == "assistant" for m in completion))

    return cls(dataset=Dataset.from_list(list(rows)), rubric=Rubric(funcs=[turns]))


@pytest.mark.server
def test_multi_turn_group_path_matches_the_chat_path_turn_for_turn(server):
    """Greedy, one rollout per row: the group request's first turn and the chat completions after
    it give the same turns (prompt ids, completion ids, log-probs), history and reward as a chat
    completion per turn."""
    env = go_on([{"question": q, "answer": ""} for q in ("Name a colour.", "Name a fruit.")])
    rows = [dict(r) for r in env.get_dataset()]
    sampling = {"max_tokens": 24, "temperature": 0.0, "stop": [" ", "\n"]}
    group = generate(server, env, rows, 1, sampling)
    chat = generate(server, env, rows, 1, sampling, path=Environment.generate)
    for g, c in zip(group, chat):
        assert g.error is None and c.error is None, (g.error, c.error)
        assert len(g.turns) == len(c.turns) == 3 and g.reward == c.reward == 3.0
        for gt, ct in zip(g.turns, c.turns):
            assert gt.prompt_ids == ct.prompt_ids and gt.completion_ids == ct.completion_ids
            assert gt.completion_logprobs == pytest.approx(ct.completion_logprobs, abs=1e-3)
        assert g.completion == c.completion and g.state["turn"] == c.state["turn"] == 3


@pytest.mark.server
def test_multi_turn_group_samples_each_first_turn_then_goes_on_alone(server):
    """Four seeded rollouts per row: distinct first turns (one request, one seed per child, where
    four seeded chat requests would be the same), each rollout then runs its own later turns; a
    row complete before any turn gets no turn and is still scored."""
    env = go_on([{"question": "Name a colour.", "answer": ""},
                 {"question": "Done.", "answer": ""}])
    rows = [dict(r) for r in env.get_dataset()]
    rollouts = generate(server, env, rows, 4, {"max_tokens": 24, "temperature": 1.0, "seed": 11,
                                              "stop": [" ", "\n"]})
    assert [r.example_id for r in rollouts] == [0] * 4 + [1] * 4
    first, done = rollouts[:4], rollouts[4:]
    assert all(r.error is None for r in rollouts), [r.error for r in rollouts]
    assert len({tuple(r.turns[0].completion_ids) for r in first}) > 1
    for r in first:
        assert not r.is_truncated and len(r.turns) == 3 and r.reward == 3.0
        assert [m["role"] for m in r.completion] == ["assistant", "user"] * 2 + ["assistant"]
        assert r.turns[1].prompt_ids[:len(r.turns[0].prompt_ids)] == r.turns[0].prompt_ids
    assert all(r.turns == [] and r.completion == [] and r.reward == 0.0 for r in done)


@pytest.mark.server
def test_multi_turn_with_its_own_turn_args_keeps_chat_completions(server):
    """A MultiTurnEnv whose ``turn_args`` adds arguments (as ToolEnv adds tools) samples every
    turn as a chat completion with them: four seeded rollouts share their first turn."""
    seen = []

    class OwnArgs(GoOn):
        def turn_args(self, sampling_args):
            seen.append(dict(sampling_args))
            return sampling_args

    env = go_on([{"question": "Name a colour.", "answer": ""}], OwnArgs)
    rollouts = generate(server, env, [env.get_dataset()[0]], 4,
                        {"max_tokens": 24, "temperature": 1.0, "seed": 11, "stop": [" ", "\n"]})
    assert all(r.error is None for r in rollouts), [r.error for r in rollouts]
    assert len(seen) == sum(len(r.turns) for r in rollouts) >= 4
    assert len({tuple(r.turns[0].completion_ids) for r in rollouts}) == 1


def test_env_source_prefers_the_recipe_and_refuses_what_cannot_be_sent():
    env = reverse_text()
    source = env_source(env)
    assert source is env.recipe and pickle.loads(pickle.dumps(source))().get_dataset()[0] == env.get_dataset()[0]

    def reward(completion, **kwargs):  # a local function: pickles by reference, which fails
        return 1.0

    local = SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]), rubric=Rubric(funcs=[reward]))
    assert env_source(local) is None
    assert env_source(env, {"advantage_fn": lambda rewards: rewards}) is None
    assert env_source(env, {"advantage_fn": pickle.loads}) is env.recipe  # importable: sent by reference


def test_start_orchestrator_falls_back_to_a_thread_and_says_why(capsys):
    def reward(completion, **kwargs):
        return 1.0

    local = SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]), rubric=Rubric(funcs=[reward]))
    options = dict(base_url="http://127.0.0.1:9/v1", model_name="m",
                   config=OrchestratorConfig(batch_size=2, rollouts_per_example=2, sampling_args={"max_tokens": 4},
                                             max_seq_len=64))
    orchestrator = start_orchestrator(local, [{"prompt": "q", "row_id": 0}], True, **options)
    try:
        assert isinstance(orchestrator, Orchestrator) and "a thread in the trainer process" in capsys.readouterr().out
    finally:
        orchestrator.close()
    orchestrator = start_orchestrator(local, [{"prompt": "q", "row_id": 0}], False, **options)
    orchestrator.close()
    assert isinstance(orchestrator, Orchestrator) and capsys.readouterr().out == ""


def test_orchestrator_process_starts_before_its_server_and_reports_a_failed_environment():
    """The process starts (and rebuilds the environment) before anything is known of the server;
    one begun and never started closes cleanly (the trainer's wait for the server failed); an
    environment that fails to rebuild there is one RuntimeError at ``start``, naming the cause."""
    env = reverse_text()
    options = dict(base_url="http://127.0.0.1:9/v1", model_name="m",
                   config=OrchestratorConfig(batch_size=2, rollouts_per_example=2, sampling_args={"max_tokens": 4},
                                             max_seq_len=64))
    begun = begin_orchestrator(env, [{"prompt": "q", "row_id": 0}], advantage_fn=pickle.loads)
    assert isinstance(begun, OrchestratorProcess)
    process = begun._manager._process
    begun.close()
    process.join(30)
    assert not process.is_alive()
    broken = OrchestratorProcess(functools.partial(load_environment, "no-such-environment"), [{"prompt": "q"}])
    with pytest.raises(RuntimeError, match="the orchestrator process could not start: ValueError: unknown environment "
                                           "'no-such-environment'") as raised:
        broken.start(**options)
    assert "\n" not in str(raised.value)  # one line, the cause; the process's traceback is in __cause__
    assert begin_orchestrator(env, [], advantage_fn=lambda rewards: rewards) is None  # a lambda: a thread


SCRIPT = """
import os, sys
print("top level ran", flush=True)  # no main guard: spawn must not run this again
from transformers import AutoTokenizer
from vf_rl.env_api import load_environment
from vf_rl.orchestrator.samples import prompt_rows
from vf_rl.config.sections import OrchestratorConfig
from vf_rl.orchestrator.process import OrchestratorProcess, env_source
env = load_environment("reverse-text", few_shot=2, source="offline")
rows = prompt_rows(env.get_dataset(), AutoTokenizer.from_pretrained(sys.argv[2]), 512)[:4]
options = dict(base_url=sys.argv[1], model_name=sys.argv[2],
               config=OrchestratorConfig(batch_size=2, rollouts_per_example=2,
                                         sampling_args={"max_tokens": 4, "temperature": 1.0}, max_seq_len=600))
orchestrator = OrchestratorProcess(env_source(env, options), rows).start(**options)
print("batch", len(orchestrator.wait(0).rollouts), flush=True)
orchestrator.close()
"""


@pytest.mark.server
def test_a_script_without_main_guard_runs_once(server, tmp_path):
    """A user's training script with no ``if __name__ == "__main__":`` guard: the orchestrator's
    process must not run the script's top level again."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, str(script), f"{server.base_url}/v1", server.model],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("top level ran") == 1 and "batch 2" in result.stdout, result.stdout


@pytest.mark.server
def test_orchestrator_thread_generates_a_batch_whose_push_failed_when_it_is_taken(server, model_dir, capfd):
    """A batch submitted after a weight push that fails is not generated then (it would sample the
    weights before the push) but when the trainer takes it, after its retry: on-policy, one line."""
    env = reverse_text()
    rows = prompt_rows(env.get_dataset(), AutoTokenizer.from_pretrained(model_dir), 512)[:8]
    orchestrator = Orchestrator(env, rows, base_url=f"{server.base_url}/v1", model_name=server.model,
                                config=OrchestratorConfig(batch_size=4, rollouts_per_example=2,
                                                          sampling_args={"max_tokens": 6, "temperature": 1.0},
                                                          max_seq_len=600))
    try:
        failed = Future()
        orchestrator.submit(1, policy_step=0, after=failed)
        failed.set_exception(ConnectionError("the server went away"))
        batch = orchestrator.wait(1)
        assert batch.step == 1 and len(batch.rollouts) == 4 and all(r.error is None for r in batch.rollouts)
        assert batch.metrics["off_policy/staleness"] == 0.0
        assert "[orchestrator] batch 2: the weight update it was to be generated with failed" in capfd.readouterr().err
    finally:
        orchestrator.close()


@pytest.mark.server
def test_orchestrator_process_batches_gate_and_errors(server, model_dir):
    """The orchestrator in its own process: a batch submitted after a pending weight push is
    generated only once the push is done, batches and evaluation rollouts come back with their
    samples, and a batch whose every rollout failed raises here as in the thread."""
    env = reverse_text()
    rows = prompt_rows(env.get_dataset(), AutoTokenizer.from_pretrained(model_dir), 512)[:8]
    options = dict(base_url=f"{server.base_url}/v1", model_name=server.model,
                   config=OrchestratorConfig(batch_size=4, rollouts_per_example=2,
                                             sampling_args={"max_tokens": 6, "temperature": 1.0}, max_seq_len=600))
    orchestrator = OrchestratorProcess(env_source(env, options), rows).start(**options)
    try:
        orchestrator.submit(0)
        push = Future()
        orchestrator.submit(1, policy_step=0, after=push)
        assert orchestrator.submitted(1) and not orchestrator._remote.submitted(1)
        progress = []
        batch = orchestrator.wait(0, on_progress=lambda done, total: progress.append((done, total)))
        assert batch.step == 0 and len(batch.rollouts) == 4 and len(batch.samples) == 4
        assert [r["row_id"] for r in batch_rows(rows, 0, 2)] == batch.row_ids
        assert not orchestrator._remote.submitted(1)  # still waiting for the push
        threading.Timer(0.5, push.set_result, (None,)).start()
        batch = orchestrator.wait(1)
        assert batch.step == 1 and batch.metrics["off_policy/staleness"] == 1.0
        failed = Future()  # a push that fails (the server went away during it)
        orchestrator.submit(2, policy_step=1, after=failed)
        failed.set_exception(ConnectionError("the server went away"))
        orchestrator._gates[2].join()
        assert not orchestrator._remote.submitted(2)  # not generated with the weights before the push
        batch = orchestrator.wait(2)  # generated now, with the weights the trainer pushed on its retry
        assert batch.step == 2 and len(batch.rollouts) == 4 and batch.metrics["off_policy/staleness"] == 0.0
        evaluated = orchestrator.run(rows[:1], 3)
        assert len(evaluated) == 3 and all(r.error is None for r in evaluated)
    finally:
        orchestrator.close()
    bad = OrchestratorProcess(env_source(env), rows).start(**{**options, "model_name": "no-such-model"})
    try:
        with pytest.raises(RuntimeError, match="every rollout of batch 1 failed"):
            bad.wait(0)
    finally:
        bad.close()
