"""``vf-rl @ config.toml --preflight``: the pre-flight report (:mod:`vf_rl.orchestrator.preflight`) of a run,
before the run.

    vf-rl @ config.toml --preflight [--preflight-prompts N] [--base-url URL] [--json PATH]

Reads the same resolved config the run would use, starts vf-vllm the way ``vf-rl`` starts it
(same flags, GPUs and CPU cores, from a ``resolved.toml`` in a temporary directory), or uses the
running server at ``--base-url`` (its OpenAI root, ``http://host:port/v1``), runs the report on
the run's first ``N`` training prompts (default 16 groups, at least one batch), then, with the
server it started, the run's trainer for its first steps (``run_time.measure_steps``: the time
estimate for ``max_steps``), prints the report with every problem ranked, writes it to
``--json`` as one JSON object, and stops the server it started. Nothing is written to
``output_dir``. With ``--base-url`` the training steps are not run (they would push trained
weights to that server), so the report has no time estimate.

Exit status: 0 the report was made, whatever its verdict; 1 the check could not run (the server
did not start or answer, the environment could not be loaded or run, every rollout failed), with
the cause in one line; 2 bad input, with the same one-line errors as ``--dry-run``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from vf_rl.config.layout import LOOPBACK
from vf_rl.config.schema import ConfigError, VfRlConfig

EXIT_CHECK_FAILED = 1
DEFAULT_PROMPTS = 16
STEPS_TIMEOUT_S = 1800  # the measured training steps' own time, beyond the trainer's wait for the server


class PreflightError(RuntimeError):
    """The pre-flight could not run (exit status 1)."""


def start_server(config: VfRlConfig, config_path: Path, workdir: Path, timeout: float) -> subprocess.Popen:
    """vf-vllm for ``config`` as ``vf-rl`` starts it (``launch.build_commands``), its output in
    ``workdir/inference.log``; returns once ``/health`` answers.

    Raises:
        ConfigError: too few GPUs, or the server's port is taken.
        PreflightError: the server exited or did not answer within ``timeout`` seconds.
    """
    from vf_rl.config.gpus import visible_gpus
    from vf_rl.config.resolved_toml import to_toml
    from vf_rl.inference.client import wait_for_server
    from vf_rl.launcher.launch import build_commands, check_gpus
    from vf_rl.launcher.ports import check_port_free

    gpus = check_gpus(config, visible_gpus(), dry_run=False, config_path=config_path)
    host, port = config.server_address()
    check_port_free("0.0.0.0" if host not in LOOPBACK else "127.0.0.1", port)
    resolved = workdir / "resolved.toml"
    resolved.write_text(to_toml(config))
    inference, _ = build_commands(config, resolved, gpus)
    log = workdir / "inference.log"
    with log.open("w") as out:
        process = subprocess.Popen(inference.argv, env={**os.environ, **inference.env}, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/health"
    if wait_for_server(process, url, timeout):
        return process
    if process.poll() is not None:
        raise PreflightError(f"the inference server exited with status {process.returncode}: {_last_line(workdir)}")
    stop_server(process)
    raise PreflightError(f"the inference server did not answer {url} within {timeout:.0f} s")


def _last_line(workdir: Path) -> str:
    """The last non-empty line of the server's ``workdir/inference.log`` (300 characters at most)."""
    log = workdir / "inference.log"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return lines[-1][-300:] if lines else "(no output)"


