"""``vf-rl eval``: evaluate a model on an environment (the "baseline" step before training).

    vf-rl eval ENV_ID -m MODEL [-n N] [-r R] [-a JSON_ENV_ARGS] [-t MAX_TOKENS] [-T TEMPERATURE]
               [--base-url URL | --serve [--vllm-args "FLAGS"]] [-o rollouts.jsonl] [--split eval|train]

What it does, its options and its exit statuses are its help (``USAGE``, ``DESCRIPTION``,
``EPILOG``; ``vf-rl eval --help``). verifiers installs a ``vf-eval`` of its own, so this one is a
subcommand of ``vf-rl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_ALL_FAILED = 1


def rollout_record(r) -> dict:
    return {"example_id": r.example_id, "prompt": r.prompt, "completion": r.completion, "answer": r.answer,
            "reward": r.reward, "metrics": r.metrics, "error": r.error, "error_kind": r.error_kind,
            "truncated": r.is_truncated,
            "turns": len(r.turns), "completion_tokens": sum(len(t.completion_ids) for t in r.turns)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, extra: list[str], log: Path, timeout: float = 600.0) -> tuple[subprocess.Popen, str]:
    """Start vf-vllm for ``model`` on a free port; returns the process and its base URL.

    Raises:
        RuntimeError: the server exited or was not ready within ``timeout`` seconds.
    """
    from vf_rl.inference.client import wait_for_server

    port = _free_port()
    argv = [sys.executable, "-m", "vf_rl.inference.server", "--model", model, "--port", str(port), *extra]
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    if wait_for_server(process, f"http://127.0.0.1:{port}/health", timeout, poll=2.0):
        return process, f"http://127.0.0.1:{port}/v1"
    if process.poll() is not None:
        raise RuntimeError(f"vf-vllm exited with status {process.returncode}; see {log}")
    os.killpg(process.pid, signal.SIGKILL)
    raise RuntimeError(f"vf-vllm not ready after {timeout:.0f} s; see {log}")


PROG = "vf-rl eval"

USAGE = """vf-rl eval ENV_ID -m MODEL [-n N] [-r R] [-a JSON] [-t TOKENS] [-T TEMP] [--split eval|train]
                  [--base-url URL | --serve [--vllm-args=FLAGS]] [--max-concurrent C] [-o FILE]
       vf-rl eval -h | --help | --version"""

DESCRIPTION = """\
Evaluate a model on an environment, the baseline to take before training: roll out N examples
R times each against an OpenAI-compatible server (by default a vf-vllm at
http://127.0.0.1:8000/v1; --serve starts a vf-vllm for the model on the CPU or GPU first and
stops it afterwards), print the reward's mean and standard deviation, the mean standard
deviation within a group (the reward spread RL learns from: 0 means every rollout of an example
scores the same), the mean of each reward function, the error rate and the timing, and write
every rollout to a JSONL file.

The environment is named as in a config's [env] id: a built-in environment (reverse-text,
gsm8k, ...), an installed module, or owner/name (the owner is dropped)."""

EPILOG = """\
examples:
  vf-rl eval reverse-text -m ~/.cache/vf-rl/models/SmolLM2-135M-Instruct -n 20 -r 4 --serve
  vf-rl eval gsm8k -m Qwen/Qwen3-4B-Instruct-2507 -a '{"few_shot": 2}' --serve --vllm-args='--max-model-len 4096'
  vf-rl eval reverse-text -m MODEL --base-url http://127.0.0.1:8000/v1   # a server already running

