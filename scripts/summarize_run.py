"""Print a run's reward over its first and last 5 steps, and its time per step.

    python scripts/summarize_run.py configs/vf-rl/reverse-text-cpu.toml
"""

import json
import statistics
import sys

from vf_rl.config.schema import load_config


def main() -> int:
    config = load_config(sys.argv[1])
    path = config.output_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    if not steps:
        print(f"no steps in {path}")
        return 1

    def stats(rows, key):
        values = [r[key] for r in rows if key in r]
        return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)

    first, last = steps[:5], steps[-5:]
    print(f"run: {config.output_dir} ({len(steps)} steps)")
    print("reward, first 5 steps: {:.3f} +- {:.3f}".format(*stats(first, "reward")))
    print("reward, last 5 steps:  {:.3f} +- {:.3f}".format(*stats(last, "reward")))
    for key in ("timing/generation_s", "timing/wait_s", "timing/train_s", "timing/sync_s"):
        print("{:<20} mean {:.1f} s  (sd {:.1f})".format(key, *stats(steps, key)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