def stop_server(process: subprocess.Popen) -> None:
    """Stop the server's process group (SIGTERM, then SIGKILL after 30 s)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def memory_report(config: VfRlConfig, lengths: dict) -> dict | None:
    """With trainer GPUs: the memory estimate for the measured sample, prompt and completion
    lengths (``vf_rl.config.memory.pass_tokens``), whether it fits an 80 GB GPU, and the ``max_seq_len`` bound."""
    from vf_rl.config.memory import estimate_for_run, fit_report, load_shape

    if not config.trainer.gpus:
        return None
    try:
        shape = load_shape(config.model)
    except ValueError as exc:
        return {"line": f"trainer memory per GPU: not estimated ({exc})"}
    measured = estimate_for_run(config, shape, lengths["sample_tokens"]["mean"] or None,
                                lengths["completion_tokens"]["mean"] or None, lengths["prompt_tokens"]["mean"] or None)
    fits, line = fit_report(config, measured)
    return {"line": line, "fits": fits, "estimate": measured.as_dict(),
            "bound_max_seq_len": estimate_for_run(config, shape).as_dict()}


def preflight(config: VfRlConfig, config_path: Path, prompts: int | None, base_url: str | None,
              json_path: Path | None) -> int:
    """Run the pre-flight of ``config`` and print its report; the exit status (see the module)."""
    if prompts is not None and prompts < 1:
        raise ConfigError(f"--preflight-prompts must be at least 1, got {prompts}")
    from vf_rl.config.gpus import visible_gpus
    from vf_rl.launcher.launch import check_gpus

    if base_url is None:  # the launch's own GPU check, before the environment and the model load
        check_gpus(config, visible_gpus(), dry_run=False, config_path=config_path)
    from vf_rl.config.rl_config import RLConfig, resolve_temperature
    from vf_rl.env_api.registry import load_environments
    from vf_rl.launcher.run_time import MEASURED_STEPS, estimate, measure_steps, time_lines
    from vf_rl.orchestrator.preflight import format_report, rank, run

    try:
        args = RLConfig(**config.trainer.args)
        env = load_environments(config.envs, args.seed)
        resolve_temperature(args, env)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config_path}: {exc}") from None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    model = config.inference.args.get("served_model_name") or config.model
    timing: dict = ({"skipped": "--base-url (the training steps would push trained weights to that server)"}
                    if base_url is not None else
                    {"skipped": "trainer.nodes > 1 (run the pre-flight on one node's config)"}
                    if config.trainer.nodes > 1 else {})
    server_exit = ""
    # SIGTERM (a terminal closed, a job stopped) as an exit: the finally blocks stop the server and the trainer
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="vf-rl-preflight-") as tmp:
        process = None
        try:
            if base_url is None:
                print(f"vf-rl: pre-flight: starting the inference server for {config.model} ...", flush=True)
                launcher_s, begun = time.time() - psutil.Process().create_time(), time.perf_counter()
                process = start_server(config, config_path, Path(tmp), args.vllm_server_timeout)
                timing = {**timing, "launcher_s": launcher_s, "server_start_s": time.perf_counter() - begun}
                host, port = config.server_address()
                base_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/v1"
            report = run(env, args, tokenizer, base_url.rstrip("/"), model, prompts or DEFAULT_PROMPTS)
            if process is not None and "skipped" not in timing and report["failures"]["share"] < 1.0:
                print(f"vf-rl: pre-flight: running the run's trainer for its first {MEASURED_STEPS} steps "
                      "(the time estimate) ...", flush=True)
                gpus = check_gpus(config, visible_gpus(), dry_run=False, config_path=config_path)
                timing |= measure_steps(config, gpus, Path(tmp), args.vllm_server_timeout + STEPS_TIMEOUT_S, process)
        except PreflightError as exc:
            print(f"vf-rl: pre-flight: error: {exc}", file=sys.stderr)
            return EXIT_CHECK_FAILED
        except ConfigError:  # bad input (too few GPUs, the port taken): vf-rl's one line and exit status 2
            raise
        except Exception as exc:  # the environment or the server failed: the cause in one line
            print(f"vf-rl: pre-flight: error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                  file=sys.stderr)
            return EXIT_CHECK_FAILED
        finally:
            if process is not None:
                exited = process.poll()  # the server died during the pre-flight (its log goes with the directory)
                if exited is not None:
                    server_exit = f"; the inference server exited with status {exited}: {_last_line(Path(tmp))}"
                begun = time.perf_counter()
                stop_server(process)
                timing["server_stop_s"] = time.perf_counter() - begun
    if report["failures"]["share"] == 1.0:  # nothing was measured: the check itself could not run
        kind, message = next(iter(report["failures"]["first"].items()))
        print(f"vf-rl: pre-flight: error: every rollout failed; the first ({kind}): {message}{server_exit}",
              file=sys.stderr)
        return EXIT_CHECK_FAILED
    report = {"config": str(config_path), "model": config.model, "env": ", ".join(e.id for e in config.envs), **report,
              "memory": memory_report(config, report["lengths"]), "timing": timing}
    report["estimate"] = estimate(config, args, report, len(os.sched_getaffinity(0)))
    rank(report)  # again, with the memory estimate and the measured steps
    print(format_report(report, time_lines(report, args.max_steps)))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(f"vf-rl: pre-flight report written to {json_path}")
    return 0
