"""The alphabet-sort environment: session plans, follow-up turns, rewards, data sources, one server run."""

import asyncio

import pytest
from conftest import assert_rollouts_well_formed
from datasets import Dataset

import vf_rl.environments.alphabet_sort as alphabet_sort
from vf_rl.env_api import load_environment
from vf_rl.environments.alphabet_sort import example_session, sort_names, split_name


@pytest.fixture(scope="module")
def env():
    return load_environment("kalomaze/alphabet-sort", source="offline", num_train_examples=60, num_eval_examples=10)


def answers(info, turns=None, tags=True):
    """A completion answering ``turns`` turns of the session exactly (follow-ups in between)."""
    completion = []
    for turn, lines in enumerate(info["ground_truths"][:turns]):
        if turn:
            completion.append({"role": "user", "content": info["follow_ups"][turn - 1]})
        tag = "alphabetical_sorted" if turn == 0 else "combined_alphabetical_sorted"
        body = "\n".join(lines)
        completion.append({"role": "assistant", "content": f"<{tag}>\n{body}\n</{tag}>" if tags else body})
    return completion


def reward(env, completion, info):
    return asyncio.run(env.rubric.score(prompt=[], completion=completion, info=info))[0]


def row_with_turns(env, n):
    return next(r for r in env.get_dataset() if r["info"]["num_turns"] == n)


def test_names_split_and_sort():
    assert split_name("VladimirDrinfeld") == ("Vladimir", "Drinfeld")
    assert split_name("Plato") == ("Plato", "")
    names = ["ZoeAdams", "AdamZed", "bobCole"]
    assert sort_names(names, "first") == ["AdamZed", "bobCole", "ZoeAdams"]
    assert sort_names(names, "last") == ["ZoeAdams", "bobCole", "AdamZed"]


def test_dataset_shape_and_plan(env):
    train, evals = env.get_dataset(), env.get_eval_dataset()
    assert len(train) == 60 and len(evals) == 10
    assert {"prompt", "answer", "info", "task"} <= set(train.column_names)
    assert {r["info"]["num_turns"] for r in train} == {1, 2, 3}
    for row in train:
        info = row["info"]
        assert [m["role"] for m in row["prompt"]] == ["user"]
        assert row["prompt"][0]["content"] == row["question"] and "<alphabetical_sorted>" in row["question"]
        assert f"by {info['sort_by'].upper()} name" in row["question"]
        assert len(info["turn_names"]) == len(info["ground_truths"]) == info["num_turns"]
        assert len(info["follow_ups"]) == info["num_turns"] - 1
        assert all(1 <= len(names) <= 5 for names in info["turn_names"])
        assert all(name in row["question"] for name in info["turn_names"][0])
        assert info["ground_truths"][0] == sort_names(info["turn_names"][0], info["sort_by"])
        all_names = sum(info["turn_names"], [])
        assert len(set(all_names)) == len(all_names)
        assert row["answer"] == "\n".join(info["ground_truths"][-1])


def test_dataset_is_deterministic_given_seed(env):
    again = load_environment("alphabet-sort", source="offline", num_train_examples=60, num_eval_examples=10)
    assert again.get_dataset()["info"] == env.get_dataset()["info"]
    assert again.get_dataset()["question"] == env.get_dataset()["question"]
    other = load_environment("alphabet-sort", source="offline", num_train_examples=60, num_eval_examples=10, seed=1)
    assert other.get_dataset()["question"] != env.get_dataset()["question"]


def test_turn_and_name_counts_and_system_prompt():
    env = load_environment("alphabet-sort", source="offline", min_turns=2, max_turns=2, min_names_per_turn=3,
                           max_names_per_turn=3, num_train_examples=5, num_eval_examples=0, system_prompt="Be exact.")
    assert env.eval_dataset is None and env.max_turns == 2
    for row in env.get_dataset():
        assert [len(n) for n in row["info"]["turn_names"]] == [3, 3]
        assert row["prompt"][0] == {"role": "system", "content": "Be exact."}


def test_env_response_adds_new_names(env):
    row = row_with_turns(env, 3)
    info = row["info"]
    state = {"turn": 1, "info": info}
    messages = row["prompt"] + answers(info, 1)
    assert not asyncio.run(env.is_completed(messages, state))
    reply = asyncio.run(env.env_response(messages, state))
    assert reply == [{"role": "user", "content": info["follow_ups"][0]}]
    text = reply[0]["content"]
    assert "<combined_alphabetical_sorted>" in text and "// new name!" in text
    assert all(name in text for name in info["turn_names"][1])
    state["turn"] = 2
    assert asyncio.run(env.env_response(messages, state))[0]["content"] == info["follow_ups"][1]
    assert info["ground_truths"][1] == [f"{n} // new name!" if n in info["turn_names"][1] else n
                                        for n in sort_names(sum(info["turn_names"][:2], []), info["sort_by"])]
    state["turn"] = 3
    assert asyncio.run(env.is_completed(messages, state))


