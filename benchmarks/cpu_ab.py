#!/usr/bin/env python
"""Two variants of one vf-rl config, side by side in one run, on the CPU demo (or any config).

    python benchmarks/cpu_ab.py configs/vf-rl/reverse-text-cpu.toml --steps 12 \\
        --a padding_free=false --b padding_free=true
    python benchmarks/cpu_ab.py configs/vf-rl/reverse-text-cpu.toml --steps 7 --a-rev a0ce75f   # old code vs this tree

Each variant gets ``[trainer.args]`` of the config plus its ``KEY=VALUE`` overrides (TOML values:
``false``, ``8``, ``"x"``) and runs ``--steps`` steps through the launcher, as the demo does (``vf-rl @
config --wait``: a fresh ``vf-vllm`` with the base weights and ``vf-train`` in tmux); the variants run
one after the other, ``--rounds`` times alternating (a, b, a, b, ...) so slow drift of the machine hits
both. Prints per variant: mean and median training time per step
(``timing/train_s``: forward, backward and optimizer of one step, seconds), mean step time, the
reward of the first and last 3 steps, and the ratio b/a of the mean training time. ``--json`` writes
every step's record. Steps before ``--warmup`` are left out of the times.

``--a-rev REV`` / ``--b-rev REV`` run that variant's ``vf-vllm`` and ``vf-train`` with the ``vf_rl`` package
of a git revision of this repository (``git archive REV src``, put first on ``PYTHONPATH``): the old code
against the new in one run, on one machine, with the same installed dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import tomli_w
import tomllib


def parse_overrides(items: list[str]) -> dict:
    """``["padding_free=false", "micro_batch_size=4"]`` -> ``{"padding_free": False, "micro_batch_size": 4}``."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
    return out


def checkout_src(rev: str, dest: Path) -> Path:
    """Extract ``src/`` of git revision ``rev`` of this repository into ``dest``; returns ``dest / "src"``.

    Raises SystemExit with one line when ``rev`` is not a revision of the repository."""
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "src"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"cpu_ab: --a-rev/--b-rev {rev!r}: not a git revision of {repo}: "
                         f"{archive.stderr.decode().strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "src"


def run_variant(config: dict, overrides: dict, out: Path, steps: int, port: int,
                src: Path | None = None) -> list[dict]:
    """Run ``steps`` steps of the config into ``out`` as the demo runs: ``vf-rl @ config --wait`` (a tmux
    session with vf-vllm and vf-train, the launcher's pane environments, such as the CPU core split);
    returns the step records of metrics.jsonl.

    ``src``: a directory holding a ``vf_rl`` package to run instead of the installed one (launcher, server
    and trainer all come from it: ``PYTHONPATH`` is forwarded to the panes).

    Raises RuntimeError with the end of the trainer's log when the run fails."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    data = json.loads(json.dumps(config))
    data["trainer"]["args"] |= {**overrides, "output_dir": str(out), "max_steps": steps, "save_steps": 10 ** 6,
                                "vllm_server_port": port}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.toml"
    path.write_text(tomli_w.dumps(data))
    run = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(path), "--wait", "-s", f"vf-rl-ab-{port}"],
                         capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if run.returncode != 0:
        log = out / "logs" / "trainer.log"
        tail = log.read_text()[-2000:] if log.is_file() else ""
        raise RuntimeError(f"the run in {out} failed ({run.returncode}): {run.stdout[-1000:]}{run.stderr[-1000:]}"
                           f"{tail}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if "reward" in r and "timing/train_s" in r]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path)
    p.add_argument("--a", nargs="*", default=[], help="KEY=VALUE overrides of [trainer.args] for variant a")
    p.add_argument("--b", nargs="*", default=[], help="KEY=VALUE overrides of [trainer.args] for variant b")
    p.add_argument("--a-rev", default=None, help="git revision whose vf_rl runs variant a (default: this tree)")
    p.add_argument("--b-rev", default=None, help="git revision whose vf_rl runs variant b (default: this tree)")
    p.add_argument("--steps", type=int, default=10, help="steps per run")
    p.add_argument("--rounds", type=int, default=1, help="runs per variant, alternating")
    p.add_argument("--warmup", type=int, default=1, help="steps of each run left out of the times")
    p.add_argument("--port", type=int, default=8766, help="the first run's server port; each next run takes the next")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    opts = p.parse_args(argv)
    config = tomllib.loads(opts.config.read_text())
    config["model"] = str(Path(config["model"]).expanduser())
    out = opts.out or Path(tempfile.mkdtemp(prefix="vf-rl-ab-"))
    variants = {"a": parse_overrides(opts.a), "b": parse_overrides(opts.b)}
    revs = {"a": opts.a_rev, "b": opts.b_rev}
    srcs = {name: checkout_src(rev, out / f"rev-{name}") if rev else None for name, rev in revs.items()}
    runs: dict[str, list[list[dict]]] = {"a": [], "b": []}
    for r in range(opts.rounds):
        for name, overrides in variants.items():
            print(f"cpu_ab: round {r + 1}, variant {name} {overrides or '(config as is)'}"
                  f"{f' at {revs[name]}' if revs[name] else ''}", flush=True)
            port = opts.port + len(runs["a"]) + len(runs["b"])  # a stopping server may hold the last one a while
            runs[name].append(run_variant(config, overrides, out / f"{name}{r}", opts.steps, port, srcs[name]))
    rows = {}
    for name, per_run in runs.items():
        timed = [s for steps in per_run for s in steps[opts.warmup:]]
        train = [s["timing/train_s"] for s in timed]
        elapsed = [b["timing/elapsed_s"] - a["timing/elapsed_s"] for steps in per_run
                   for a, b in zip(steps[opts.warmup:], steps[opts.warmup + 1:])
                   if "timing/elapsed_s" in a and "timing/elapsed_s" in b]  # older revisions lack it
        rewards = [s["reward"] for s in per_run[0]]
        rows[name] = {"overrides": variants[name], "rev": revs[name], "train_s_mean": statistics.fmean(train),
                      "train_s_median": statistics.median(train),
                      "step_s_mean": statistics.fmean(elapsed) if elapsed else None,
                      "reward_first3": statistics.fmean(rewards[:3]), "reward_last3": statistics.fmean(rewards[-3:]),
                      "steps_timed": len(train)}
    print(f"\n{opts.config}, {opts.steps} steps x {opts.rounds} round(s) per variant, first {opts.warmup} of each "
          "run left out of the times")
    print("| variant | code | overrides | train s/step (mean) | median | step s (mean) | reward first 3 | last 3 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        step = f"{row['step_s_mean']:.2f}" if row["step_s_mean"] else "-"
        print(f"| {name} | {row['rev'] or 'this tree'} | {row['overrides'] or '-'} | {row['train_s_mean']:.2f} | "
              f"{row['train_s_median']:.2f} | {step} | {row['reward_first3']:.3f} | {row['reward_last3']:.3f} |")
    print(f"ratio b/a training time per step: {rows['b']['train_s_mean'] / rows['a']['train_s_mean']:.2f}")
    if opts.json:
        opts.json.write_text(json.dumps({"summary": rows, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
