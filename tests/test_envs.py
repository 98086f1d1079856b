"""Environment core: registry naming, parser, rubric, and the reverse-text environment."""

import asyncio
import textwrap

import pytest

import vf_rl
from vf_rl.env_api import Rubric, SingleTurnEnv, XMLParser, builtin_environments, load_environment
from vf_rl.env_api.registry import module_name


def test_module_name_convention():
    assert module_name("primeintellect/reverse-text") == "reverse_text"
    assert module_name("reverse-text") == "reverse_text"
    assert module_name("kalomaze/alphabet-sort") == "alphabet_sort"
    assert module_name("my_pkg.envs.math") == "my_pkg.envs.math"
    assert module_name("my-pkg.envs:make_env") == "my_pkg.envs"


def test_user_module_on_path_is_found_and_gets_env_args(tmp_path, monkeypatch):
    (tmp_path / "my_tiny_env.py").write_text(textwrap.dedent('''
        from datasets import Dataset
        import vf_rl as vf
        def load_environment(n=2, **kwargs):
            ds = Dataset.from_list([{"question": str(i), "answer": str(i)} for i in range(n)])
            return vf.SingleTurnEnv(dataset=ds, system_prompt="sys")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    env = load_environment("someone/my-tiny-env", n=3)
    assert len(env.get_dataset()) == 3
    assert env.get_dataset()[0]["prompt"][0] == {"role": "system", "content": "sys"}


def test_unknown_environment_lists_builtins():
    with pytest.raises(ValueError, match="built-in environments: .*reverse-text"):
        load_environment("nobody/does-not-exist")
    with pytest.raises(ValueError, match=r"install it \(prime env install nobody/does-not-exist\)"):
        load_environment("nobody/does-not-exist")
    with pytest.raises(ValueError, match=r"install it \(pip install no-such-env\)"):
        load_environment("no-such-env")
    assert "reverse-text" in builtin_environments()


def test_submodule_and_factory_ids(tmp_path, monkeypatch):
    """A loader in a submodule (``package.module``) or a factory of another name
    (``module:function``) is named directly, in training configs and vf-eval alike."""
    package = tmp_path / "my_env_pkg"
    (package / "envs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "envs" / "__init__.py").write_text("")
    (package / "envs" / "tiny.py").write_text(textwrap.dedent('''
        from datasets import Dataset
        import vf_rl as vf
        def load_environment(n=2):
            return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": str(i)} for i in range(n)]))
        def make_env(k: int = 1):
            return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "x"}] * k))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert len(load_environment("my_env_pkg.envs.tiny", n=3).get_dataset()) == 3
    assert len(load_environment("my_env_pkg.envs.tiny:make_env", k=4).get_dataset()) == 4
    with pytest.raises(ValueError, match=r"has no function nope\(\)"):
        load_environment("my_env_pkg.envs.tiny:nope")
    with pytest.raises(ValueError, match=r"cannot be imported; is its package installed \(pip install other-pkg\)"):
        load_environment("other_pkg.envs")
    with pytest.raises(ValueError, match="expected a module name"):
        load_environment("bad id:x y")