def test_rewards(env):
    info = row_with_turns(env, 2)["info"]
    assert reward(env, answers(info), info) == 1.0
    assert reward(env, answers(info, tags=False), info) == 0.0  # missing tags
    assert reward(env, answers(info, 1), info) == pytest.approx(0.5)  # second turn not reached
    wrong = answers(info)
    wrong[0]["content"] = wrong[0]["content"].replace("<alphabetical_sorted>\n", "<alphabetical_sorted>\nZzzZzz\n")
    assert 0.5 < reward(env, wrong, info) < 1.0
    unmarked = answers(info)
    unmarked[-1]["content"] = unmarked[-1]["content"].replace(" // new name!", "")
    assert 0.5 < reward(env, unmarked, info) < 1.0
    reversed_info = dict(info, ground_truths=[gt[::-1] for gt in info["ground_truths"]])
    if len(info["ground_truths"][0]) > 1:
        assert reward(env, answers(reversed_info), info) < 1.0


def test_few_shot_example_session():
    messages = example_session()
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2
    assert "<alphabetical_sorted>" in messages[0]["content"] and "// new name!" in messages[2]["content"]
    assert messages[3]["content"].count("// new name!") == 2
    env = load_environment("alphabet-sort", source="offline", few_shot=1, num_train_examples=3, num_eval_examples=0)
    prompt = env.get_dataset()[0]["prompt"]
    assert prompt[:4] == messages and prompt[4]["content"] == env.get_dataset()[0]["question"]
    info = env.get_dataset()[0]["info"]
    assert reward(env, answers(info), info) == 1.0  # the example turns in the prompt are not scored


def test_power_per_turn_off():
    kwargs = dict(source="offline", num_train_examples=30, num_eval_examples=0, min_turns=2, max_turns=2)
    per_turn, holistic = load_environment("alphabet-sort", **kwargs), load_environment(
        "alphabet-sort", power_per_turn=False, **kwargs)
    info = per_turn.get_dataset()[0]["info"]
    assert reward(per_turn, answers(info, 1), info) == pytest.approx(0.5)
    assert reward(holistic, answers(info, 1), info) == pytest.approx(0.5 ** 4)


def test_hub_rows_are_used(monkeypatch):
    authors = [["Ada Lovelace", "Alan Turing", "Grace Hopper", "Ada Lovelace"], ["Emmy Noether"]] * 20
    monkeypatch.setattr(alphabet_sort, "load_dataset",
                        lambda name, split: Dataset.from_list([{"names": n} for n in authors]))
    env = load_environment("alphabet-sort", source="hub", max_turns=1, min_names_per_turn=2,
                           max_names_per_turn=3, num_eval_examples=2)
    rows = list(env.get_dataset()) + list(env.get_eval_dataset())
    assert len(rows) == 20  # every 3-author list is used, the 1-author lists are too short
    names = {n for r in rows for n in r["info"]["turn_names"][0]}
    assert names == {"AdaLovelace", "AlanTuring", "GraceHopper"}


def test_offline_fallback(monkeypatch):
    def unreachable(name, split):
        raise ConnectionError("no network")

    monkeypatch.setattr(alphabet_sort, "load_dataset", unreachable)
    env = load_environment("alphabet-sort", num_eval_examples=5)  # source="auto"
    assert len(env.get_dataset()) == 2000
    with pytest.raises(ConnectionError):
        load_environment("alphabet-sort", source="hub")
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = load_environment("alphabet-sort", num_train_examples=20, num_eval_examples=5)
    assert len(env.get_dataset()) == 20 and len(env.get_eval_dataset()) == 5


@pytest.mark.parametrize("kwargs, match", [
    (dict(min_turns=0), "min_turns"),
    (dict(min_turns=4, max_turns=3), "min_turns <= max_turns"),
    (dict(min_names_per_turn=6), "min_names_per_turn"),
    (dict(similarity_power=0), "similarity_power"),
    (dict(num_eval_examples=-1), "num_eval_examples"),
    (dict(source="internet"), "source"),
    (dict(few_shot=2), "few_shot"),
])
def test_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_environment("alphabet-sort", **{"source": "offline", **kwargs})


@pytest.mark.server
def test_alphabet_sort_rollouts_on_real_server(server):
    from openai import AsyncOpenAI

    # One name per turn and the example session keep SmolLM2's answers short: a reply cut
    # off at max_tokens ends the rollout, and the test needs some rollouts to reach turn 2.
    env = load_environment("alphabet-sort", source="offline", min_turns=2, max_turns=2, max_names_per_turn=1,
                           few_shot=1, num_train_examples=2, num_eval_examples=0)
    rows = list(env.get_dataset())
    assert all(r["info"]["num_turns"] == 2 for r in rows)
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x")
    rollouts = asyncio.run(env.generate(client, server.model, rows, 2, {"max_tokens": 48, "temperature": 1.0}))
    assert len(rollouts) == 4
    assert any(len(r.turns) > 1 for r in rollouts)
    assert_rollouts_well_formed(rollouts, max_turns=2)
