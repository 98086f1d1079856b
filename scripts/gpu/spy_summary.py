"""Summarise py-spy raw profiles (``py-spy record --threads --idle --format raw``) per thread.

usage: python scripts/gpu/spy_summary.py FILE... [--top N] [--min-share S]

For each file and each thread with at least ``--min-share`` of the file's busiest thread's samples: its sample count,
the frames it spends its time in (inclusive share: the share of the thread's samples with that frame on the stack,
bootstrap frames and frames on every sample left out) and its leaf frames (self share). Each raw line is
``frame;frame;...;frame COUNT``, the first frame ``thread (TID): NAME`` with ``--threads``.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

_SKIP = ("Thread._bootstrap", "Thread.run ", "BaseProcess.", "spawn_main", "_main (multiprocessing", "<module>")


def read(path: Path) -> dict[str, collections.Counter]:
    """``{thread: Counter({stack tuple: samples})}`` from one raw file."""
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith("thread ") else "thread ?"
        rest = tuple(frames[1:] if frames[0].startswith("thread ") else frames)
        threads[thread][rest] += int(count)
    return threads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--min-share", type=float, default=0.2)
    opts = p.parse_args()
    for path in opts.files:
        threads = read(path)
        if not threads:
            print(f"== {path.name}: no samples")
            continue
        most = max(sum(c.values()) for c in threads.values())
        print(f"== {path.name}")
        for thread, stacks in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
            total = sum(stacks.values())
            if total < opts.min_share * most:
                continue
            inclusive, leaf = collections.Counter(), collections.Counter()
            for frames, n in stacks.items():
                kept = [f for f in frames if not f.startswith(_SKIP)]
                for f in set(kept):
                    inclusive[f] += n
                if kept:
                    leaf[kept[-1]] += n
            print(f"  {thread}: {total} samples")
            split = [(f, n) for f, n in inclusive.most_common() if n < total][:opts.top]  # frames on every sample say nothing
            print("    inclusive: " + "; ".join(f"{n / total:.0%} {f}" for f, n in split))
            print("    leaf:      " + "; ".join(f"{n / total:.0%} {f}" for f, n in leaf.most_common(opts.top)))


if __name__ == "__main__":
    main()
