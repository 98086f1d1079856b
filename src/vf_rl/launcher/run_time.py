"""How long a run will take: the pre-flight runs the run's trainer for its first steps and
estimates the wall clock and the GPU-hours (CPU core-hours on the CPU) of ``max_steps``.

The measurement (:func:`measure_steps`) is ``vf-train`` as the launch starts it (its command,
GPUs or CPU cores, and environment: ``launch.build_commands``) on the run's resolved config with
``max_steps`` = :data:`MEASURED_STEPS`, against the server the pre-flight started: step 1
generates batch 1 with nothing to overlap; step 2 is a step of the steady state (its batch was
generated while step 1 trained; the weights of step 1 are pushed in it).

The estimate (:func:`estimate`) follows the step's order (``RLTrainer._next_batch``): batch
``n + 1`` is submitted once step ``n``'s weights are pushed and generates while step ``n``
trains, so a step of the steady state lasts ``max(generation, training) + weight sync``
(training including the step's logging). A run is then

    launch + step 1 + (max_steps - 1) x step + checkpoints + evaluations + end

where the launch is ``vf-rl``'s own start and then the later of the server's start and the
trainer's (imports, model load, compile warm-up: they start side by side); step 1 is its
measured length; each checkpoint before the last costs what the end cost (the last checkpoint,
the plot, the summary, the exit) and the server's stop. What the estimate cannot know: lengths
that grow (or shrink) as the policy learns change the generation time.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

MEASURED_STEPS = 2
POLL_S = 0.2


def _tail(path: Path, lines: int = 1) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[-400:]


def measure_steps(config, gpus: list[str], workdir: Path, timeout: float,
                  server: subprocess.Popen | None = None) -> dict[str, Any]:
    """Run the run's trainer for :data:`MEASURED_STEPS` steps against the running server.

    ``[trainer.args]`` are the run's except ``max_steps``, ``output_dir`` (under ``workdir``),
    ``logging_steps = 1``, no first-batch check, evaluation, trackers, time budget or resume, and
    checkpoints only at the end (as every run saves its last step).

    Args:
        config: the run's resolved :class:`~vf_rl.config.schema.VfRlConfig`.
        gpus: the visible GPU ids the launch hands out.
        timeout: seconds the trainer may take in all.
        server: the server's process, when this process started it: the measurement stops
            when it exits (the trainer would wait for it in vain).
    Returns:
        seconds: ``init_s`` (start until the trainer found the server ready: imports, model load,
        warm-up), ``first_step_s`` (step 1: batch 1's generation and training), ``step_s``
        (step 2, start to end) and its parts ``wait_s``, ``sync_s``, ``train_s``, ``other_s``
        (logging, the rest), ``generation_s`` (batch 2's generation, beside step 1's training),
        ``end_s`` (the last step's end to the exit), ``peak_gib`` (GPU memory, when logged); or
        ``error`` (one line) when the trainer failed or took longer than ``timeout``.
    """
    from vf_rl.config.resolved_toml import to_toml
    from vf_rl.launcher.launch import build_commands

    out = workdir / "steps"
    measured = config.model_copy(deep=True)
    measured._origins = dict(config.origins)
    measured.trainer.args.update(max_steps=MEASURED_STEPS, output_dir=str(out), logging_steps=1, preflight="off",
                                 eval_strategy="no", eval_on_start=False, report_to="none", save_steps=10 ** 9)
    for key in ("max_time_s", "resume_from_checkpoint"):  # unset (TOML has no None)
        measured.trainer.args.pop(key, None)
    resolved = workdir / "steps.toml"
    resolved.write_text(to_toml(measured))
    _, trainer = build_commands(measured, resolved, gpus)
    log, metrics = workdir / "steps.log", out / "metrics.jsonl"
    seen: dict[int, float] = {}
    start = time.perf_counter()
    with log.open("w") as stdout:
        process = subprocess.Popen(trainer.argv, env={**os.environ, **trainer.env}, stdout=stdout,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while process.poll() is None and time.perf_counter() - start < timeout:
                if server is not None and server.poll() is not None:
                    process.kill()
                    process.wait()
                    return {"error": f"the inference server exited with status {server.returncode} during the "
                                     "measured steps"}
                if metrics.exists():  # when each step's record appears: the step's end
                    for line in metrics.read_text().splitlines():
                        record = json.loads(line) if line.strip().endswith("}") else {}
                        if "reward" in record:
                            seen.setdefault(record["step"], time.perf_counter())
                time.sleep(POLL_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    exited = time.perf_counter()
    if process.returncode != 0:
        why = (f"took longer than {timeout:.0f} s" if process.returncode == -9 and exited - start >= timeout
               else f"vf-train exited with status {process.returncode}")
        return {"error": f"{why}: {_tail(log)}"}
    records = {r["step"]: r for r in map(json.loads, metrics.read_text().splitlines()) if "reward" in r}
    if set(records) != set(range(1, MEASURED_STEPS + 1)):
        return {"error": f"vf-train logged steps {sorted(records)}, not 1-{MEASURED_STEPS}: {_tail(log)}"}
    first, last = records[1], records[MEASURED_STEPS]
    last_seen = seen.get(MEASURED_STEPS, exited)
    step_s = (last["timing/elapsed_s"] - first["timing/elapsed_s"]) / (MEASURED_STEPS - 1)
    parts = {k: last.get(f"timing/{k}", 0.0) for k in ("wait_s", "sync_s", "train_s")}
    return {"init_s": max(0.0, seen.get(1, last_seen) - start - first["timing/elapsed_s"]),
            "first_step_s": first["timing/elapsed_s"], "step_s": step_s, **parts,
            "other_s": max(0.0, step_s - sum(parts.values())), "generation_s": last.get("timing/generation_s"),
            "end_s": exited - last_seen, "peak_gib": last.get("memory/reserved_peak_gib")}


def _interval(every: float, max_steps: int) -> int:
    """A ``save_steps`` / ``eval_steps`` value as steps (below 1: a share of ``max_steps``, as transformers reads it)."""
    return max(1, math.ceil(every * max_steps) if every < 1 else int(every))


def estimate(config, args, report: dict[str, Any], cores: int) -> dict[str, Any] | None:
    """The run's wall clock and device-hours from the pre-flight's measurements (module docstring).

    Args:
        config: the run's resolved config (its GPUs).
        args: the run's :class:`~vf_rl.config.rl_config.RLConfig` (``max_steps``, ``save_steps``,
            evaluation, ``max_time_s``).
        report: the pre-flight report with ``timing`` (:func:`measure_steps`, plus ``launcher_s``,
            ``server_start_s``, ``server_stop_s``) and ``generation``.
        cores: CPU cores the run uses (for CPU-hours when neither side has a GPU).
    Returns:
        ``total_s``, ``hours`` (device-hours), ``unit`` (``"GPU-hours"`` or ``"CPU-hours"``),
        ``devices``, ``step_s`` (a step of the steady state), ``bound`` (``"generation"`` or
        ``"training"``), ``generation_s``, ``parts`` (seconds of each term); ``None`` without a
        measured training step.
    """
    from vf_rl.launcher.launch import gpus_needed

    t = report.get("timing") or {}
    if "first_step_s" not in t:
        return None
    n = args.max_steps
    batches = report["generation"]["batch_s"]
    generation = t["generation_s"] if t.get("generation_s") is not None else (
        statistics.median(batches) if batches else 0.0)
    training = t["train_s"] + t["other_s"]
    step = max(generation, training) + t["sync_s"]
    steps = n
    if args.max_time_s is not None:  # the run stops at the first step that ends max_time_s after step 1
        steps = min(n, 1 + math.ceil(args.max_time_s / max(step, 1e-9)))
    saves = sum(1 for k in range(1, steps) if k % _interval(args.save_steps, n) == 0)
    evals = 0.0
    if getattr(args.eval_strategy, "value", args.eval_strategy) != "no":
        eval_steps = _interval(args.eval_steps or args.logging_steps, n)
        count = int(bool(args.eval_on_start)) + steps // eval_steps + int(steps % eval_steps != 0)
        held_s, prompts = report["generation"].get("held_out_s"), (report.get("held_out") or {}).get("prompts")
        rpe = args.eval_rollouts_per_example or args.rollouts_per_example
        per_rollout = (held_s / (prompts * args.rollouts_per_example) if held_s and prompts else
                       generation / max(1, report["generation"]["rollouts_per_batch"]))
        examples = args.num_eval_examples if args.num_eval_examples > 0 else (prompts or 0)
        evals = count * per_rollout * examples * rpe
    parts = {"launch": t.get("launcher_s", 0.0) + max(t.get("server_start_s", 0.0), t["init_s"]),
             "first_step": t["first_step_s"], "steps": (steps - 1) * step, "checkpoints": saves * t["end_s"],
             "evaluations": evals, "end": t["end_s"] + t.get("server_stop_s", 0.0)}
    total = sum(parts.values())
    devices = gpus_needed(config)
    return {"total_s": total, "hours": total / 3600 * (devices or cores), "unit": "GPU-hours" if devices else "CPU-hours",
            "devices": devices or cores, "steps": steps, "step_s": step, "generation_s": generation,
            "bound": "generation" if generation >= training else "training", "parts": parts}


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3 * 3600 else f"{seconds / 60:.1f} min" if seconds >= 120 \
        else f"{seconds:.0f} s"


def time_lines(report: dict[str, Any], max_steps: int) -> list[str]:
    """The report's time section: what was measured and the estimate, as text lines."""
    t, g, e = report.get("timing") or {}, report["generation"], report.get("estimate")
    lines = ["  time (measured here):"]
    if g["batch_s"]:
        lines.append(f"    generation           {statistics.median(g['batch_s']):.1f} s per batch of "
                     f"{g['rollouts_per_batch']} rollouts (median of {len(g['batch_s'])}, base weights)")
    if "skipped" in t or "error" in t:
        lines.append(f"    training step        not measured: {t.get('skipped') or t['error']}")
    if "first_step_s" in t:
        lines += [f"    start                server {t.get('server_start_s', 0):.0f} s, trainer {t['init_s']:.0f} s "
                  "(side by side in a run)",
                  f"    step 1               {t['first_step_s']:.1f} s (batch 1's generation, then training)",
                  f"    step 2               {t['step_s']:.1f} s: training {t['train_s']:.1f} s, weight sync "
                  f"{t['sync_s']:.1f} s, waiting for its batch {t['wait_s']:.1f} s, other {t['other_s']:.1f} s; "
                  f"its batch generated in {t['generation_s'] or 0:.1f} s beside step 1's training"]
    if e is not None:
        steps = f"{e['steps']} steps" + (f" (max_time_s; max_steps = {max_steps})" if e["steps"] < max_steps else "")
        lines.append(f"  estimate             {_duration(e['total_s'])} wall clock for {steps}, "
                     f"{e['hours']:.2f} {e['unit']} ({e['devices']} {'GPU' if e['unit'] == 'GPU-hours' else 'core'}"
                     f"{'s' if e['devices'] > 1 else ''});"
                     f" a step {e['step_s']:.1f} s, {e['bound']}-bound")
    return lines