def test_module_without_load_environment(tmp_path, monkeypatch):
    (tmp_path / "no_loader_env.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="has no load_environment"):
        load_environment("no-loader-env")


def test_top_level_api():
    assert vf_rl.load_environment is load_environment
    assert vf_rl.RLConfig.__name__ == "RLConfig" and vf_rl.RLTrainer.__name__ == "RLTrainer"


def test_xml_parser_takes_last_block_and_unclosed_tag():
    parser = XMLParser(["think", "answer"], answer_field="answer")
    parsed = parser.parse("<think>hm</think><answer>1</answer> <answer> 2 </answer>")
    assert parsed.think == "hm" and parsed.answer == "2"
    assert parser.parse_answer([{"role": "assistant", "content": "<answer>cut off"}]) == "cut off"
    assert parser.parse_answer([{"role": "user", "content": "<answer>no</answer>"}]) is None
    fmt = parser.get_format_reward_func()
    assert fmt(completion=[{"role": "assistant", "content": "<think>a</think>"}]) == 0.5


def test_rubric_weights_sync_and_async_and_kwargs():
    seen = {}

    def exact(completion, answer) -> float:  # no **kwargs: only asked-for arguments are passed
        return float(completion[-1]["content"] == answer)

    async def uses_all(**kwargs) -> float:
        seen.update(kwargs)
        return 0.5

    rubric = Rubric(funcs=[exact, uses_all], weights=[1.0, 2.0])
    reward, per_func = asyncio.run(rubric.score(prompt=[], completion=[{"role": "assistant", "content": "x"}],
                                                answer="x", task="t"))
    assert reward == pytest.approx(2.0)
    assert per_func == {"exact": 1.0, "uses_all": 0.5}
    assert {"prompt", "completion", "answer", "state", "info", "task", "parser"} <= set(seen)
    with pytest.raises(ValueError):
        Rubric(funcs=[exact], weights=[1.0, 2.0])


@pytest.fixture(scope="module")
def reverse_env():
    return load_environment("primeintellect/reverse-text", few_shot=2, source="offline")


def test_reverse_text_dataset_shape(reverse_env):
    ds = reverse_env.get_dataset()
    assert len(ds) == 2000 and len(reverse_env.get_eval_dataset()) == 200
    row = ds[0]
    assert row["answer"] == row["question"][::-1]
    prompt = row["prompt"]
    assert prompt[0]["role"] == "system" and "<reversed_text>" in prompt[0]["content"]
    assert [m["role"] for m in prompt[1:]] == ["user", "assistant", "user", "assistant", "user"]
    assert prompt[-1]["content"] == row["question"]
    assert "<reversed_text>" in prompt[2]["content"]


def test_reverse_text_rewards(reverse_env):
    score = lambda text, answer: asyncio.run(reverse_env.rubric.score(  # noqa: E731
        prompt=[], completion=[{"role": "assistant", "content": text}], answer=answer))[0]
    assert score("<reversed_text>olleh</reversed_text>", "olleh") == 1.0
    assert score("olleh", "olleh") == 0.0  # no tags: no answer
    assert 0.0 < score("<reversed_text>olle</reversed_text>", "olleh") < 1.0
    assert score("<reversed_text>xyz</reversed_text>", "olleh") == 0.0


def test_reverse_text_falls_back_offline_when_hub_unreachable(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    env = load_environment("reverse-text")  # source="auto"
    assert len(env.get_dataset()) == 2000
    with pytest.raises(Exception):
        load_environment("reverse-text", source="hub", dataset_name="PrimeIntellect/Reverse-Text-RL-not-cached")


def test_reverse_text_bad_args():
    with pytest.raises(ValueError, match="few_shot"):
        load_environment("reverse-text", few_shot=9, source="offline")
    with pytest.raises(ValueError, match="source"):
        load_environment("reverse-text", source="internet")


def test_environment_needs_a_dataset():
    with pytest.raises(ValueError, match="dataset"):
        SingleTurnEnv()


def test_auto_source_falls_back_fast_when_the_hub_is_unreachable(monkeypatch, caplog):
    """With the hub unreachable, ``source = "auto"`` goes to the offline data after one quick
    check (the warning says so), without entering ``datasets``' retry loop."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with caplog.at_level("WARNING"):
        env = load_environment("reverse-text")  # source="auto"
    assert len(env.get_dataset()) == 2000
    assert "reverse-text: the hub is unreachable; using the offline data" in caplog.text


@pytest.mark.parametrize("column, value", [("prompt", "abc"), ("question", "abc"),
                                           ("prompt", [{"role": "user", "content": "abc"}])])
def test_every_prompt_shape_becomes_chat_messages(column, value):
    """A plain-string ``prompt`` (verifiers reads it as the question), ``question``, or ready
    messages: rows train and evaluate as chat messages; a string gets the system prompt and
    few-shot turns as a question does; ready messages get the system prompt only (verifiers)."""
    from datasets import Dataset

    few_shot = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    env = SingleTurnEnv(dataset=Dataset.from_list([{column: value, "answer": "cba"}]), system_prompt="sys",
                        few_shot=few_shot)
    prompt = env.get_dataset()[0]["prompt"]
    if isinstance(value, list):
        assert prompt == [{"role": "system", "content": "sys"}, *value]
    else:
        assert prompt == [{"role": "system", "content": "sys"}, *few_shot, {"role": "user", "content": "abc"}]


def test_prompt_rows_take_string_prompts(model_dir):
    """Rows an adapted environment hands over with a plain-string prompt are templated as one
    user message (the trainer's prompt filter and batches)."""
    from transformers import AutoTokenizer

    from vf_rl.orchestrator.samples import prompt_rows

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = prompt_rows([{"prompt": "reverse me", "answer": "em esrever"}], tokenizer, 512)
    assert rows[0]["prompt"] == [{"role": "user", "content": "reverse me"}] and rows[0]["row_id"] == 0
