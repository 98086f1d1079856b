"""Failed rollouts explain themselves: each error keeps its message, its causes and its kind
(model server, tool, parser, reward function, timeout, environment code), counted as
``errors/<kind>``; a batch where every rollout failed ends ``vf-train`` with one line."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from conftest import free_port, write_cpu_config

from vf_rl.env_api import Parser, Rubric, SingleTurnEnv
from vf_rl.env_api.environment import Rollout, set_error
from vf_rl.env_api.errors import KINDS, RewardFunctionError, describe, kind_of, kind_of_names
from vf_rl.orchestrator.metrics import rollout_metrics


def refused_connection() -> Exception:
    """What a real OpenAI client raises when nothing listens on the port."""
    from openai import AsyncOpenAI

    async def call():
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="x", max_retries=0)
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        finally:
            await client.close()

    with pytest.raises(Exception) as info:
        asyncio.run(call())
    return info.value


def test_model_server_errors_keep_their_cause():
    exc = refused_connection()
    assert kind_of(exc) == "model"
    text = describe(exc)
    assert text.startswith("APIConnectionError: Connection error. (caused by ConnectError") and "refused" in text.lower()


def test_kinds_of_exceptions():
    assert kind_of(asyncio.TimeoutError()) == "timeout"
    assert describe(asyncio.TimeoutError()).startswith("TimeoutError: the rollout did not finish")
    assert kind_of(KeyError("x")) == "environment"
    try:
        try:
            raise OSError("disk full")
        except OSError as inner:
            raise ValueError("could not write the game state") from inner
    except ValueError as exc:
        assert describe(exc) == "ValueError: could not write the game state (caused by OSError: disk full)"
    # verifiers' exception names: the first one in the chain decides
    assert kind_of_names(["ModelError", "BadRequestError"]) == "model"
    assert kind_of_names(["ToolParseError"]) == "parser"
    assert kind_of_names(["ToolCallError", "ValueError"]) == "tool"
    assert kind_of_names(["TaskError"], "scoring: ValueError: bad") == "reward"
    assert kind_of_names(["TaskError"], "task setup: KeyError: 'x'") == "environment"
    assert kind_of_names(["ProviderError"], "timed out") == "model"
    assert kind_of_names(["SomethingElse"]) == "environment"


def test_reward_and_parser_errors_name_the_function():
    class BrokenParser(Parser):
        def parse_answer(self, completion):
            raise IndexError("no answer tag")

    def exact(completion, answer, **kwargs) -> float:
        return float(completion[-1]["content"] == answer)

    def tagged(completion, parser, **kwargs) -> float:
        return float(parser.parse_answer(completion) is not None)

    def boom(**kwargs) -> float:
        raise ZeroDivisionError("division by zero")

    completion = [{"role": "assistant", "content": "hi"}]
    for funcs, kind, text in (([exact, boom], "reward", "reward function boom raised ZeroDivisionError: division by zero"),
                              ([tagged], "parser", "reward function tagged raised IndexError: no answer tag")):
        rubric = Rubric(funcs=funcs, parser=BrokenParser())
        with pytest.raises(RewardFunctionError) as info:
            asyncio.run(rubric.score(prompt=[], completion=completion, answer="hi"))
        rollout = Rollout(example_id=0, prompt=[], reward=1.0)
        set_error(rollout, info.value)
        assert (rollout.error, rollout.error_kind, rollout.reward) == (text, kind, 0.0)


def test_error_metrics_count_each_kind():
    rollouts = [Rollout(example_id=i // 2, prompt=[], reward=1.0) for i in range(4)]
    assert "errors/model" not in rollout_metrics(rollouts, 2)  # no error: no per-kind keys
    rollouts[1].error, rollouts[1].error_kind = "APIConnectionError: Connection error.", "model"
    rollouts[3].error, rollouts[3].error_kind = "reward function f raised KeyError: 'x'", "reward"
    metrics = rollout_metrics(rollouts, 2)
    assert metrics["errors/rate"] == 0.5 and metrics["errors/model"] == metrics["errors/reward"] == 0.25
    assert all(metrics[f"errors/{k}"] == 0.0 for k in KINDS if k not in ("model", "reward"))


@pytest.mark.server
def test_a_batch_where_every_rollout_fails_ends_vf_train_in_one_line(server, model_dir, tmp_path):
    """A reward function that always raises: vf-train stops at batch 0 with exit 1 and one line
    naming the kind and the cause (no traceback)."""
    (tmp_path / "always_fails.py").write_text(
        "from datasets import Dataset\n"
        "from vf_rl.env_api import Rubric, SingleTurnEnv\n\n"
        "def needs_score(completion, info, **kwargs):\n"
        "    return info['score']\n\n"
        "def load_environment(**kwargs):\n"
        "    ds = Dataset.from_list([{'question': f'Say {w}.', 'answer': w} for w in ('hi', 'yo')])\n"
        "    return SingleTurnEnv(dataset=ds, rubric=Rubric(funcs=[needs_score]))\n")
    config = write_cpu_config(tmp_path / "fails.toml", model_dir, tmp_path / "run", server.port, env_id="always_fails",
                              env_args={}, batch_size=4, rollouts_per_example=2, micro_batch_size=4, max_steps=2,
                              max_tokens=4)
    result = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert ("vf-train: error: every rollout of batch 1 failed; the first (reward error): reward function needs_score "
            "raised KeyError: 'score'") in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def test_single_turn_env_on_a_closed_port_fails_every_rollout_as_model_errors():
    from datasets import Dataset
    from openai import AsyncOpenAI

    env = SingleTurnEnv(dataset=Dataset.from_list([{"question": "Say hi.", "answer": "hi"}]),
                        rubric=Rubric(funcs=[lambda completion, **kw: 1.0]))

    async def run():
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="x", max_retries=0)
        try:
            return await env.generate(client, "m", list(env.get_dataset()), 2, {"max_tokens": 4})
        finally:
            await client.close()

    rollouts = asyncio.run(run())
    assert [r.error_kind for r in rollouts] == ["model", "model"]
    assert all(r.error.startswith("APIConnectionError: Connection error. (caused by ") for r in rollouts)
    assert rollout_metrics(rollouts, 2)["errors/model"] == 1.0
