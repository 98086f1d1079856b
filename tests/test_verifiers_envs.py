"""Environments written for the real `verifiers` package, loaded by id and trained unchanged:
the classic API (0.2.1-0.3.x) through its own `run_group`, the v1 API (`verifiers.v1`) through its
own `Env.serving`/`run_slot` with verifiers' train client; rows, token ids and sampling log-probs,
rewards per reward function, errors, and the built-in twin agreeing on rewards.

The environment modules in tests/verifiers_envs/ use only `verifiers` (`import verifiers as vf`,
`import verifiers.v1 as vf`), `datasets` and `openai`. The package is required, not skipped: the
set-up installs verifiers 0.4 (the v1 API), and the tests marked ``classic`` run in a second pass
with 0.3.1 from the overlay `vf-rl install-verifiers-classic --target .venv/verifiers-classic`
makes (scripts/test.sh).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_rollouts_well_formed, free_port, run_vf_eval, write_cpu_config

from vf_rl.env_api import load_environment
from vf_rl.env_api.registry import find_environment
from vf_rl.env_api.verifiers_adapter import (
    VerifiersEnvironment,
    VerifiersError,
    check_console_scripts,
    check_supported,
    verifiers_api,
)
from vf_rl.env_api.verifiers_v1 import VerifiersV1Environment
from vf_rl.orchestrator.samples import rollout_to_samples

ENVS = Path(__file__).resolve().parent / "verifiers_envs"


@pytest.fixture
def vf_envs_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.classic
def test_verifiers_modules_load_by_id(vf_envs_on_path):
    env = load_environment("someone/vfx-reverse-text")
    assert isinstance(env, VerifiersEnvironment) and env.api == "classic"
    row = env.get_dataset()[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert row["answer"] == row["question"][::-1]
    guess = load_environment("vfx-guess-number", num_examples=4)
    assert len(guess.get_dataset()) == 4 and guess.get_dataset()[0]["info"]["low"] == 1
    assert type(load_environment("vfx_calculator").env).__name__ == "ToolEnv"
    # vf-rl's stop condition for cut turns is added once, unless the environment opts out
    from vf_rl.env_api.verifiers_adapter import turn_truncated

    assert guess.env._stop_conditions.count(turn_truncated) == 1
    assert VerifiersEnvironment(guess.env).env._stop_conditions.count(turn_truncated) == 1
    import vfx_guess_number

    raw = vfx_guess_number.load_environment(num_examples=2)
    raw.stop_on_truncated_turn = False
    assert turn_truncated not in VerifiersEnvironment(raw).env._stop_conditions


def test_v1_plugin_loads_by_id(vf_envs_on_path):
    """A v1 taskset package (no load_environment; `__all__` exports its Taskset and Harness) is
    built by verifiers' own loader; `[env.args]` is verifiers' `[env]` table."""
    env = load_environment("someone/vfx-reverse-text-v1", taskset={"num_tasks": 4, "few_shot": 1})
    assert isinstance(env, VerifiersV1Environment) and env.api == "v1"
    assert type(env.env).__name__ == "SingleAgentEnv" and type(env.env.taskset).__name__ == "ReverseTextTaskset"
    assert env.env.config.agent.runtime.type == "subprocess"  # not verifiers' remote default
    rows = env.get_dataset()
    assert len(rows) == 4 and [r["example_id"] for r in rows] == [0, 1, 2, 3]
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user", "assistant", "user"]
    assert rows[1]["answer"] == rows[1]["prompt"][-1]["content"][::-1]
    assert env.get_eval_dataset(2) == rows[:2]


def test_versions_and_untrainable_v1_features_are_refused(vf_envs_on_path):
    for api, version in (("classic", "0.1.14"), ("classic", "0.4.0"), ("v1", "0.3.0"), ("v1", "0.5.0")):
        with pytest.raises(VerifiersError, match=f"verifiers {version} is not supported"):
            check_supported(api, version)
    for api, version in (("classic", "0.2.1"), ("classic", "0.3.1"), ("v1", "0.3.1"), ("v1", "0.4.0")):
        check_supported(api, version)

    import verifiers.v1 as v1

    class Tasks(v1.Taskset):
        def load(self):
            return []

    assert verifiers_api(Tasks(v1.TasksetConfig())) == "v1"
    with pytest.raises(VerifiersError, match="is a verifiers v1 object"):
        VerifiersEnvironment(Tasks(v1.TasksetConfig()))
    with pytest.raises(VerifiersError, match="not an Env: export the Taskset"):
        VerifiersV1Environment(Tasks(v1.TasksetConfig()))
    # an agent of the trained model that calls the model through a relay (no token ids)
    relay = {"agent": {"client": {"type": "eval", "base_url": "http://127.0.0.1:1/v1"}}}
    with pytest.raises(VerifiersError, match="agent role 'agent' pins its own client .*carry no token ids") as err:
        load_environment("vfx-reverse-text-v1", **relay)
    assert "\n" not in str(err.value)
    with pytest.raises(VerifiersError, match=r"vfx_reverse_text_v1 \(verifiers v1\): taskset.num_tasks: Input should be"):
        load_environment("vfx-reverse-text-v1", taskset={"num_tasks": "many"})


def test_v1_serving_is_shared_by_concurrent_generates():
    """The orchestrator runs several `generate` calls at once (servers, batches ahead): they share
    one `env.serving()`, entered by the first and left by the last."""
    import contextlib

    events = []

    class FakeEnv:
        @contextlib.asynccontextmanager
        async def serving(self):
            events.append("enter")
            await asyncio.sleep(0.01)
            yield
            events.append("exit")

    env = VerifiersV1Environment.__new__(VerifiersV1Environment)
    env.env, env._serving_state, env._serving_users = FakeEnv(), None, 0

    async def one(delay):
        async with env._serving():
            events.append("run")
            await asyncio.sleep(delay)

    async def main():
        await asyncio.gather(one(0.05), one(0.01), one(0.03))
        await one(0.0)  # after all left: a fresh serving

    asyncio.run(main())
    assert events == ["enter", "run", "run", "run", "exit", "enter", "run", "exit"]


@pytest.mark.parametrize("command", ["vf-rl --dry-run", "vf-train"])
def test_untrainable_v1_feature_exits_2_in_one_line(model_dir, tmp_path, vf_envs_on_path, command):
    """The refusal reaches the user as one line and exit status 2, before anything starts."""
    config = write_cpu_config(tmp_path / "relay.toml", model_dir, tmp_path / "run", free_port(),
                              env_id="vfx-reverse-text-v1",
                              env_args={"agent": {"client": {"type": "eval", "base_url": "http://127.0.0.1:1/v1"}}})
    module = "vf_rl.launcher.main" if command.startswith("vf-rl") else "vf_rl.trainer.cli"
    argv = [sys.executable, "-m", module, "@", str(config), *(["--dry-run"] if "dry" in command else [])]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "agent role 'agent' pins its own client" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_env_id_precedence_and_error(tmp_path, monkeypatch):
    assert find_environment("primeintellect/reverse-text") == ("vf_rl.environments.reverse_text", "built-in")
    (tmp_path / "reverse_text.py").write_text("def load_environment(**kw):\n    return 'from cwd'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_environment puts the cwd on it
    monkeypatch.delitem(sys.modules, "reverse_text", raising=False)
    assert find_environment("reverse-text") == ("reverse_text", "cwd")  # console scripts do not put cwd on sys.path
    try:
        assert load_environment("reverse-text") == "from cwd"
    finally:  # later tests must get the built-in again
        sys.modules.pop("reverse_text", None)
    with pytest.raises(ValueError) as err:
        find_environment("owner/no-such-env")
    assert "tried module 'no_such_env' on sys.path" in str(err.value) and "built-in environments: " in str(err.value)


def test_console_script_shadowing_is_reported(tmp_path):
    """verifiers 0.2-0.4's own ``vf-eval`` is not a name of ours; 0.1.x's ``vf-rl`` is."""
    (tmp_path / "vf-rl").write_text("from vf_rl.launcher.main import main\n")
    (tmp_path / "vf-eval").write_text("from verifiers.v1.cli.eval import main\n")
    assert check_console_scripts(tmp_path) is None
    (tmp_path / "vf-train").write_text("from verifiers.rl.scripts.train import main\n")
    message = check_console_scripts(tmp_path)
    assert message.startswith("vf-train in") and "force-reinstall" in message
    bin_dir = Path(sys.executable).parent  # the test venv holds verifiers 0.4 beside vf-rl: nothing shadowed
    assert check_console_scripts(bin_dir) is None, check_console_scripts(bin_dir)


@pytest.mark.classic
def test_builtin_reverse_text_twin_gives_the_same_reward(vf_envs_on_path):
    """The same completions get the same reward from the verifiers-written reverse-text (its
    real XMLParser and reward function) and from vf-rl's built-in reverse-text."""
    from vf_rl.environments.reverse_text import load_environment as builtin_reverse_text

    def reward_funcs(rubric):
        for child in getattr(rubric, "rubrics", None) or []:
            yield from reward_funcs(child)
        yield from getattr(rubric, "funcs", None) or []

    theirs_func = next(f for f in reward_funcs(load_environment("vfx-reverse-text").env.rubric)
                       if f.__name__ == "lcs_reward_func")
    ours = builtin_reverse_text(source="offline").rubric
    answer = "egdirb wodniw nomel"
    for text in ["<reversed_text>egdirb wodniw nomel</reversed_text>", "<reversed_text>\negdirb wdniw\n</reversed_text>",
                 "no tags at all",
                 "<think>hm</think>\n<reversed_text>lemon</reversed_text>"]:
        completion = [{"role": "assistant", "content": text}]
        expected = asyncio.run(theirs_func(completion=completion, answer=answer, state={}))
        assert asyncio.run(ours.score(prompt=[], completion=completion, answer=answer))[0] == pytest.approx(expected)
    # the known differences of vf-rl's XMLParser: an unclosed tag (a truncated reply) scores 0 in
    # verifiers; of two blocks in one message verifiers reads the first, vf-rl the last
    for text in ["<reversed_text>egdirb wod", "<reversed_text>x</reversed_text> <reversed_text>egdirb</reversed_text>"]:
        completion = [{"role": "assistant", "content": text}]
        assert asyncio.run(theirs_func(completion=completion, answer=answer, state={})) == 0.0
        assert asyncio.run(ours.score(prompt=[], completion=completion, answer=answer))[0] > 0.0


