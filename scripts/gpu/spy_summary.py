"""Summarise py-spy raw profiles (``py-spy record --threads --idle --format raw``) per thread.

usage: python scripts/gpu/spy_summary.py FILE... [--top N] [--min-share S] [--tree SHARE]

For each file and each thread with at least ``--min-share`` of the file's busiest thread's samples: its sample count,
the frames it spends its time in (inclusive share: the share of the thread's samples with that frame on the stack,
bootstrap frames and frames on every sample left out) and its leaf frames (self share). Each raw line is
``frame;frame;...;frame COUNT``, the first frame ``thread (TID): NAME`` with ``--threads``. With ``--tree SHARE``, each
file's busiest non-waiting thread's call tree follows: every frame with at least SHARE of its samples, from the first
frame that not every sample passes through.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

_SKIP = ("Thread._bootstrap", "Thread.run ", "BaseProcess.", "spawn_main", "_main (multiprocessing", "<module>")


_WAITS = ("Condition.wait", "Event.wait", "Poller.poll", ".select (selectors", "socket.accept", "Connection._recv",
          "_worker (concurrent/futures")


def _waiting(frames: tuple[str, ...]) -> bool:
    """Whether a stack ends in a blocking wait (a lock, a poll, a queue, a socket)."""
    return bool(frames) and any(w in frames[-1] for w in _WAITS)


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


def tree(stacks: collections.Counter, least: float) -> list[str]:
    """The call tree of one thread's ``stacks`` as indented lines ``share frame``, frames under ``least`` of its
    samples left out, the chain of frames every sample passes through skipped."""
    total = sum(stacks.values())
    root: dict = {}
    for frames, n in stacks.items():
        node = root
        for frame in frames:
            entry = node.setdefault(frame, [0, {}])
            entry[0] += n
            node = entry[1]
    while len(root) == 1 and next(iter(root.values()))[0] == total:  # the common chain
        root = next(iter(root.values()))[1]
    lines: list[str] = []

    def walk(node: dict, depth: int) -> None:
        for frame, (n, children) in sorted(node.items(), key=lambda kv: -kv[1][0]):
            if n >= least * total:
                lines.append(f"{'  ' * depth}{n / total:5.1%} {frame}")
                walk(children, depth + 1)

    walk(root, 0)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--min-share", type=float, default=0.2)
    p.add_argument("--tree", type=float, default=None, help="print the busiest thread's call tree down to this share")
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
        if opts.tree is not None:
            busiest = max(threads.values(), key=lambda c: sum(n for frames, n in c.items() if not _waiting(frames)))
            print("  call tree of the busiest thread:")
            print("\n".join("    " + line for line in tree(busiest, opts.tree)))


if __name__ == "__main__":
    main()
