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
- every problem found, worst first, each with its figure and next step (:func:`problems`), and
  a verdict: the worst problem when it is fatal or serious, else ``ready`` (:func:`verdict`).

The thresholds (:data:`THRESHOLDS`) are the rules of thumb of verifiers' and prime-rl's guides:
a model that never scores after 10+ attempts per prompt has nothing to learn from ("too hard"),
a baseline of 80% or more leaves little to learn ("too easy"), 10-70% is the range where RL
learns fastest. What is fatal is what leaves every advantage at 0 (no reward spread in any
group: group-relative advantages are the reward minus its group's mean) or nothing to train on
(every rollout failed). Truncation is serious only where the reward cannot be earned by a cut
answer (every answer cut, or cut answers never scoring above the batch's lowest reward while
finished ones do); otherwise a cut answer is graded like any other and the run learns from
its groups' spread (docs: running, "Pre-flight").
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

THRESHOLDS = {
    "ready_low": 0.10,  # 10-70%: the range the guides call good for RL (outside it, an advisory)
    "ready_high": 0.70,
    "too_easy": 0.80,  # guides: "baseline already 80%+: consider harder examples"
    "no_spread_share": 0.50,  # half the groups or more without spread: most of each batch teaches nothing
    "truncated_nearly_all": 0.90,  # nearly every answer cut: the reward only ever grades cut answers
    "truncated_share": 0.50,  # half the rollouts or more cut at max_tokens: listed (serious when cut answers never score)
    "over_max_seq_len_share": 0.10,  # a tenth of the samples or more cut by the trainer at max_seq_len: serious
    "failed_share": 0.50,  # half the rollouts or more failed: fix the causes first
}

SEVERITIES = ("fatal", "serious", "advisory")
"""A problem's severity, worst first: ``fatal`` (the run cannot learn), ``serious`` (it learns
badly or fails: fix first), ``advisory`` (worth knowing; the run can learn)."""


@dataclass
class Verdict:
    """One problem of a pre-flight report, or its ``ready`` verdict.

    ``name`` is one of ``failing``, ``training``, ``lengths``, ``too_hard``, ``constant_reward``,
    ``no_spread``, ``max_seq_len``, ``memory``, ``too_easy``, ``baseline``, or ``ready``;
    ``severity`` one of :data:`SEVERITIES` (``None`` for ``ready``); ``reason`` the measured
    figure behind it; ``next_step`` what to change."""

    name: str
    reason: str
    next_step: str
    severity: str | None = None

    def line(self) -> str:
        """``severity: name: reason; next: next step`` (``ready: reason`` for the verdict ``ready``)."""
        if self.severity is None:
            return f"{self.name}: {self.reason}"
        return f"{self.severity}: {self.name}: {self.reason}; next: {self.next_step}"


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
        of ``max_tokens``; ``cut_reward`` and ``ended_reward``: ``mean`` and ``max`` reward of the
        rollouts that were and were not cut, at ``max_tokens`` or ``max_seq_len``, failed ones
        left out; ``None`` where there are none), ``lengths (``prompt_tokens``, ``completion_tokens`` and
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

    def sample_tokens(r) -> int:
        return len(r.turns[-1].prompt_ids) + len(r.turns[-1].completion_ids) if r.turns else 0

    def rewards_of(cut: bool) -> dict[str, float] | None:
        chosen = [r.reward for r in rollouts
                  if r.error is None and (r.is_truncated or sample_tokens(r) > max_seq_len) == cut]
        return {"mean": statistics.fmean(chosen), "max": max(chosen)} if chosen else None

    return {
        "reward": {"mean": summary["reward"], "std": summary["reward/std"], "min": min(rewards), "max": max(rewards),
                   "functions": {k.removeprefix("reward/"): v for k, v in summary.items()
                                 if k.startswith("reward/") and k not in ("reward/std", "reward/within_group_std")}},
        "groups": {"count": len(groups), "no_spread_share": statistics.fmean(float(max(g) == min(g)) for g in groups),
                   "mean_std": summary["reward/within_group_std"]},
        "truncation": {"rollouts_share": summary["truncated/rate"],
                       "turns_share": statistics.fmean(float(len(t.completion_ids) >= max_tokens) for t in turns)
                       if turns else 0.0, "cut_reward": rewards_of(True), "ended_reward": rewards_of(False)},
        "lengths": {"prompt_tokens": percentiles([len(r.turns[0].prompt_ids) for r in rollouts if r.turns]),
                    "completion_tokens": percentiles([sum(len(t.completion_ids) for t in r.turns) for r in rollouts]),
                    "sample_tokens": percentiles([sample_tokens(r) for r in rollouts if r.turns]),
                    "max_tokens": max_tokens, "max_seq_len": max_seq_len,
                    "over_max_seq_len_share": statistics.fmean(float(sample_tokens(r) > max_seq_len) for r in rollouts)},
        "failures": {"share": summary["errors/rate"],
                     "kinds": {k.removeprefix("errors/"): v for k, v in summary.items()
                               if k.startswith("errors/") and k != "errors/rate" and v > 0},
                     "first": failures},
    }


def problems(report: dict[str, Any], attempts: str) -> list[Verdict]:
    """Every problem a :func:`measure` report shows (``attempts``: e.g. ``"16 x 8"``, for the
    messages), worst first (:data:`SEVERITIES`; in each severity, in the order below). The
    report may also hold ``memory`` (``fits``, ``line``: the launcher's estimate) and ``timing``
    (``error``: the measured training steps failed).

    fatal:
        ``failing``: every rollout failed; ``training``: the run's first training steps failed;
        ``lengths``: ``truncated_nearly_all`` of the rollouts or more were cut and no group has
        reward spread (the cut is why nothing is told apart; listed instead of the problem below);
        ``too_hard``: every rollout scored 0 (or less); ``constant_reward``: every rollout scored
        the same other value; ``no_spread``: no group has reward spread.
    serious:
        ``failing``: ``failed_share`` or more failed; ``too_hard``: mean below ``ready_low`` and
        ``no_spread_share`` of the groups or more without spread (a rare success); ``no_spread``:
        ``no_spread_share`` of the groups or more without spread; ``lengths``:
        ``truncated_nearly_all`` or more cut (the reward only ever grades cut answers), or
        ``truncated_share`` or more cut while no cut answer scores above the batch's lowest reward
        and some finished one does (the reward needs a finished answer); ``max_seq_len``:
        ``over_max_seq_len_share`` or more of the samples longer than ``max_seq_len``; ``memory``:
        the estimate does not fit the GPU.
    advisory:
        ``lengths``: ``truncated_share`` or more cut, the cut answers still scoring (a run whose
        groups have spread learns from them); ``max_seq_len``, ``failing``: fewer; ``too_easy``:
        mean at or above ``too_easy``; ``baseline``: mean outside ``ready_low``-``ready_high``.
    """
    t = THRESHOLDS
    reward, groups, failures = report["reward"], report["groups"], report["failures"]
    trunc, ln = report["truncation"], report["lengths"]
    found: list[Verdict] = []

    def add(severity: str, name: str, reason: str, next_step: str) -> None:
        found.append(Verdict(name, reason, next_step, severity))

    if failures["share"] > 0:
        kind, message = next(iter(failures["first"].items()))
        severity = ("fatal" if failures["share"] >= 1.0 else "serious" if failures["share"] >= t["failed_share"]
                    else "advisory")
        add(severity, "failing", f"{failures['share']:.0%} of the rollouts failed; the first ({kind}): {message}",
            "fix the cause above (docs: troubleshooting) and run the pre-flight again")
        if severity == "fatal":
            return found
    timing = report.get("timing") or {}
    if timing.get("error"):
        add("fatal", "training", f"the run's first training steps failed: {timing['error']}",
            "fix the cause above; the run would stop the same way")
    cut = trunc["rollouts_share"]
    limits = f"max_tokens = {ln['max_tokens']}, max_seq_len = {ln['max_seq_len']}"
    longer = "raise trainer.args.max_tokens (and max_seq_len with it), or ask for shorter answers"
    harder = "add few-shot turns, use an easier split, or warm the model up with vf-sft"
    constant = reward["max"] == reward["min"]
    no_signal = groups["no_spread_share"] >= 1.0
    lengths_fatal = (no_signal and max(cut, ln["over_max_seq_len_share"]) >= t["truncated_nearly_all"]
                     and not (constant and reward["max"] > 0))
    if lengths_fatal:
        add("fatal", "lengths", f"{max(cut, ln['over_max_seq_len_share']):.0%} of the rollouts were cut ({limits}) "
            f"and no group's rewards differ: cut answers are not told apart", longer)
    elif constant and reward["max"] <= 0:
        add("fatal", "too_hard", f"no reward in {attempts} attempts", harder)
    elif constant:
        add("fatal", "constant_reward", f"every rollout scored {reward['max']:.3f}: the reward does not tell "
            "completions apart, so every advantage is 0", "check the reward functions and their weights: a reward "
            "must score better answers higher")
    elif no_signal:
        add("fatal", "no_spread", f"no group's rollouts differ in reward (100% of {groups['count']} groups): zero "
            "advantage everywhere", "raise temperature or rollouts_per_example, or use a reward with partial credit")
    elif reward["mean"] < t["ready_low"] and groups["no_spread_share"] >= t["no_spread_share"]:
        add("serious", "too_hard", f"mean reward {reward['mean']:.3f} and {groups['no_spread_share']:.0%} of the "
            "groups scored all their rollouts alike", harder)
    elif groups["no_spread_share"] >= t["no_spread_share"]:
        add("serious", "no_spread", f"{groups['no_spread_share']:.0%} of the groups scored all their rollouts "
            "the same: zero advantage, nothing to learn from them",
            "raise temperature or rollouts_per_example, use a reward with partial credit, or "
            "use_difficulty_filtering = true")
    if not lengths_fatal and cut >= t["truncated_share"]:
        cut_r, ended_r = trunc.get("cut_reward"), trunc.get("ended_reward")
        scores = (f"cut answers score {cut_r['mean']:.3f} on average" if cut_r else "")
        scores += f", finished ones {ended_r['mean']:.3f}" if cut_r and ended_r else ""
        if cut >= t["truncated_nearly_all"]:
            add("serious", "lengths", f"{cut:.0%} of the rollouts were cut ({limits}): the reward grades cut answers "
                "only" + (f" ({scores})" if scores else ""), longer)
        elif cut_r and ended_r and cut_r["max"] <= reward["min"] < ended_r["max"]:
            add("serious", "lengths", f"{cut:.0%} of the rollouts were cut ({limits}) and no cut answer scores above "
                f"{reward['min']:.3f} while finished ones do ({ended_r['mean']:.3f} on average): the reward needs a "
                "finished answer", longer)
        else:
            learns = ("" if any(p.severity == "fatal" for p in found) else
                      ": the reward grades cut answers too, and the run learns from them, partly to answer within "
                      "max_tokens")
            add("advisory", "lengths", f"{cut:.0%} of the rollouts were cut ({limits}); {scores or 'they score'}{learns}",
                "none needed; to grade whole answers, raise trainer.args.max_tokens (and max_seq_len with it)")
    over = ln["over_max_seq_len_share"]
    if over > 0 and not lengths_fatal:
        add("serious" if over >= t["over_max_seq_len_share"] else "advisory", "max_seq_len",
            f"{over:.0%} of the samples (prompt and completion) are longer than max_seq_len = {ln['max_seq_len']}: "
            "the trainer cuts them", "raise trainer.args.max_seq_len (and vLLM's max_model_len with it)")
    memory = report.get("memory") or {}
    if memory.get("fits") is False:
        add("serious", "memory", memory["line"], "see the estimate's own suggestions above (docs: running, "
            "'Will it fit?')")
    if not any(p.name in ("too_hard", "constant_reward", "no_spread", "lengths") and p.severity == "fatal"
               for p in found):
        if reward["mean"] >= t["too_easy"]:
            add("advisory", "too_easy", f"mean reward {reward['mean']:.3f}, at or above {t['too_easy']:.0%}",
                "use harder examples (another split, fewer few-shot turns)")
        elif not any(p.name == "too_hard" for p in found) and not t["ready_low"] <= reward["mean"] <= t["ready_high"]:
            add("advisory", "baseline", f"mean reward {reward['mean']:.3f}, outside the {t['ready_low']:.0%}-"
                f"{t['ready_high']:.0%} the guides aim for", harder if reward["mean"] < t["ready_low"] else
                "harder examples learn faster")
    return sorted(found, key=lambda p: SEVERITIES.index(p.severity))


def verdict(report: dict[str, Any], attempts: str, found: list[Verdict] | None = None) -> Verdict:
    """The worst of :func:`problems` (``found``, when already computed) when it is ``fatal`` or
    ``serious``; else ``ready`` (the run can learn)."""
    found = problems(report, attempts) if found is None else found
    if found and found[0].severity in ("fatal", "serious"):
        return found[0]
    reward, groups = report["reward"], report["groups"]
    return Verdict("ready", f"the run can learn (mean reward {reward['mean']:.3f}, spread in "
                   f"{1 - groups['no_spread_share']:.0%} of the groups)", "start the run")


def rank(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with ``problems`` (every problem, worst first, as dicts) and ``verdict`` set
    from its figures as they are now (after ``memory`` or ``timing`` were added)."""
    attempts = f"{report['prompts']} x {report['rollouts_per_example']}"
    found = problems(report, attempts)
    report["problems"] = [vars(p) for p in found]
    report["verdict"] = vars(verdict(report, attempts, found))
    return report


def format_report(report: dict[str, Any], timing_lines: tuple[str, ...] | list[str] = ()) -> str:
    """The report (after :func:`rank`) as the text ``--preflight`` prints: the figures, then
    ``timing_lines`` (the launcher's time estimate), every problem worst first, and the verdict."""
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
    lines += list(timing_lines)
    found = [Verdict(**p) for p in report["problems"]]
    lines.append("problems, worst first:" if found else "problems: none")
    for i, p in enumerate(found, 1):
        lines += [f"  {i}. {p.severity}: {p.name}: {p.reason}", f"     next: {p.next_step}"]
    v = Verdict(**report["verdict"])
    if v.severity is None:
        lines.append(f"{v.name}: {v.reason}")
    else:
        lines += [f"verdict: not ready: {v.name} ({v.severity}): {v.reason}", f"next: {v.next_step}"]
    return "\n".join(lines)


STRICT_REFUSES = ("failing", "too_hard", "constant_reward", "no_spread")


class PreflightRefused(ValueError):
    """``preflight = "strict"``: the first batch has a fatal or serious problem named in
    :data:`STRICT_REFUSES`."""


def effective_max_tokens(env, args) -> int:
    """The ``max_tokens`` rollouts are sampled with: the run's, else the environment's, else
    ``max_seq_len`` (``merge_sampling_args``' precedence)."""
    from vf_rl.env_api.environment import merge_sampling_args

    merged = merge_sampling_args(getattr(env, "sampling_args", None) or {}, args.sampling_args())
    return merged.get("max_tokens") or args.max_seq_len


def check_first_batch(rollouts: list, env, args) -> Verdict | None:
    """The launcher's pre-flight (``[trainer.args] preflight``): the verdict on a run's first
    batch and every further problem (:func:`problems`), one line each, printed (the trainer pane
    shows them) before the trainer trains on it; it costs no generation of its own. ``None`` for
    an empty batch.

    Raises:
        PreflightRefused: ``args.preflight == "strict"`` and a fatal or serious problem is one of
            :data:`STRICT_REFUSES`.
    """
    group = args.rollouts_per_example
    if not rollouts:
        return None
    report = measure(rollouts, group, effective_max_tokens(env, args), args.max_seq_len)
    attempts = f"{len(rollouts) // group} x {group}"
    found = problems(report, attempts)
    top = verdict(report, attempts, found)
    lines = [top.line()] + [p.line() for p in found if p is not top]
    print("\n".join(f"[vf-rl] pre-flight of batch 1: {line}" for line in lines), flush=True)
    refused = [p for p in found if p.severity != "advisory" and p.name in STRICT_REFUSES]
    if args.preflight == "strict" and refused:
        p = refused[0]
        raise PreflightRefused(f"pre-flight (preflight = \"strict\"): {p.name} ({p.severity}): {p.reason}; "
                               f"{p.next_step}")
    return top


def has_eval_split(env) -> bool:
    """Whether ``env`` (vf-rl's or an adapted verifiers environment) has eval rows of its own
    (``get_eval_dataset`` falls back to the training rows otherwise)."""
    inner = getattr(env, "env", None)
    return getattr(env, "eval_dataset", None) is not None or getattr(inner, "eval_dataset", None) is not None


def run(env, args, tokenizer, base_url: str, model: str, prompts: int, held_out: bool = True) -> dict[str, Any]:
    """Generate and score the run's first training rows, ``prompts`` groups or at least one
    batch's (``batch_size // rollouts_per_example``), a batch at a time as the run generates
    them (and as many held-out rows when ``held_out`` and the environment has an eval split)
    against the server at ``base_url``; returns the :func:`measure` report after :func:`rank`,
    with ``held_out``, ``seconds`` (generation wall clock), ``generation`` (``batch_s``: seconds
    per whole batch, ``rollouts_per_batch``, ``held_out_s``) and the run's settings added.

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
    group = args.rollouts_per_example
    per_batch = max(1, args.batch_size // group)
    rows = rows[:max(prompts, per_batch)]
    eval_rows = (prompt_rows(env.get_eval_dataset(prompts), tokenizer, args.max_prompt_len)
                 if held_out and has_eval_split(env) else [])
    sampling = args.sampling_args()
    batch_s: list[float] = []

    async def generate():
        client = openai_client(base_url, "vf-rl", timeout=args.request_timeout)
        try:
            train = []
            for i in range(0, len(rows), per_batch):  # a batch at a time, as the run's orchestrator asks
                begun = time.perf_counter()
                train += await env.generate(client, model, rows[i:i + per_batch], group, sampling, args.max_concurrent)
                if len(rows) - i >= per_batch:
                    batch_s.append(time.perf_counter() - begun)
            begun = time.perf_counter()
            held = await env.generate(client, model, eval_rows, group, sampling, args.max_concurrent) if eval_rows else []
            return train, held, time.perf_counter() - begun
        finally:
            await client.close()

    start = time.perf_counter()
    rollouts, held, held_s = asyncio.run(generate())
    seconds = time.perf_counter() - start
    report = measure(rollouts, group, effective_max_tokens(env, args), args.max_seq_len)
    report["held_out"] = ({"mean": statistics.fmean(r.reward for r in held), "prompts": len(eval_rows)}
                          if held else None)
    report |= {"prompts": len(rows), "rollouts_per_example": group, "seconds": seconds,
               "generation": {"batch_s": batch_s, "rollouts_per_batch": per_batch * group,
                              "held_out_s": held_s if held else None},
               "sampling_args": json.loads(json.dumps(dict(sampling), default=str))}
    return rank(report)