@pytest.mark.classic
@pytest.mark.server
def test_verifiers_rollouts_against_real_server(server, vf_envs_on_path):
    from openai import AsyncOpenAI

    from vf_rl.environments.reverse_text import load_environment as builtin_reverse_text

    def generate(env, rows, r, sampling):
        """env.generate on a client of its own event loop (an AsyncOpenAI's connections belong to
        the loop that opened them)."""
        async def run():
            client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
            try:
                return await env.generate(client, server.model, rows, r, sampling)
            finally:
                await client.close()
        return asyncio.run(run())

    sampling = {"max_tokens": 24, "temperature": 1.0}

    # single-turn: token ids and log-probs per turn; our built-in twin gives the same reward
    env = load_environment("vfx-reverse-text")
    rows = [env.get_dataset()[i] for i in range(2)]
    rollouts = generate(env, rows, 4, sampling)
    assert len(rollouts) == 8 and [r.example_id for r in rollouts] == [0] * 4 + [1] * 4
    assert_rollouts_well_formed(rollouts, max_turns=1)
    twin = builtin_reverse_text(source="offline", few_shot=2)
    agree = differ = 0
    for r in rollouts:
        assert set(r.metrics) == {"lcs_reward_func", "num_turns"} and r.reward == pytest.approx(r.metrics["lcs_reward_func"])
        ours, _ = asyncio.run(twin.rubric.score(prompt=r.prompt, completion=r.completion, answer=r.answer))
        if r.completion[-1]["content"].count("</reversed_text>") == 1:
            assert ours == pytest.approx(r.reward, abs=1e-12)
            agree += 1
        else:  # known differences (unclosed tag, several blocks): see the test above
            differ += ours != r.reward
    print(f"reverse-text: {agree} closed-tag rollouts agree; {differ} others differ;",
          [round(r.reward, 3) for r in rollouts])

    # a reward function that raises: counted as the rollout's error, the others go on
    raising = load_environment("vfx-reverse-text", raise_in_reward=True)
    rows = [raising.get_dataset()[i] for i in (0, 2)]  # texts of 19 (odd) and 16 (even) characters
    rollouts = generate(raising, rows, 2, sampling)
    assert all("reward function lcs_reward_func raised RuntimeError: odd-length text" in (r.error or "")
               for r in rollouts[:2]), [(r.error, r.reward, r.metrics) for r in rollouts]
    assert all(r.reward == 0.0 and r.error_kind == "reward" for r in rollouts[:2])
    assert_rollouts_well_formed(rollouts[2:], max_turns=1)

    # a request the server refuses: a model error that carries the server's own answer (verifiers
    # records it as a ModelError whose message is "ModelError")
    refused = generate(env, rows[:1], 2, {"max_tokens": 24, "temperature": -1.0})
    assert all(r.error_kind == "model" and r.error.startswith("ModelError (caused by ") and "temperature" in r.error
               for r in refused), [r.error for r in refused]

    # multi-turn: a @vf.stop condition, per-example info; turns extend one another
    guess = load_environment("vfx-guess-number", num_examples=2, max_turns=3)
    rows = [guess.get_dataset()[i] for i in range(2)]
    # 64 tokens a turn: a first turn cut at 24 ends the rollout, and one run in many had all 8 cut there. Unseeded
    # on purpose: 57 of 80 rollouts (10 batches of 8) went past the first turn, so all 8 stop there about once in
    # 20,000 batches (0.29 ** 8); verifiers' classic API sends a row's rollouts as separate requests, which one seed
    # would make 4 copies of one rollout (measured: seeds 2, 3 and 42 leave a row's 4 all at one turn)
    rollouts = generate(guess, rows, 4, {"max_tokens": 64, "temperature": 1.0})
    assert_rollouts_well_formed(rollouts, max_turns=3, max_reward=1.2)
    assert all(set(r.metrics) == {"solved", "in_range", "num_turns"} for r in rollouts)
    assert any(len(r.turns) > 1 for r in rollouts), "no rollout went past the first turn"
    for r in rollouts:
        samples = rollout_to_samples(r.turns, 0.0, 4096)
        assert sum(sum(s.loss_mask) for s in samples) == sum(len(t.completion_ids) for t in r.turns)
    # a turn cut at max_tokens ends the rollout as truncated (the stop condition vf-rl adds): the cut
    # turn is the last (a turn that met the environment's stop string within 2 tokens was not cut,
    # and its rollout went on)
    cut = generate(guess, rows, 2, {"max_tokens": 2, "temperature": 1.0})
    assert any(r.is_truncated for r in cut)
    for r in cut:
        if r.is_truncated:
            assert r.state["stop_condition"] == "turn_truncated" and len(r.turns[-1].completion_ids) == 2, \
                (r.state, [t.completion_ids for t in r.turns])

    # tools: the environment's own tool loop and its tool-call metrics
    calc = load_environment("vfx-calculator")
    rows = [calc.get_dataset()[i] for i in range(2)]
    rollouts = generate(calc, rows, 2, {"max_tokens": 48, "temperature": 1.0})
    assert_rollouts_well_formed(rollouts, max_turns=3)
    assert all({"correct", "total_tool_calls", "add_calls"} <= set(r.metrics) for r in rollouts)


