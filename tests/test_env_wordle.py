"""The wordle environment: word lists, feedback, game flow, rewards, and one real server run."""

import asyncio

import pytest
from conftest import assert_rollouts_well_formed

from vf_rl.env_api import load_environment
from vf_rl.environments.wordle import (
    EXAMPLE_SECRET,
    RULES,
    WordleEnv,
    default_allowed_guesses,
    default_answers,
    example_game,
    judge,
    score_guess,
)


@pytest.fixture(scope="module")
def env():
    return load_environment("wordle")


def said(*texts):
    return [{"role": "assistant", "content": t} for t in texts]


def score(env, completion, answer):
    return asyncio.run(env.rubric.score(prompt=[], completion=completion, answer=answer))


def test_word_lists():
    answers = default_answers()
    assert 150 < len(answers) < 250 and answers == sorted(set(answers))
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in answers)
    allowed = default_allowed_guesses()
    assert set(answers) <= allowed and len(allowed) > 5000 and "crane" in allowed


def test_dataset_shape_and_seed(env):
    train, evals = env.get_dataset(), env.get_eval_dataset()
    assert len(train) == 2000 and len(evals) == 20
    assert {"prompt", "answer", "task"} <= set(train.column_names)
    assert not set(evals["answer"]) & set(train["answer"])  # held-out words
    assert set(train["answer"]) | set(evals["answer"]) == set(default_answers())
    prompt = train[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert prompt[1]["content"] == RULES.format(max_turns=6) and "<guess>" in prompt[1]["content"]
    again = load_environment("wordle", seed=0)
    assert again.get_dataset()["answer"] == train["answer"]
    assert load_environment("wordle", seed=1).get_dataset()["answer"] != train["answer"]
    small = load_environment("wordle", num_train_examples=-1, num_eval_examples=5, max_turns=4)
    assert len(small.get_dataset()) == len(default_answers()) - 5 and small.max_turns == 4
    assert "4 attempts" in small.get_dataset()[0]["prompt"][-1]["content"]


@pytest.mark.parametrize("guess, secret, feedback", [
    ("crane", "crane", "GGGGG"),
    ("crane", "trace", "YGGXG"),
    ("speed", "abide", "XXYXY"),  # second e: only one e in the secret
    ("eerie", "speed", "YYXXX"),  # two e's matched, the third is X
    ("allee", "apple", "GYXXG"),  # green e takes the secret's only e
    ("llama", "hello", "YYXXX"),
])
def test_feedback_repeated_letters(guess, secret, feedback):
    assert score_guess(guess, secret) == feedback


def test_judge_invalid_guesses():
    allowed = frozenset({"crane", "hello"})
    assert judge("I think <guess> CRANE </guess>", "hello", allowed).feedback == "XXXXY"
    assert "tags" in judge("crane", "hello", allowed).error
    assert "5-letter" in judge("<guess>cranes</guess>", "hello", allowed).error
    assert "word list" in judge("<guess>zzzzz</guess>", "hello", allowed).error


def test_env_response_and_completion(env):
    state = {"turn": 1, "answer": "speed"}
    prompt = [{"role": "user", "content": "rules"}]
    reply = asyncio.run(env.env_response(prompt + said("<guess>eerie</guess>"), state))
    assert reply == [{"role": "user", "content": "EERIE\nY Y X X X\nYou have 5 attempts left."}]
    state["turn"] = 5
    reply = asyncio.run(env.env_response(prompt + said("<guess>qqqqq</guess>"), state))[0]["content"]
    assert "not in the word list" in reply and "counts as an attempt" in reply and "1 attempt left" in reply
    assert not asyncio.run(env.is_completed(prompt + said("<guess>eerie</guess>"), state))
    assert asyncio.run(env.is_completed(prompt + said("<guess>Speed</guess>"), state))
    assert not asyncio.run(env.is_completed(prompt, {"turn": 0, "answer": "speed"}))


def test_rewards_solved_vs_unsolved(env):
    feedback = {"role": "user", "content": "..."}
    two = said("<guess>eerie</guess>") + [feedback] + said("<guess>speed</guess>")
    reward, parts = score(env, two, "speed")
    assert parts == {"correct_answer": 1.0, "efficiency": 0.5, "partial_credit": 1.0, "format_reward": 1.0}
    assert reward == pytest.approx(0.5 + 0.2 * 0.5 + 0.2 + 0.1)
    one, _ = score(env, said("<guess>speed</guess>"), "speed")
    assert one == pytest.approx(1.0) and one > reward
    lost, parts = score(env, said("<guess>eerie</guess>", "no tags", "<guess>speed</guess>"), "steed")
    assert parts["correct_answer"] == 0.0 and parts["efficiency"] == 0.0
    assert parts["partial_credit"] == pytest.approx((2 * 4) / 10)  # speed vs steed: GXGGG
    assert parts["format_reward"] == pytest.approx(2 / 3)
    assert 0.0 < lost < reward
    assert score(env, said("no idea"), "speed")[0] == 0.0


def test_few_shot_example_game():
    messages = example_game(6)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == "<guess>crane</guess>"
    assert messages[2]["content"] == "CRANE\nX X X G G\nYou have 5 attempts left."
    assert messages[-1]["content"] == f"<guess>{EXAMPLE_SECRET}</guess>" and EXAMPLE_SECRET not in default_answers()
    env = load_environment("wordle", few_shot=1, num_train_examples=2)
    prompt = env.get_dataset()[0]["prompt"]
    assert prompt[0]["role"] == "system" and prompt[1:-1] == messages
    assert prompt[-1]["content"] == RULES.format(max_turns=6)


def test_registry_and_bad_args():
    assert isinstance(load_environment("primeintellect/wordle", num_train_examples=10), WordleEnv)
    with pytest.raises(ValueError, match="max_turns"):
        load_environment("wordle", max_turns=0)
    with pytest.raises(ValueError, match="num_eval_examples"):
        load_environment("wordle", num_eval_examples=10_000)
    with pytest.raises(ValueError, match="5-letter"):
        load_environment("wordle", answers=["apple", "banana"])
    with pytest.raises(ValueError, match="few_shot"):
        load_environment("wordle", few_shot=3)


def test_custom_lists_and_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the word lists never need the network
    env = load_environment("wordle", answers=["apple", "crane", "hello"], allowed_guesses=["zebra"],
                           num_eval_examples=1, num_train_examples=5)
    assert env.allowed == {"apple", "crane", "hello", "zebra"}
    assert len(env.get_dataset()) == 5 and len(set(env.get_dataset()["answer"])) == 2


@pytest.mark.server
def test_wordle_rollouts_on_real_server(server):
    from openai import AsyncOpenAI

    # The example game keeps SmolLM2's replies short: a reply cut off at max_tokens ends the
    # rollout, and the test needs some games to go past the first (almost surely wrong) guess.
    env = load_environment("wordle", num_train_examples=2, few_shot=1)
    rows = list(env.get_dataset())
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x")
    rollouts = asyncio.run(env.generate(client, server.model, rows, 4, {"max_tokens": 48, "temperature": 1.0}))
    assert len(rollouts) == 8
    assert any(len(r.turns) > 1 for r in rollouts)
    assert_rollouts_well_formed(rollouts, max_turns=env.max_turns)
