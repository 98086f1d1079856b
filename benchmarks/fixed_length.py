"""A benchmark environment whose every rollout samples exactly ``max_tokens`` tokens: a built-in
environment (``base``, default reverse-text) with vLLM's ``ignore_eos`` in its sampling arguments, so
that a step's generated and trained tokens are the same on every side of a throughput benchmark
(``benchmarks/learning.py --env fixed-length``; TRL's side passes the same flag to vLLM's
``SamplingParams`` through ``GRPOConfig.generation_kwargs``). Its id, ``fixed_length``, is found on
``PYTHONPATH`` (``learning.py`` puts this folder there for both sides).

Rewards are the base environment's (near 0 for a random-weight model: the point is the tokens).
"""

from __future__ import annotations

from vf_rl import load_environment as load_builtin

SAMPLING = {"ignore_eos": True}
"""The vLLM sampling extension (``extra_body``) that makes every completion run to ``max_tokens``."""


def load_environment(base: str = "reverse-text", **args):
    """The environment ``base`` built with ``args``, every rollout sampled to ``max_tokens``.

    Raises:
        ValueError: ``base`` is no environment (as :func:`vf_rl.load_environment`)."""
    env = load_builtin(base, **args)
    extra = {**(env.sampling_args.get("extra_body") or {}), **SAMPLING}
    env.sampling_args = {**env.sampling_args, "extra_body": extra}
    return env
