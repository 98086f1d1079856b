"""Trainer-step results run one ``trainer_step.py`` process per side, as one table (and a plot).

Long sequences (``scripts/gpu/session.sh long``): reads
``benchmarks/results/trainer-step-<model>-lora-<tokens>-<side>[-offload[-tiled]]-<gpu>.json`` and prints
tokens/s, peak GiB and time to first step per side and length, an out-of-memory side as ``OOM``,
and vf-rl's tokens/s over the best TRL side's at each length; ``--plot`` draws tokens/s and peak
memory against the sequence length (tokens), one line per side.

Small-model cases against every TRL side (``scripts/gpu/session.sh best``): ``--cases PREFIX``
reads ``trainer-step-<PREFIX>-<fixed|realistic>-<model>-<lora|full>-<side>-<gpu>.json``, one row
per case.

    python benchmarks/long_table.py --model llama-3.1-8b --gpu h100 --plot benchmarks/results/long-llama-3.1-8b-h100.png
    python benchmarks/long_table.py --cases best --gpu h100
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(model: str, gpu: str) -> dict[tuple[int, str], dict]:
    """``{(tokens per sequence, side label): result}``; the label is the side's name, with
    ``+offload`` when its activations were offloaded, ``+offload+tiled`` with ``tiled_mlp`` too."""
    pattern = re.compile(rf"trainer-step-{re.escape(model)}-lora-(\d+)-(.+?)(-offload(?:-tiled)?)?-{re.escape(gpu)}\.json$")
    rows = {}
    for path in sorted(RESULTS.glob(f"trainer-step-{model}-lora-*-{gpu}.json")):
        match = pattern.match(path.name)
        if not match:
            continue
        record = json.loads(path.read_text())
        for side, result in record["results"].items():
            rows[(int(match.group(1)), side + (match.group(3) or "").replace("-", "+"))] = result
    return rows


def load_cases(prefix: str, gpu: str) -> dict[tuple[str, str], dict]:
    """``{("fixed, qwen2-0.5b lora", side): result}`` from the ``--cases`` files."""
    pattern = re.compile(rf"trainer-step-{re.escape(prefix)}-(fixed|realistic)-(.+?)-(lora|full)-(.+)-{re.escape(gpu)}\.json$")
    rows = {}
    for path in sorted(RESULTS.glob(f"trainer-step-{prefix}-*-{gpu}.json")):
        match = pattern.match(path.name)
        if match:
            mode, model, kind, _ = match.groups()
            for side, result in json.loads(path.read_text())["results"].items():
                rows[(f"{mode}, {model} {kind}", side)] = result
    return rows


def table(rows: dict[tuple[int | str, str], dict], key_label: str = "tokens per sequence") -> str:
    lengths = sorted({length for length, _ in rows})
    sides = sorted({side for _, side in rows}, key=lambda s: (not s.startswith("vf-rl"), s))
    head = f"| {key_label} | " + " | ".join(sides) + " | vf-rl / best TRL |"
    lines = [head, "|" + "---|" * (len(sides) + 2)]
    for length in lengths:
        cells, best = [], {}
        for side in sides:
            r = rows.get((length, side))
            if r is None:
                cells.append("-")
            elif r.get("oom"):
                cells.append("OOM")
            else:
                cells.append(f"{r['tokens_per_s']:,.0f} tok/s, {r['peak_gib']:.1f} GiB, first step {r['first_step_s']:.0f} s")
                best[side] = r["tokens_per_s"]
        vf = max((v for s, v in best.items() if s.startswith("vf-rl")), default=None)
        trl = max((v for s, v in best.items() if s.startswith("trl")), default=None)
        ratio = f"{vf / trl:.2f}x" if vf and trl else "-"
        key = f"{length:,}" if isinstance(length, int) else length
        lines.append(f"| {key} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def plot(rows: dict[tuple[int, str], dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for side in sorted({s for _, s in rows}):
        ran = sorted((n, r) for (n, s), r in rows.items() if s == side and not r.get("oom"))
        if ran:
            speed.plot([n for n, _ in ran], [r["tokens_per_s"] for _, r in ran], marker="o", label=side)
            memory.plot([n for n, _ in ran], [r["peak_gib"] for _, r in ran], marker="o", label=side)
    for ax, label in ((speed, "tokens/s"), (memory, "peak GiB (torch allocated)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per sequence")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    memory.axhline(79.2, color="grey", linestyle="--", linewidth=1, label="H100 80GB")
    memory.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--plot", type=Path)
    p.add_argument("--cases", metavar="PREFIX", help="the small-model cases of this file prefix (no plot)")
    args = p.parse_args()
    if args.cases:
        rows = load_cases(args.cases, args.gpu)
        if not rows:
            raise SystemExit(f"no trainer-step-{args.cases}-* results on {args.gpu} in {RESULTS}")
        print(table(rows, "case"))
        return
    rows = load(args.model, args.gpu)
    if not rows:
        raise SystemExit(f"no results for {args.model} on {args.gpu} in {RESULTS}")
    print(table(rows))
    if args.plot:
        plot(rows, args.plot, f"{args.model} LoRA r16, gradient checkpointing, {args.gpu.upper()}")


if __name__ == "__main__":
    main()