@pytest.mark.server
@pytest.mark.parametrize("env_id,env_args,metrics", [
    pytest.param("vfx-guess-number", {"max_turns": 2}, ["reward/solved", "reward/in_range"], marks=pytest.mark.classic),
    ("vfx-reverse-text-v1", {"agent": {"max_turns": 2}}, ["reward/lcs_reward", "reward/tagged"]),
], ids=["classic", "v1"])
def test_vf_eval_on_a_verifiers_env(server, tmp_path, vf_envs_on_path, env_id, env_args, metrics):
    out = tmp_path / "eval.jsonl"
    result = run_vf_eval(server, env_id, env_args, out)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert all(m in result.stdout for m in metrics), result.stdout[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 and all(r["completion"][0]["role"] == "assistant" for r in records)


@pytest.mark.server
@pytest.mark.classic
@pytest.mark.parametrize("env_id,env_args,metrics", [
    ("you/vfx-guess-number", {"num_examples": 8, "max_turns": 2}, {"reward/solved", "reward/in_range"}),
    ("vfx_calculator", {"max_turns": 2}, {"reward/correct", "reward/total_tool_calls", "reward/add_calls"}),
], ids=["multi-turn", "tools"])
def test_verifiers_env_trains_two_steps(server, model_dir, tmp_path, vf_envs_on_path, restore_base_weights,
                                        env_id, env_args, metrics):
    """`vf-train @ cfg`: two steps on a multi-turn and a tool environment of the real package; the
    environment's own reward functions are logged, and vLLM's sampling log-probs reach the loss
    (an importance ratio near 1 on the first steps; zeros or misaligned log-probs would not be)."""
    from test_algorithm import run_vf_train

    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "vfx.toml", model_dir, out, server.port, env_id=env_id,
                              env_args=env_args, run_name="vfx", micro_batch_size=8, rollouts_per_example=4,
                              batch_size=8, max_steps=2, max_tokens=16, save_steps=50)
    steps = run_vf_train(config, out)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert metrics <= set(r), sorted(r)
        assert r["tokens/loss"] > 0 and 0.5 < r["importance_ratio"] < 2.0, r


