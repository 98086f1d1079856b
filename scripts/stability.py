#!/usr/bin/env python
"""The no-collapse rule of a run's metrics.jsonl: the training reward never falls more than
``--drop`` below its running best for more than ``--window`` steps, and the policy's entropy
stays above ``--min-entropy`` (after ``--skip`` steps). Prints the per-step signals that explain
a collapse (entropy, importance ratio, masked fraction, gradient norm, advantage spread,
truncation share) every ``--every`` steps, the verdict, and writes a PNG with ``--plot`` and the
verdict with every step's signals as JSON with ``--json``.

    python scripts/stability.py outputs/reverse-text-cpu/metrics.jsonl --plot stability.png
Exit status: 0 the rule holds, 1 it does not, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SIGNALS = ("reward", "entropy", "importance_ratio", "tokens/masked_fraction", "grad_norm", "advantage/absmean",
           "reward/within_group_std", "truncated/rate", "tokens/completion")


def steps_of(path: Path) -> list[dict]:
    """The training steps of a metrics.jsonl (records with a ``reward``), in step order."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted((r for r in records if "reward" in r and "step" in r), key=lambda r: r["step"])


def verdict(steps: list[dict], drop: float, window: int, min_entropy: float, skip: int) -> dict:
    """``{"holds", "longest_drop_steps", "min_entropy", "min_entropy_step", "best", "final"}``:
    the longest run of steps with reward more than ``drop`` below the running best, and the lowest
    entropy after ``skip`` steps."""
    best, run, longest = float("-inf"), 0, 0
    for r in steps:
        best = max(best, r["reward"])
        run = run + 1 if r["reward"] < best - drop else 0
        longest = max(longest, run)
    later = [r for r in steps if r["step"] > skip and "entropy" in r]
    low = min(later, key=lambda r: r["entropy"]) if later else None
    return {"holds": longest <= window and (low is None or low["entropy"] >= min_entropy),
            "longest_drop_steps": longest, "min_entropy": low and low["entropy"],
            "min_entropy_step": low and low["step"], "best": best, "final": steps[-1]["reward"] if steps else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics", type=Path)
    p.add_argument("--drop", type=float, default=0.1)
    p.add_argument("--window", type=int, default=50)
    p.add_argument("--min-entropy", type=float, default=0.2)
    p.add_argument("--skip", type=int, default=0, help="steps before the entropy floor applies")
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--plot", type=Path)
    p.add_argument("--json", type=Path, help="write the verdict and every step's signals here")
    opts = p.parse_args(argv)
    if not opts.metrics.is_file():
        print(f"stability: error: {opts.metrics}: no such file", file=sys.stderr)
        return 2
    steps = steps_of(opts.metrics)
    if not steps:
        print(f"stability: error: {opts.metrics}: no training steps logged", file=sys.stderr)
        return 2
    print("| step | " + " | ".join(SIGNALS) + " |")
    print("|---" * (len(SIGNALS) + 1) + "|")
    for r in steps[::opts.every] + ([steps[-1]] if (len(steps) - 1) % opts.every else []):
        print(f"| {r['step']} | " + " | ".join(f"{r[k]:.3f}" if k in r else "-" for k in SIGNALS) + " |")
    v = verdict(steps, opts.drop, opts.window, opts.min_entropy, opts.skip)
    print(json.dumps(v))
    if opts.json:
        rule = {"drop": opts.drop, "window": opts.window, "min_entropy": opts.min_entropy, "skip": opts.skip}
        opts.json.write_text(json.dumps({"metrics": str(opts.metrics), "rule": rule, "verdict": v, "steps": [
            {"step": r["step"], **{k: r[k] for k in SIGNALS if k in r}} for r in steps]}, indent=1))
    if opts.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
        x = [r["step"] for r in steps]
        axes[0].plot(x, [r["reward"] for r in steps], linewidth=1, label="reward")
        axes[0].set_ylabel("reward")
        axes[1].plot(x, [r.get("entropy") for r in steps], linewidth=1, color="tab:orange", label="entropy")
        axes[1].axhline(opts.min_entropy, color="gray", linestyle="--", linewidth=0.8)
        axes[1].set_ylabel("entropy (nats)")
        axes[1].set_xlabel("step")
        axes[0].set_title(f"{opts.metrics.parent.name}: no collapse = {v['holds']}", fontsize=9)
        fig.tight_layout()
        fig.savefig(opts.plot, dpi=120)
    return 0 if v["holds"] else 1


if __name__ == "__main__":
    sys.exit(main())
