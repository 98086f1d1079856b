"""Every dataset shape verifiers accepts trains the same in vf-rl's own environments and in
classic verifiers environments: ``prompt`` as a string or as messages (with or without a system
prompt), ``question`` with a system prompt and few-shot turns, ``info`` as a dict or as JSON
text, a ``task`` column. Each shape is rolled out against the real server; the prompt the
model saw and the ``info`` the reward function got are checked."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from conftest import assert_rollouts_well_formed

SYSTEM = "You answer in one word."
FEW_SHOT = [{"role": "user", "content": "Say one."}, {"role": "assistant", "content": "one"}]
USER = {"role": "user", "content": "Say hi."}

# (row, environment keyword arguments, the prompt the model must see)
SHAPES = {
    "prompt string": ({"prompt": "Say hi."}, {}, [USER]),
    "prompt messages": ({"prompt": [USER]}, {}, [USER]),
    "prompt messages + system_prompt": ({"prompt": [USER]}, {"system_prompt": SYSTEM},
                                        [{"role": "system", "content": SYSTEM}, USER]),
    "prompt opening with a system message": (
        {"prompt": [{"role": "system", "content": "Be brief."}, USER]}, {"system_prompt": SYSTEM},
        [{"role": "system", "content": "Be brief."}, USER]),
    "question + system_prompt + few_shot": ({"question": "Say hi."}, {"system_prompt": SYSTEM, "few_shot": FEW_SHOT},
                                            [{"role": "system", "content": SYSTEM}, *FEW_SHOT, USER]),
    "info as JSON text, task": ({"question": "Say hi.", "info": json.dumps({"k": 1}), "task": "greet"}, {}, [USER]),
}


def info_reward(info, **kwargs) -> float:
    """1.0 when the reward function got the row's info as a dict with k = 1 (0.5 without info)."""
    return float(info.get("k", 0.5)) if isinstance(info, dict) else -1.0


def rows_of(row: dict) -> list[dict]:
    return [{"answer": "hi", "info": {"k": 1}, **row}]


def builtin_env(row: dict, kwargs: dict):
    from datasets import Dataset

    from vf_rl.env_api import Rubric, SingleTurnEnv

    return SingleTurnEnv(dataset=Dataset.from_list(rows_of(row)), rubric=Rubric(funcs=[info_reward]), **kwargs)


def classic_env(row: dict, kwargs: dict):
    import verifiers as vf
    from datasets import Dataset

    from vf_rl.env_api.verifiers_adapter import VerifiersEnvironment

    return VerifiersEnvironment(vf.SingleTurnEnv(dataset=Dataset.from_list(rows_of(row)),
                                                 rubric=vf.Rubric(funcs=[info_reward]), **kwargs))


@pytest.mark.server
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("make", [builtin_env, pytest.param(classic_env, marks=pytest.mark.classic)],
                         ids=["vf-rl", "verifiers-classic"])
def test_each_shape_rolls_out_with_its_prompt_and_info(server, shape, make):
    from openai import AsyncOpenAI

    row, kwargs, expected = SHAPES[shape]
    env = make(row, kwargs)
    rows = [dict(r) for r in env.get_dataset()]

    async def run():
        client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
        try:
            return await env.generate(client, server.model, rows, 2, {"max_tokens": 3, "temperature": 1.0})
        finally:
            await client.close()

    rollouts = asyncio.run(run())
    assert_rollouts_well_formed(rollouts, max_turns=1)
    for r in rollouts:
        assert [{"role": m["role"], "content": m["content"]} for m in r.prompt] == expected
        assert r.info == {"k": 1} and r.reward == 1.0


@pytest.mark.server
@pytest.mark.classic
def test_vf_eval_on_a_classic_environment_with_string_prompts(server, tmp_path):
    """A published-style environment module whose dataset has a plain-string ``prompt`` column
    and JSON-text ``info``: vf-eval scores it (verifiers wraps the string as a user message)."""
    (tmp_path / "string_prompts.py").write_text(
        "import json\nimport verifiers as vf\nfrom datasets import Dataset\n\n"
        "def load_environment():\n"
        "    ds = Dataset.from_list([{'prompt': f'Say {w}.', 'answer': w, 'info': json.dumps({'k': 1})}\n"
        "                            for w in ('hi', 'yo')])\n"
        "    return vf.SingleTurnEnv(dataset=ds, rubric=vf.Rubric(funcs=[lambda info, **kw: float(info['k'])]))\n")
    out = tmp_path / "eval.jsonl"
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.eval", "string_prompts", "-m", server.model, "-n", "2",
                             "-r", "2", "-t", "4", "--base-url", f"{server.base_url}/v1", "-o", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 and all(r["error"] is None and r["reward"] == 1.0 for r in records)
    assert records[0]["prompt"] == [{"role": "user", "content": "Say hi."}]


@pytest.mark.server
@pytest.mark.classic
def test_classic_reward_functions_get_the_rows_other_columns(server):
    """verifiers hands a row's other columns to reward functions by name (a published
    environment's ``reward_fn(completion, f_str, is_elementary, **_)``)."""
    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI

    from vf_rl.env_api.verifiers_adapter import VerifiersEnvironment

    def by_columns(completion, target, weight, **kwargs) -> float:
        return weight if target == "hi" else -1.0

    ds = Dataset.from_list([{"question": "Say hi.", "target": "hi", "weight": 0.75}])
    env = VerifiersEnvironment(vf.SingleTurnEnv(dataset=ds, rubric=vf.Rubric(funcs=[by_columns])))

    async def run():
        client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
        try:
            return await env.generate(client, server.model, [dict(r) for r in env.get_dataset()], 2,
                                      {"max_tokens": 3})
        finally:
            await client.close()

    rollouts = asyncio.run(run())
    assert [(r.error, r.reward) for r in rollouts] == [(None, 0.75)] * 2