@pytest.mark.server
@pytest.mark.slow  # CI: a published classic package (alkahest) trains through vf-rl in test_published_envs.py
@pytest.mark.parametrize("env_id,env_args,reward", [
    pytest.param("you/vfx-reverse-text", {"few_shot": 2}, "reward/lcs_reward_func", marks=pytest.mark.classic),
    ("you/vfx-reverse-text-v1", {"taskset": {"few_shot": 2}}, "reward/lcs_reward"),
], ids=["classic", "v1"])
def test_verifiers_env_through_vf_rl(model_dir, tmp_path, vf_envs_on_path, env_id, env_args, reward):
    """`vf-rl @ config.toml` (real tmux, its own server) on an unchanged verifiers module."""
    out = tmp_path / "run"
    session = f"vf-rl-verifiers-{free_port()}"
    config = write_cpu_config(tmp_path / "vfx.toml", model_dir, out, free_port(), env_id=env_id,
                              env_args=env_args, inference_args={"enforce_eager": True, "max_model_len": 512},
                              run_name="vfx", micro_batch_size=8, rollouts_per_example=4, batch_size=8,
                              max_steps=2, max_tokens=16, save_steps=50)
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "-s", session, "--wait"],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path)
    log = out / "logs" / "trainer.log"
    assert result.returncode == 0, (result.stdout, result.stderr, log.read_text()[-3000:] if log.exists() else "")
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # the env's own reward function (often 0 for a 135M model in 16 tokens)
        assert 0 <= r[reward] <= 1 and r["tokens/loss"] > 0, r
        assert 0.5 < r["importance_ratio"] < 2.0, r


