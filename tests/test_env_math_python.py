"""The math-python environment: the sandboxed python tool, rewards, data, and a real server run."""

from __future__ import annotations

import asyncio
import os

import pytest
from conftest import assert_rollouts_well_formed

import vf_rl
from vf_rl.environments import math_python
from vf_rl.environments.math_python import run_python

FORCE_PYTHON = {"type": "function", "function": {"name": "python"}}


@pytest.fixture(scope="module")
def env():
    return vf_rl.load_environment("primeintellect/math-python", source="offline")


def test_python_tool_runs_code():
    assert run_python("print(2+3)") == "5"
    assert run_python("x = 1") == "(no output)"
    assert "ZeroDivisionError" in run_python("print('before')\n1/0")
    assert run_python("print('before')\n1/0").startswith("before")


def test_python_tool_runs_in_another_process_with_empty_env_and_temp_dir():
    pid, cwd, home = run_python("import os; print(os.getpid()); print(os.getcwd()); print(os.environ.get('HOME'))").split("\n")
    assert int(pid) != os.getpid()
    assert os.path.basename(cwd) == "work" and not os.path.exists(cwd)  # the temporary directory is gone
    assert home == "None"


def test_python_tool_time_limit():
    out = run_python("while True:\n    pass", timeout=2)
    assert "timed out after 2 s" in out


def test_python_tool_memory_limit():
    out = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')")
    assert "MemoryError" in out and "allocated" not in out


def test_python_tool_blocks_sockets():
    assert "network access is disabled" in run_python("import socket\nsocket.socket()")
    assert "network access is disabled" in run_python("import socket\nsocket.create_connection(('127.0.0.1', 80))")


def test_python_tool_truncates_output():
    out = run_python("print('x' * 100000)", max_output_chars=100)
    assert out.startswith("x" * 100) and "output truncated" in out and len(out) < 200
    with pytest.raises(ValueError, match="positive"):
        run_python("print(1)", timeout=0)


def test_tool_schema_and_call(env):
    (schema,) = env.tool_schemas
    assert schema["function"]["name"] == "python"
    assert schema["function"]["parameters"]["required"] == ["code"]
    assert schema["function"]["strict"] is True  # vLLM then pins forced calls' arguments to the schema
    assert asyncio.run(env.call_tool("python", '{"code": "print(6*7)"}')) == "42"


def test_dataset_and_rewards(env):
    assert len(env.get_dataset()) == 200 and len(env.get_eval_dataset()) == 50
    row = env.get_dataset()[0]
    assert row["prompt"][0]["role"] == "system" and "python" in row["prompt"][0]["content"]
    completion = [{"role": "assistant", "content": "", "tool_calls": [
                      {"id": "1", "type": "function", "function": {"name": "python", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "1", "content": "42"},
                  {"role": "assistant", "content": "So the answer is \\boxed{42}."}]
    reward, metrics = asyncio.run(env.rubric.score(prompt=[], completion=completion, answer="42"))
    assert reward == 1.0 and metrics["num_tool_calls"] == 1.0
    completion[-1]["content"] = "\\boxed{41}"
    assert asyncio.run(env.rubric.score(prompt=[], completion=completion, answer="42"))[0] == 0.0


def test_offline_fallback_and_bad_args(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert len(math_python.load_environment().get_dataset()) == 200  # source="auto"
    with pytest.raises(ValueError, match="needs the hub"):
        math_python.load_environment(dataset_name="PrimeIntellect/INTELLECT-3-RL", dataset_subset="math")
    with pytest.raises(ValueError, match="source"):
        math_python.load_environment(source="internet")
    with pytest.raises(ValueError, match="max_turns"):
        math_python.load_environment(source="offline", max_turns=0)
    with pytest.raises(ValueError, match="memory_mb"):
        math_python.load_environment(source="offline", memory_mb=1)


@pytest.mark.server
def test_generate_against_server(server, env):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x")
    rows = [env.get_eval_dataset()[0]]
    args = {"max_tokens": 64, "temperature": 1.0}
    forced = math_python.load_environment(source="offline", tool_choice=FORCE_PYTHON, max_turns=2)
    # The forced call: vLLM pins the output to {"code": "..."}, but at temperature 1 the 135M
    # model fills the string with prose until max_tokens cuts the call off (the rollout then
    # ends truncated after one turn). A simple question, greedy decoding and more tokens keep
    # the code short, so the tool really runs.
    simple = {"prompt": [forced.get_dataset()[0]["prompt"][0],
                         {"role": "user", "content": "What is 17 * 23? Use python to print(17 * 23)."}],
              "answer": "391", "info": {}, "task": "math-python"}
    forced_args = {"max_tokens": 128, "temperature": 0.0}

    async def both():  # one event loop: the client's connections belong to it
        return (await env.generate(client, server.model, rows, 2, args)
                + await forced.generate(client, server.model, [simple], 2, forced_args))

    rollouts = asyncio.run(both())
    assert_rollouts_well_formed(rollouts)
    for r in rollouts[2:]:  # forced tool calls: call, tool result, call (max_turns=2)
        assert len(r.turns) == 2, r.completion
        assert r.completion[0]["role"] == "assistant" and r.completion[0]["tool_calls"], r.completion
        assert r.completion[0]["tool_calls"][0]["function"]["name"] == "python"
        assert r.completion[1]["role"] == "tool" and r.completion[1]["content"]
        assert r.completion[1]["content"] == asyncio.run(forced.call_tool(
            "python", r.completion[0]["tool_calls"][0]["function"]["arguments"]))
        assert r.completion[1]["tool_call_id"] == r.completion[0]["tool_calls"][0]["id"]
