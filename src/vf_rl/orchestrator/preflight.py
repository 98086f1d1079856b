"""Pre-flight: before a run spends hours, whether it can learn.

``vf-rl @ config.toml --preflight`` runs the environment on a sample of the run's own training
prompts (the rows its first steps take, in order) with the run's ``rollouts_per_example``,
sampling arguments and ``max_tokens``, against the inference server started the way the run
starts it (or ``--base-url``), and reports what the RL guides tell users to check by hand
before training:

- the baseline reward (each reward function too; held-out rows when the environment has an eval
  split);
- reward spread within groups: a group whose rollouts all score the same gets zero advantage
  (group-relative advantages, Shao et al. 2024, arXiv:2402.03300, eq. 3) and teaches nothing;
- truncation at ``max_tokens`` and lengths against ``max_tokens`` and ``max_seq_len``;
- failed rollouts and their causes (``errors/<kind>``);
- a verdict with its reason and the next step (:func:`verdict`).

The thresholds (:data:`THRESHOLDS`) are the rules of thumb of verifiers' and prime-rl's guides:
a model that never scores after 10+ attempts per prompt has nothing to learn from ("too hard"),
a baseline of 80% or more leaves little to learn ("too easy"), 10-70% is the range where RL
learns fastest.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

THRESHOLDS = {
    "ready_low": 0.10,  # 10-70%: the range the guides call good for RL (outside it, a note on "ready")
    "ready_high": 0.70,
    "too_easy": 0.80,  # guides: "baseline already 80%+: consider harder examples"
    "no_spread_share": 0.50,  # half the groups or more without spread: most of each batch teaches nothing
    "truncated_nearly_all": 0.90,  # nearly every answer cut: the reward cannot be judged, lengths come first
    "truncated_share": 0.50,  # half the rollouts or more cut at max_tokens (or max_seq_len): the reward grades cut answers
    "failed_share": 0.50,  # half the rollouts or more failed: fix the causes first
}


@dataclass
class Verdict:
    """``name`` is one of ``failing``, ``lengths``, ``too_hard``, ``no_spread``, ``too_easy``,
    ``ready``; ``reason`` the measured figure behind it; ``next_step`` what to change."""

    name: str
    reason: str
    next_step: str


def percentiles(values: list[int]) -> dict[str, float]:
    """``{"p50", "p95", "max", "mean"}`` of ``values`` (nearest rank; zeros when empty)."""
    if not values:
        return {"p50": 0, "p95": 0, "max": 0, "mean": 0.0}
    ordered = sorted(values)

    def rank(q: float) -> int:
        return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]

    return {"p50": rank(0.50), "p95": rank(0.95), "max": ordered[-1], "mean": statistics.fmean(ordered)}


def measure(rollouts: list, group_size: int, max_tokens: int, max_seq_len: int) -> dict[str, Any]:
    """The report's figures for ``rollouts`` (``group_size`` consecutive rollouts per prompt).

    Args:
        rollouts: :class:`~vf_rl.env_api.environment.Rollout` objects, scored.
        max_tokens: the completion limit per model turn (tokens) the run samples with.
        max_seq_len: the trainer's sequence limit (tokens); a rollout whose last turn's prompt and
            completion exceed it is cut (and marked truncated) by the trainer.
    Returns:
        ``reward`` (``mean``, ``std``, ``min``, ``max``, ``functions``: mean per reward function),
        ``groups`` (``count``, ``no_spread_share``: the share of groups whose rewards are all
        equal, ``mean_std``: mean within-group standard deviation), ``truncation``
        (``rollouts_share``: rollouts marked truncated, ``turns_share``: model turns that used all
        of ``max_tokens``), ``lengths`` (``prompt_tokens``, ``completion_tokens`` and
        ``sample_tokens`` (the last turn's prompt and completion: what the trainer forwards) per
        rollout: ``p50``/``p95``/``max``/``mean``; ``over_max_seq_len_share``), ``failures`` (``share``, ``kinds``:
        share per kind, ``first``: the first message per kind).
    """
    from vf_rl.orchestrator.metrics import rollout_metrics

    summary = rollout_metrics(rollouts, group_size)
    rewards = [r.reward for r in rollouts]
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    turns = [t for r in rollouts for t in r.turns]
    failures: dict[str, str] = {}
    for r in rollouts:
        if r.error is not None:
            failures.setdefault(r.error_kind or "environment", r.error)
    return {
        "reward": {"mean": summary["reward"], "std": summary["reward/std"], "min": min(rewards), "max": max(rewards),
                   "functions": {k.removeprefix("reward/"): v for k, v in summary.items()
                                 if k.startswith("reward/") and k not in ("reward/std", "reward/within_group_std")}},
        "groups": {"count": len(groups), "no_spread_share": statistics.fmean(float(max(g) == min(g)) for g in groups),
                   "mean_std": summary["reward/within_group_std"]},
        "truncation": {"rollouts_share": summary["truncated/rate"],
                       "turns_share": statistics.fmean(float(len(t.completion_ids) >= max_tokens) for t in turns)
                       if turns else 0.0},
        "lengths": {"prompt_tokens": percentiles([len(r.turns[0].prompt_ids) for r in rollouts if r.turns]),
                    "completion_tokens": percentiles([sum(len(t.completion_ids) for t in r.turns) for r in rollouts]),
                    "sample_tokens": percentiles([len(r.turns[-1].prompt_ids) + len(r.turns[-1].completion_ids)
                                                  for r in rollouts if r.turns]),
                    "max_tokens": max_tokens, "max_seq_len": max_seq_len,
                    "over_max_seq_len_share": statistics.fmean(
                        float(bool(r.turns) and len(r.turns[-1].prompt_ids) + len(r.turns[-1].completion_ids) > max_seq_len)
                        for r in rollouts)},
        "failures": {"share": summary["errors/rate"],
                     "kinds": {k.removeprefix("errors/"): v for k, v in summary.items()
                               if k.startswith("errors/") and k != "errors/rate" and v > 0},
                     "first": failures},
    }


def verdict(report: dict[str, Any], attempts: str) -> Verdict:
    """The verdict on a :func:`measure` report (``attempts``: e.g. ``"16 x 8"``, for the message),
    the first that applies of:

    - ``failing``: ``failed_share`` of the rollouts or more failed;
    - ``lengths``: ``truncated_nearly_all`` of the rollouts or more were cut at ``max_tokens`` or
      ``max_seq_len`` (before the reward: a cut answer scores low whatever the task);
    - ``too_hard``: no rollout scored above 0 (the guides' "0% after 10+ attempts"), or the mean
      is below ``ready_low`` and ``no_spread_share`` of the groups or more scored all their
      rollouts alike (a rare success: most groups all 0);
    - ``lengths``: ``truncated_share`` of the rollouts or more were cut;
    - ``no_spread``: ``no_spread_share`` of the groups or more scored all their rollouts alike;
    - ``too_easy``: mean reward at or above ``too_easy``;
    - ``ready``, noted when the mean is outside ``ready_low``-``ready_high``.
    """
    t = THRESHOLDS
    reward, groups, failures = report["reward"], report["groups"], report["failures"]
    truncated = max(report["truncation"]["rollouts_share"], report["lengths"]["over_max_seq_len_share"])
    if failures["share"] >= t["failed_share"]:
        kind, message = next(iter(failures["first"].items()))
        return Verdict("failing", f"{failures['share']:.0%} of the rollouts failed; the first ({kind}): {message}",
                       "fix the cause above (docs: troubleshooting) and run the pre-flight again")
    lengths = Verdict("lengths", f"{truncated:.0%} of the rollouts were cut (max_tokens = "
                      f"{report['lengths']['max_tokens']}, max_seq_len = {report['lengths']['max_seq_len']})",
                      "raise trainer.args.max_tokens (and max_seq_len with it), or ask for shorter answers")
    if truncated >= t["truncated_nearly_all"]:
        return lengths
    harder = "add few-shot turns, use an easier split, or warm the model up with vf-sft"
    if reward["max"] <= 0:
        return Verdict("too_hard", f"no reward in {attempts} attempts", harder)
    if reward["mean"] < t["ready_low"] and groups["no_spread_share"] >= t["no_spread_share"]:
        return Verdict("too_hard", f"mean reward {reward['mean']:.3f} and {groups['no_spread_share']:.0%} of the "
                       "groups scored all their rollouts alike", harder)
    if truncated >= t["truncated_share"]:
        return lengths
    if groups["no_spread_share"] >= t["no_spread_share"]:
        return Verdict("no_spread", f"{groups['no_spread_share']:.0%} of the groups scored all their rollouts "
                       "the same: zero advantage, nothing to learn from them",
                       "raise temperature or rollouts_per_example, or use a reward with partial credit")
    if reward["mean"] >= t["too_easy"]:
        return Verdict("too_easy", f"mean reward {reward['mean']:.3f}, at or above {t['too_easy']:.0%}",
                       "use harder examples (another split, fewer few-shot turns)")
    note = ("" if t["ready_low"] <= reward["mean"] <= t["ready_high"] else
            f" (outside the {t['ready_low']:.0%}-{t['ready_high']:.0%} the guides aim for)")
    return Verdict("ready", f"mean reward {reward['mean']:.3f}{note}, spread in "
                   f"{1 - groups['no_spread_share']:.0%} of the groups", "start the run")


def format_report(report: dict[str, Any]) -> str:
    """The report as the text ``--preflight`` prints."""
    r, g, tr, ln, fl = (report[k] for k in ("reward", "groups", "truncation", "lengths", "failures"))
    lines = [f"pre-flight: {report['env']} on {report['model']}: {report['prompts']} prompts x "
             f"{report['rollouts_per_example']} rollouts, max_tokens {ln['max_tokens']}, "
             f"max_seq_len {ln['max_seq_len']} ({report['seconds']:.1f} s)",
             f"  baseline reward      {r['mean']:.3f} (std {r['std']:.3f}, min {r['min']:.3f}, max {r['max']:.3f})"]
    lines += [f"    {name:<24} {value:.3f}" for name, value in r["functions"].items()]
    if report.get("held_out") is not None:
        lines.append(f"  held-out reward      {report['held_out']['mean']:.3f} ({report['held_out']['prompts']} prompts)")
    lines += [f"  groups without spread {g['no_spread_share']:.0%} of {g['count']} (mean within-group std "
              f"{g['mean_std']:.3f})",
              f"  truncated            {tr['rollouts_share']:.0%} of rollouts, {tr['turns_share']:.0%} of turns at "
              f"max_tokens; {ln['over_max_seq_len_share']:.0%} over max_seq_len",
              "  prompt tokens        p50 {p50} / p95 {p95} / max {max}".format(**ln["prompt_tokens"]),
              "  completion tokens    p50 {p50} / p95 {p95} / max {max}".format(**ln["completion_tokens"]),
              f"  failed               {fl['share']:.0%}" + "".join(f"; {k} {v:.0%}" for k, v in fl["kinds"].items())]
    lines += [f"    first {kind} error: {message[:200]}" for kind, message in fl["first"].items()]
    if report.get("memory"):
        lines.append(f"  {report['memory']['line']}")
    v = report["verdict"]
    lines += [f"verdict: {v['name']}: {v['reason']}", f"next: {v['next_step']}"]
    return "\n".join(lines)


STRICT_REFUSES = ("failing", "too_hard", "no_spread")


class PreflightRefused(ValueError):
    """``preflight = "strict"``: the first batch's verdict is one of :data:`STRICT_REFUSES`."""


def effective_max_tokens(env, args) -> int:
    """The ``max_tokens`` rollouts are sampled with: the run's, else the environment's, else
    ``max_seq_len`` (``merge_sampling_args``' precedence)."""
    from vf_rl.env_api.environment import merge_sampling_args

    merged = merge_sampling_args(getattr(env, "sampling_args", None) or {}, args.sampling_args())
    return merged.get("max_tokens") or args.max_seq_len


def check_first_batch(rollouts: list, env, args) -> Verdict | None:
    """The launcher's pre-flight (``[trainer.args] preflight``): the verdict on a run's first
    batch, printed (the trainer pane shows it), before the trainer trains on it; it costs no
    generation of its own. ``None`` for an empty batch.

    Raises:
        PreflightRefused: ``args.preflight == "strict"`` and the verdict is one of
            :data:`STRICT_REFUSES`.
    """
    group = args.rollouts_per_example
    if not rollouts:
        return None
    report = measure(rollouts, group, effective_max_tokens(env, args), args.max_seq_len)
    found = verdict(report, f"{len(rollouts) // group} x {group}")
    print(f"[vf-rl] pre-flight of batch 1: {found.name}: {found.reason}; next: {found.next_step}", flush=True)
    if args.preflight == "strict" and found.name in STRICT_REFUSES:
        raise PreflightRefused(f"pre-flight (preflight = \"strict\"): {found.name}: {found.reason}; {found.next_step}")
    return found


def has_eval_split(env) -> bool:
    """Whether ``env`` (vf-rl's or an adapted verifiers environment) has eval rows of its own
    (``get_eval_dataset`` falls back to the training rows otherwise)."""
    inner = getattr(env, "env", None)
    return getattr(env, "eval_dataset", None) is not None or getattr(inner, "eval_dataset", None) is not None


def run(env, args, tokenizer, base_url: str, model: str, prompts: int, held_out: bool = True) -> dict[str, Any]:
    """Generate and score ``prompts`` groups of the run's first training rows (and as many
    held-out rows when ``held_out`` and the environment has an eval split) against the server
    at ``base_url``; returns the :func:`measure` report with ``verdict``, ``held_out``,
    ``seconds`` (generation wall clock) and the run's settings added.

    Args:
        args: the run's :class:`~vf_rl.config.rl_config.RLConfig` (rows, sampling, limits).
    Raises:
        RuntimeError: no training row fits ``max_prompt_len``.
    """
    import asyncio
    import time

    from vf_rl.inference.client import openai_client
    from vf_rl.orchestrator.samples import prompt_rows

    rows = prompt_rows(env.get_dataset(), tokenizer, args.max_prompt_len, args.seed if args.shuffle_dataset else None)
    if not rows:
        raise RuntimeError(f"no training row's prompt fits max_prompt_len = {args.max_prompt_len} tokens")
    rows = rows[:prompts]
    eval_rows = (prompt_rows(env.get_eval_dataset(prompts), tokenizer, args.max_prompt_len)
                 if held_out and has_eval_split(env) else [])
    sampling = args.sampling_args()
    group = args.rollouts_per_example

    async def generate():
        client = openai_client(base_url, "vf-rl", timeout=args.request_timeout)
        try:
            train = await env.generate(client, model, rows, group, sampling, args.max_concurrent)
            held = await env.generate(client, model, eval_rows, group, sampling, args.max_concurrent) if eval_rows else []
            return train, held
        finally:
            await client.close()

    start = time.perf_counter()
    rollouts, held = asyncio.run(generate())
    seconds = time.perf_counter() - start
    report = measure(rollouts, group, effective_max_tokens(env, args), args.max_seq_len)
    report["held_out"] = ({"mean": statistics.fmean(r.reward for r in held), "prompts": len(eval_rows)}
                          if held else None)
    report |= {"prompts": len(rows), "rollouts_per_example": group, "seconds": seconds,
               "sampling_args": json.loads(json.dumps(dict(sampling), default=str))}
    report["verdict"] = vars(verdict(report, f"{len(rows)} x {group}"))
    return report