@pytest.mark.server
def test_v1_rollouts_against_real_server(server, vf_envs_on_path):
    """v1 rollouts through verifiers' interception server and train client: one turn per sampled
    message with vLLM's token ids and sampling log-probs, the taskset's own reward and metric."""
    from openai import AsyncOpenAI

    env = load_environment("vfx-reverse-text-v1", taskset={"num_tasks": 2},
                           agent={"harness": {"id": "vfx-reverse-text-v1", "turns": 2}})

    async def run(env, rows, temperature=1.0):
        client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
        try:
            return await env.generate(client, server.model, rows, 3, {"max_tokens": 12, "temperature": temperature})
        finally:
            await client.close()

    rollouts = asyncio.run(run(env, env.get_dataset()))
    assert len(rollouts) == 6 and [r.example_id for r in rollouts] == [0] * 3 + [1] * 3
    assert_rollouts_well_formed(rollouts, max_turns=2)
    for r in rollouts:
        assert set(r.metrics) == {"lcs_reward", "tagged"} and r.reward == pytest.approx(r.metrics["lcs_reward"])
        assert len(r.turns) == 2 and r.state["stop_condition"] == "agent_completed"
        first, second = r.turns
        # the second call's prompt holds the whole first exchange (its tokens re-rendered when
        # the reply was cut at max_tokens, else the sampled tokens themselves)
        assert len(second.prompt_ids) > len(first.prompt_ids) + len(first.completion_ids) // 2
        samples = rollout_to_samples(r.turns, 0.0, 4096)
        assert sum(sum(s.loss_mask) for s in samples) == sum(len(t.completion_ids) for t in r.turns)
        assert all(lp <= 0.0 for t in r.turns for lp in t.completion_logprobs)

    # a reward that raises: that rollout's error (reward 0), the others go on
    raising = load_environment("vfx-reverse-text-v1", taskset={"num_tasks": 3, "task": {"raise_on_odd": True}})
    rows = [raising.get_dataset()[i] for i in (0, 2)]  # texts of 19 (odd) and 16 (even) characters
    rollouts = asyncio.run(run(raising, rows))
    assert all("odd-length text" in (r.error or "") and r.reward == 0.0 and r.error_kind == "reward"
               for r in rollouts[:3]), [(r.error, r.error_kind, r.reward) for r in rollouts]
    assert_rollouts_well_formed(rollouts[3:], max_turns=1)

    # a request the server refuses: a model error with the server's answer
    refused = asyncio.run(run(env, [env.get_dataset()[0]], temperature=-1.0))
    assert all(r.error_kind == "model" and "temperature" in r.error for r in refused), [r.error for r in refused]


@pytest.mark.server
def test_v1_env_trains_two_steps(server, model_dir, tmp_path, vf_envs_on_path, restore_base_weights):
    """`vf-train @ cfg` on the unchanged v1 module: its own reward and metric are logged, and
    vLLM's sampling log-probs reach the loss (importance ratio near 1)."""
    from test_algorithm import run_vf_train

    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "v1.toml", model_dir, out, server.port, env_id="someone/vfx-reverse-text-v1",
                              env_args={"taskset": {"few_shot": 2}}, run_name="vfx-v1", micro_batch_size=8,
                              rollouts_per_example=4, batch_size=8, max_steps=2, max_tokens=16, save_steps=50)
    steps = run_vf_train(config, out)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert {"reward/lcs_reward", "reward/tagged"} <= set(r), sorted(r)
        assert 0 <= r["reward/lcs_reward"] <= 1 and r["tokens/loss"] > 0, r
        assert 0.5 < r["importance_ratio"] < 2.0, r