exit status: 0 done; 1 every rollout failed (the first cause on stderr: no server at --base-url,
a server without tool calling, an environment that raises); 2 bad input (one line)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``vf-rl eval``; its help is ``vf-rl eval --help``."""
    from vf_rl.config.cli_help import CommandParser

    parser = CommandParser(PROG, usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("env_id", metavar="ENV_ID",
                        help="The environment: a built-in id such as reverse-text, an installed module, or owner/name.")
    parser.add_argument("-m", "--model", required=True, metavar="MODEL",
                        help="The model: its name as the server serves it, or with --serve a hub id or local directory.")
    parser.add_argument("-n", "--num-examples", type=int, default=20, metavar="N",
                        help="The number of examples to evaluate (default 20).")
    parser.add_argument("-r", "--rollouts-per-example", type=int, default=4, metavar="R",
                        help="Rollouts per example, the group whose reward spread is reported (default 4).")
    parser.add_argument("-a", "--env-args", default="{}", metavar="JSON",
                        help="The environment's load_environment arguments as a JSON object, for example "
                             "'{\"few_shot\": 2}' (default {}).")
    parser.add_argument("-t", "--max-tokens", type=int, default=256, metavar="TOKENS",
                        help="The most tokens generated per turn (default 256).")
    parser.add_argument("-T", "--temperature", type=float, default=1.0, metavar="TEMP",
                        help="The sampling temperature (default 1.0).")
    parser.add_argument("--split", choices=["eval", "train"], default="eval",
                        help="The dataset split whose first N examples are evaluated (default eval).")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", metavar="URL",
                        help="The OpenAI root of a running server (default http://127.0.0.1:8000/v1).")
    parser.add_argument("--serve", action="store_true",
                        help="Start a vf-vllm for MODEL on a free port first and stop it afterwards; its log is "
                             "written next to the rollouts (.server.log).")
    parser.add_argument("--vllm-args", default="--enforce-eager", metavar="FLAGS",
                        help="With --serve: the server's vllm serve flags, as one string written after '=' since it "
                             "starts with '--' (--vllm-args='--enforce-eager --max-model-len 2048'; default "
                             "--enforce-eager).")
    parser.add_argument("--max-concurrent", type=int, default=64, metavar="C",
                        help="The most rollouts in flight at once (default 64).")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE",
                        help="The JSONL file for the rollouts (default outputs/evals/<env>--<time>.jsonl).")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    try:
        env_args = json.loads(opts.env_args)
        if not isinstance(env_args, dict):
            raise ValueError
    except ValueError:
        print(f"{PROG}: error: --env-args must be a JSON object, got {opts.env_args!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for flag, value in (("-n", opts.num_examples), ("-r", opts.rollouts_per_example), ("-t", opts.max_tokens)):
        if value < 1:
            print(f"{PROG}: error: {flag} must be at least 1, got {value}", file=sys.stderr)
            return EXIT_BAD_INPUT

    from vf_rl.env_api import load_environment
    from vf_rl.inference.client import openai_client
    from vf_rl.orchestrator.metrics import rollout_metrics

    try:
        env = load_environment(opts.env_id, **env_args)
    except (ValueError, TypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    dataset = env.get_eval_dataset(opts.num_examples) if opts.split == "eval" else env.get_dataset(opts.num_examples)
    rows = [dataset[i] for i in range(len(dataset))]
    output = opts.output or Path("outputs/evals") / f"{opts.env_id.replace('/', '--')}--{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    output.parent.mkdir(parents=True, exist_ok=True)
    process, base_url = None, opts.base_url
    if opts.serve:
        print(f"{PROG}: starting vf-vllm for {opts.model} ...", flush=True)
        process, base_url = start_server(opts.model, shlex.split(opts.vllm_args), output.with_suffix(".server.log"))
    try:
        sampling = {"max_tokens": opts.max_tokens, "temperature": opts.temperature}
        start = time.perf_counter()

        async def run():
            client = openai_client(base_url, os.environ.get("OPENAI_API_KEY", "vf-rl"), timeout=600.0)
            try:
                return await env.generate(client, opts.model, rows, opts.rollouts_per_example, sampling,
                                          opts.max_concurrent)
            finally:
                await client.close()

        rollouts = asyncio.run(run())
        seconds = time.perf_counter() - start
    finally:
        if process is not None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
    with output.open("w") as f:
        for r in rollouts:
            f.write(json.dumps(rollout_record(r), default=str) + "\n")
    summary = rollout_metrics(rollouts, opts.rollouts_per_example)
    tokens = sum(sum(len(t.completion_ids) for t in r.turns) for r in rollouts)
    print(f"{opts.env_id}: {len(rows)} examples x {opts.rollouts_per_example} rollouts, model {opts.model}")
    for key, value in summary.items():
        print(f"  {key:<28} {value:.4f}")
    print(f"  {'time/total_s':<28} {seconds:.1f}")
    print(f"  {'tokens_per_s':<28} {tokens / max(seconds, 1e-9):.1f}")
    errors = {(r.error_kind, r.error) for r in rollouts if r.error}
    for kind, error in sorted(errors)[:5]:
        print(f"  error ({kind}): {error}")
    print(f"rollouts written to {output}")
    if rollouts and all(r.error for r in rollouts):
        first = rollouts[0]
        what = "every rollout failed"
        if first.error.startswith("APIConnectionError") and not opts.serve:  # nothing listens at --base-url
            what = f"no server answers at {base_url} (--serve starts a vf-vllm for {opts.model}); {what}"
        print(f"{PROG}: error: {what}; the first ({first.error_kind}): {first.error}", file=sys.stderr)
        return EXIT_ALL_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
