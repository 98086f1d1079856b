"""``vf-rl plot RUN_DIR``: reward, eval reward, entropy, importance ratio and the time per step
against step, from ``RUN_DIR/metrics.jsonl``, saved as ``RUN_DIR/metrics.png``."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load_metrics(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``.

    Raises:
        FileNotFoundError: no metrics file.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (is {run_dir} a vf-rl run directory?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Write the run's plot (PNG) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = load_metrics(run_dir)
    steps = [r for r in records if "reward" in r]
    evals = [r for r in records if "eval/reward" in r]

    def series(rows, key):
        pairs = [(r["step"], r[key]) for r in rows if key in r]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    ax.plot(*series(steps, "reward"), label="reward (train batch)")
    if evals:
        ax.plot(*series(evals, "eval/reward"), "o-", label="eval reward")
    ax.set_title("reward")
    ax.legend()
    axes[0][1].plot(*series(steps, "entropy"))
    axes[0][1].set_title("entropy (nats/token)")
    axes[1][0].plot(*series(steps, "importance_ratio"), label="importance ratio")
    axes[1][0].plot(*series(steps, "mismatch_kl"), label="mismatch KL")
    axes[1][0].set_title("importance ratio / mismatch KL")
    axes[1][0].legend()
    ax = axes[1][1]
    x = [r["step"] for r in steps]
    bottom = [0.0] * len(steps)
    for key, label in (("timing/wait_s", "waiting for batch"), ("timing/sync_s", "weight sync"),
                       ("timing/train_s", "training")):
        values = [r.get(key, 0.0) for r in steps]
        ax.bar(x, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.plot(*series(steps, "timing/generation_s"), "k.--", label="generation (overlapped)")
    ax.set_title("seconds per step")
    ax.legend()
    for a in axes.flat:
        a.set_xlabel("step")
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    out = out or run_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


USAGE = """vf-rl plot RUN_DIR [-o FILE]
       vf-rl plot -h | --help | --version"""

DESCRIPTION = """\
Plot a run's metrics against the step: the reward of each training batch and the eval reward,
the entropy, the importance ratio and mismatch KL, and the seconds of each step (waiting for
the batch, weight sync, training; generation, which overlaps them, as a line). The metrics come
from RUN_DIR/metrics.jsonl, which every run writes; the plot is saved as a PNG file, by default
RUN_DIR/metrics.png, which a run also writes when it ends. The file's path is printed."""

EPILOG = """\
exit status: 0 done; 2 no readable metrics.jsonl in RUN_DIR (one line)."""


def build_parser():
    """The parser of ``vf-rl plot``; its help is ``vf-rl plot --help``."""
    from vf_rl.config.cli_help import CommandParser

    parser = CommandParser("vf-rl plot", usage=USAGE, description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="The run's output directory (output_dir, by default outputs/<run_name>).")
    parser.add_argument("-o", "--out", type=Path, default=None, metavar="FILE",
                        help="The PNG file to write (default RUN_DIR/metrics.png).")
    return parser


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        print(plot_run(opts.run_dir, opts.out))
    except (FileNotFoundError, json.JSONDecodeError) as exc:
        print(f"vf-rl plot: error: {exc}", file=sys.stderr)
        return 2
    return 0
