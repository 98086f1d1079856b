"""The gsm8k environment: offline synthetic data, hub fallback, rewards, and a real server run."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

import vf_rl
from vf_rl.environments import gsm8k


def score(env, text: str, answer: str) -> tuple[float, dict]:
    return asyncio.run(env.rubric.score(prompt=[], completion=[{"role": "assistant", "content": text}],
                                        answer=answer))


@pytest.fixture(scope="module")
def env():
    return vf_rl.load_environment("primeintellect/gsm8k", source="offline")


def test_offline_dataset_shape(env):
    train, test = env.get_dataset(), env.get_eval_dataset()
    assert len(train) == 200 and len(test) == 50
    assert not set(train["question"]) & set(test["question"])
    row = train[0]
    assert re.fullmatch(r"-?\d+", row["answer"]) and row["task"] == "gsm8k"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert "\\boxed{}" in row["prompt"][0]["content"] and row["prompt"][1]["content"] == row["question"]


def test_synthetic_sample_is_consistent():
    """Every calculator note of the shipped sample is right and the final answer is the last result."""
    for split in ("train", "test"):
        for row in gsm8k._offline(split):
            notes = re.findall(r"<<([^=>]+)=([^>]+)>>", row["answer"])
            assert notes, row
            for expr, value in notes:
                assert eval(expr) == int(value), (expr, value)  # noqa: S307 - our own generated arithmetic
            assert gsm8k.extract_hash_answer(row["answer"]) == notes[-1][1]


def test_worked_solutions_are_what_vf_sft_trains_on_and_score_1(env):
    """Each row's ``completion`` is its solution without calculator notes, ending in the boxed
    answer the rubric rewards; vf-sft's rows from ``[env] id = "gsm8k"`` are exactly those."""
    from vf_rl.sft.train import load_rows

    assert gsm8k.worked_solution("4*6 = <<4*6=24>>24 eggs\n#### 24") == "4*6 = 24 eggs\n\\boxed{24}"
    assert gsm8k.worked_solution("#### 1,200") == "\\boxed{1200}"
    train = env.get_dataset()
    for row in train.select(range(20)):
        assert "<<" not in row["completion"] and "####" not in row["completion"]
        assert score(env, row["completion"], row["answer"])[0] == 1.0
    rows = load_rows(None, {"id": "gsm8k", "args": {"source": "offline"}})
    assert len(rows) == len(train)
    assert rows[0]["prompt"] == train[0]["prompt"]
    assert rows[0]["completion"] == [{"role": "assistant", "content": train[0]["completion"]}]


def test_extract_hash_answer():
    assert gsm8k.extract_hash_answer("5*240 = 1200\n#### 1,200") == "1200"
    with pytest.raises(ValueError, match="####"):
        gsm8k.extract_hash_answer("no final answer")


def test_rewards(env):
    assert score(env, "3*14 = 42, so \\boxed{42}", "42")[0] == 1.0
    assert score(env, "\\boxed{41}", "42")[0] == 0.0
    assert score(env, "The answer is 42.", "42")[0] == 0.0  # no \boxed{}: no answer
    reward, metrics = score(env, "\\boxed{41}", "42")
    assert metrics == {"boxed_format_reward": 1.0, "correct_answer_reward_func": 0.0}
    weighted = gsm8k.load_environment(source="offline", format_weight=0.1, num_train_examples=5, num_eval_examples=5)
    assert score(weighted, "\\boxed{41}", "42")[0] == pytest.approx(0.1)
    assert score(weighted, "\\boxed{42.0}", "42")[0] == pytest.approx(1.1)


def test_few_shot_examples():
    env = gsm8k.load_environment(source="offline", few_shot=2, num_train_examples=3, num_eval_examples=3)
    prompt = env.get_dataset()[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "\\boxed{10}" in prompt[2]["content"]


def test_offline_fallback(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert len(gsm8k.load_environment().get_dataset()) == 200  # source="auto"
    with pytest.raises(Exception):
        gsm8k.load_gsm8k("train", source="hub", dataset_name="openai/gsm8k-not-cached-here")


def test_hub_unreachable_falls_back(monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(gsm8k, "load_dataset", unreachable)
    assert len(gsm8k.load_gsm8k("test", source="auto")) == 50
    with pytest.raises(ConnectionError):
        gsm8k.load_gsm8k("test", source="hub")


def test_bad_args():
    with pytest.raises(ValueError, match="source"):
        gsm8k.load_environment(source="internet")
    with pytest.raises(ValueError, match="few_shot"):
        gsm8k.load_environment(source="offline", few_shot=5)
    with pytest.raises(ValueError, match="split"):
        gsm8k.load_gsm8k("validation", source="offline")
    with pytest.raises(ValueError, match="format_weight"):
        gsm8k.load_environment(source="offline", format_weight=-1)
    with pytest.raises(ValueError, match="num_examples"):
        gsm8k.load_environment(source="offline", num_train_examples=0)


@pytest.mark.server
def test_generate_against_server(server, env):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x")
    rows = [env.get_eval_dataset()[i] for i in range(2)]
    rollouts = asyncio.run(env.generate(client, server.model, rows, 2, {"max_tokens": 64, "temperature": 1.0}))
    assert len(rollouts) == 4
    for r in rollouts:
        assert r.error is None, r.error
        assert 0.0 <= r.reward <= 1.0
        assert len(r.turns) == 1 and r.completion[0]["role"] == "assistant"
        for turn in r.turns:
            assert len(turn.completion_ids) == len(turn.completion_logprobs) > 0


def test_math_answers_score_off_the_main_thread(env):
    """The orchestrator scores rollouts in its event loop's thread, where math-verify's SIGALRM
    timeout cannot be set: there every answer used to score 0."""
    results = []

    def in_a_thread():
        results.append([score(env, f"so \\boxed{{{text}}}", answer)[0]
                        for text, answer in [("72.0", "72"), ("\\frac{1}{2}", "0.5"), ("71", "72"), ("72", "72")]])
        results.append(vf_rl.env_api.math_equal("10^{10^{10}}", "8"))  # past math-verify's timeout: False

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert results == [[1.0, 1.0, 0.0, 1.0], False]
    assert [score(env, "\\boxed{72.0}", "72")[0], score(env, "\\boxed{71}", "72")[0]] == [1.0, 0.0]


def test_math_verify_worker_ends_with_its_parent(tmp_path):
    """The worker process math-verify runs in off the main thread ends when the process that
    started it exits abruptly (as the orchestrator does with its trainer): an orphan kept the
    trainer pane's output pipe open, so ``vf-rl --wait`` never returned."""
    script = textwrap.dedent("""
        import os, sys, threading
        from vf_rl.env_api import math_rubric
        out = []
        thread = threading.Thread(target=lambda: out.append(math_rubric.math_equal("0.5", "1/2")))
        thread.start(); thread.join()
        print(out[0], *math_rubric._pool._processes, flush=True)
        os._exit(0)
    """)
    try:  # the output pipe closes only once the worker, which inherited it, is gone too
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the math-verify worker outlived its parent and kept its output pipe open")
    equal, worker = done.stdout.split()
    assert equal == "True"
    for _ in range(600):  # the worker checks its parent every second
        if not psutil.pid_exists(int(worker)) or psutil.Process(int(worker)).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.1)
    else:
        psutil.Process(int(worker)).kill()
        pytest.fail(f"math-verify worker {worker} outlived its parent")

