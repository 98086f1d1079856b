#!/usr/bin/env python
"""The whole loop's throughput per GPU layout (issue #31's scaling table): one vf-rl config run on 2,
4 or 8 GPUs of a host, read from each run's ``metrics.jsonl``.

    python benchmarks/scaling.py runs/scale-1-1.metrics.jsonl runs/scale-2-2.metrics.jsonl \\
        --json benchmarks/results/scaling-h200.json --plot benchmarks/results/scaling-h200.png

A file's name gives its layout, ``scale-<inference GPUs>-<trainer GPUs>[...]`` (``scripts/gpu/session.sh
scaling`` writes them). Per layout: the steps, seconds per step (the median of the wall-clock seconds
between step ends, ``timing/elapsed_s``, leaving out the first ``--warmup`` steps), rollouts per
second (``--rollouts-per-step`` over that median), tokens trained per second (the median over the
same steps of ``tokens/trained`` over the step's seconds), the share of a step the trainer waits for
generation (``timing/wait_s``), and the tokens per second per GPU. ``--json`` writes
``{"rollouts_per_step", "warmup", "layouts": {name: {"inference_gpus", "trainer_gpus", ...}}}``;
``--plot`` draws tokens trained per second against the GPUs in use.

Exit status 2, with one line, for a file that is missing, unreadable, not named by layout, or with
fewer steps than ``--warmup`` + 2.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

LAYOUT = re.compile(r"scale-(\d+)-(\d+)")


def layout_row(path: Path, rollouts_per_step: int, warmup: int) -> dict:
    """One layout's figures from its ``metrics.jsonl`` (see the module docstring).

    Raises:
        ValueError: the name has no ``scale-<N>-<M>``, or the run has fewer than ``warmup`` + 2 steps.
        OSError, json.JSONDecodeError: the file cannot be read as JSON lines.
    """
    match = LAYOUT.search(path.name)
    if not match:
        raise ValueError("the file name does not say the layout (scale-<inference GPUs>-<trainer GPUs>)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "reward" in r and "timing/elapsed_s" in r]
    if len(steps) < warmup + 2:
        raise ValueError(f"{len(steps)} steps, at least {warmup + 2} needed (--warmup {warmup} left out)")
    ends = [r["timing/elapsed_s"] for r in steps]
    timed = list(zip(steps[1:], [b - a for a, b in zip(ends, ends[1:])]))[warmup:]
    step_s = statistics.median(s for _, s in timed)
    tokens_per_s = statistics.median(r.get("tokens/trained", 0.0) / s for r, s in timed if s > 0)
    inference, trainer = int(match.group(1)), int(match.group(2))
    return {"inference_gpus": inference, "trainer_gpus": trainer, "steps": len(steps), "step_s_median": step_s,
            "rollouts_per_s": rollouts_per_step / step_s, "tokens_trained_per_s": tokens_per_s,
            "tokens_per_s_per_gpu": tokens_per_s / (inference + trainer),
            "wait_fraction": statistics.fmean(r.get("timing/wait_s", 0.0) / s for r, s in timed if s > 0)}


def table(layouts: dict) -> str:
    """The markdown table of :func:`layout_row` results, fewest GPUs first."""
    lines = ["| layout | GPUs | steps | s per step | rollouts / s | tokens trained / s | per GPU | waits |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in sorted(layouts.items(), key=lambda kv: kv[1]["inference_gpus"] + kv[1]["trainer_gpus"]):
        lines.append(f"| {name} ({r['inference_gpus']} inference + {r['trainer_gpus']} trainer) | "
                     f"{r['inference_gpus'] + r['trainer_gpus']} | {r['steps']} | {r['step_s_median']:.3f} | "
                     f"{r['rollouts_per_s']:.1f} | {r['tokens_trained_per_s']:,.0f} | {r['tokens_per_s_per_gpu']:,.0f} | "
                     f"{r['wait_fraction']:.2f} |")
    return "\n".join(lines)


def plot(layouts: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(layouts.items(), key=lambda kv: kv[1]["inference_gpus"] + kv[1]["trainer_gpus"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["inference_gpus"] + r["trainer_gpus"] for _, r in rows], [r["tokens_trained_per_s"] for _, r in rows],
            marker="o")
    for name, r in rows:
        ax.annotate(name, (r["inference_gpus"] + r["trainer_gpus"], r["tokens_trained_per_s"]), fontsize=8)
    ax.set_xlabel("GPUs (inference + trainer)")
    ax.set_ylabel("tokens trained per second")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics", type=Path, nargs="+", help="a run's metrics.jsonl, named scale-<N>-<M>...")
    p.add_argument("--rollouts-per-step", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the medians (compile, first syncs)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    opts = p.parse_args(argv)
    layouts = {}
    for path in opts.metrics:
        try:
            row = layout_row(path, opts.rollouts_per_step, opts.warmup)
        except (OSError, ValueError) as exc:
            print(f"scaling: {path}: {exc}", file=sys.stderr)
            return 2
        name = LAYOUT.search(path.name).group(0)
        if name in layouts:
            print(f"scaling: {path}: a second run of layout {name}", file=sys.stderr)
            return 2
        layouts[name] = row
    print(table(layouts))
    if opts.json:
        opts.json.write_text(json.dumps({"rollouts_per_step": opts.rollouts_per_step, "warmup": opts.warmup,
                                         "layouts": layouts}, indent=1))
    if opts.plot:
        plot(layouts, opts.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
