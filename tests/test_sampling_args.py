"""Sampling arguments: what the user set > the environment's own defaults > vf-rl's built-in
defaults, on both ways in (TOML and Python), against a real server, and the temperature the
trainer's log-probs use."""

from __future__ import annotations

import pytest
from conftest import write_cpu_config
from datasets import Dataset

from vf_rl import RLConfig
from vf_rl.config.rl_config import resolve_temperature
from vf_rl.config.schema import load_config
from vf_rl.env_api import SingleTurnEnv, load_environment
from vf_rl.env_api.environment import merge_sampling_args
from vf_rl.env_api.mixture import EnvMixture

ENV_DEFAULTS = {"max_tokens": 7, "top_p": 0.5, "extra_body": {"min_p": 0.2, "top_k": 20}}


def args(**kwargs):
    return RLConfig(output_dir="/tmp/unused", use_cpu=True, batch_size=4, rollouts_per_example=2, micro_batch_size=2,
                    max_seq_len=256, report_to="none", **kwargs)


def test_environment_defaults_replace_built_in_ones_but_not_the_users():
    merged = merge_sampling_args(ENV_DEFAULTS, args(top_p=0.9).sampling_args())
    assert merged["max_tokens"] == 7  # the environment's, over the built-in max_seq_len
    assert merged["top_p"] == 0.9  # set by the user
    assert merged["temperature"] == 1.0
    assert merged["extra_body"] == {"min_p": 0.2, "top_k": 20, "repetition_penalty": 1.0}
    merged = merge_sampling_args(ENV_DEFAULTS, args(max_tokens=5, min_p=0.05, top_k=3).sampling_args())
    assert merged["max_tokens"] == 5 and merged["extra_body"]["min_p"] == 0.05 and merged["extra_body"]["top_k"] == 3
    # a plain dict (vf-eval, tests) counts as set by the user
    assert merge_sampling_args(ENV_DEFAULTS, {"max_tokens": 9})["max_tokens"] == 9


def test_toml_keys_count_as_set(tmp_path, model_dir):
    path = write_cpu_config(tmp_path / "c.toml", model_dir, tmp_path / "out", 8123, top_p=0.9, rollouts_per_example=2,
                            batch_size=4, micro_batch_size=2)
    config = load_config(path)
    merged = merge_sampling_args(ENV_DEFAULTS, RLConfig(**config.trainer.args, use_cpu=True).sampling_args())
    assert (merged["max_tokens"], merged["top_p"]) == (7, 0.9)


def test_environment_temperature_is_the_trainers_unless_set():
    env = load_environment("reverse-text", source="offline", num_train_examples=4)
    env.sampling_args = {"temperature": 0.7}
    a = args()
    resolve_temperature(a, env)
    assert a.temperature == 0.7
    b = args(temperature=1.0)
    resolve_temperature(b, env)
    assert b.temperature == 1.0
    other = load_environment("reverse-text", source="offline", num_train_examples=4)
    other.sampling_args = {"temperature": 0.9}
    with pytest.raises(ValueError, match=r"different temperatures \(\[0.7, 0.9\]\); set trainer.args.temperature"):
        resolve_temperature(args(), EnvMixture({"a": env, "b": other}, {"a": 1.0, "b": 1.0}))


@pytest.mark.server
def test_environment_max_tokens_applies_against_the_server(server):
    """An environment that asks for 3 tokens gets 3 when the user set no max_tokens, and the
    user's 6 when they did."""
    import asyncio

    from openai import AsyncOpenAI

    env = SingleTurnEnv(dataset=Dataset.from_list([{"question": "Write a long story about a cat.", "answer": ""}]),
                        sampling_args={"max_tokens": 3})
    async def generate(sampling_args):
        client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")  # one per event loop
        return await env.generate(client, server.model, [env.get_dataset()[0]], 4, sampling_args)

    for given, limit in ((args(), 3), (args(max_tokens=6), 6)):
        rollouts = asyncio.run(generate(given.sampling_args()))
        assert all(r.error is None for r in rollouts), [r.error for r in rollouts]
        assert max(len(r.turns[0].completion_ids) for r in rollouts) == limit
