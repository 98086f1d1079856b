"""Summary statistics of scored rollouts, shared by training batches, evaluation and ``vf-rl eval``."""

from __future__ import annotations

import statistics


def rollout_metrics(rollouts, group_size: int) -> dict[str, float]:
    """Statistics of ``rollouts`` grouped ``group_size`` at a time (rollouts of one example
    together).

    Returns:
        ``reward`` (mean), ``reward/std``, ``reward/within_group_std`` (mean over groups of the
        std within a group: 0 means no group has anything to learn from), ``reward/zero_std_fraction``
        (the share of groups whose rewards are all equal, TRL's ``frac_reward_zero_std``: their
        advantages are 0), ``completions/duplicate_fraction`` (the share of rollouts, failed ones
        left out, whose completion tokens repeat another rollout's of their group), ``reward/<func>`` per
        reward function, ``errors/rate`` and ``errors/<kind>`` (the share of rollouts that failed,
        in all and per kind of :data:`vf_rl.env_api.errors.KINDS`, the kinds present when some
        rollout failed), ``truncated/rate``, ``turns/mean`` (model turns), ``tokens/completion``
        (sampled tokens per rollout) and, for tool-calling rollouts, ``tools/calls`` and
        ``tools/parse_failures`` (per rollout).
    """
    rewards = [r.reward for r in rollouts]
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    metrics = {
        "reward": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "reward/within_group_std": statistics.fmean(statistics.pstdev(g) for g in groups),
        "reward/zero_std_fraction": statistics.fmean(float(max(g) - min(g) <= 1e-9) for g in groups),
        "completions/duplicate_fraction": duplicate_fraction(rollouts, group_size),
        "errors/rate": statistics.fmean(float(r.error is not None) for r in rollouts),
        "truncated/rate": statistics.fmean(float(r.is_truncated) for r in rollouts),
        "turns/mean": statistics.fmean(len(r.turns) for r in rollouts),
        "tokens/completion": statistics.fmean(sum(len(t.completion_ids) for t in r.turns) for r in rollouts),
    }
    if any(r.error is not None for r in rollouts):
        from vf_rl.env_api.errors import KINDS

        for kind in KINDS:
            metrics[f"errors/{kind}"] = statistics.fmean(
                float(r.error is not None and (r.error_kind or "environment") == kind) for r in rollouts)
    if any("tool_calls" in r.state for r in rollouts):  # ToolEnv's counts (env_api/tool_env.py)
        metrics["tools/calls"] = statistics.fmean(r.state.get("tool_calls", 0) for r in rollouts)
        metrics["tools/parse_failures"] = statistics.fmean(r.state.get("tool_parse_failures", 0) for r in rollouts)
    for name in sorted({name for r in rollouts for name in r.metrics}):
        metrics[f"reward/{name}"] = statistics.fmean(r.metrics.get(name, 0.0) for r in rollouts)
    return metrics


def duplicate_fraction(rollouts, group_size: int) -> float:
    """The share of ``rollouts`` (grouped ``group_size`` at a time; failed ones left out) whose
    completion token ids, all model turns together, equal those of an earlier rollout of their
    group; 0.0 when none is left."""
    repeated = counted = 0
    for i in range(0, len(rollouts), group_size):
        seen = set()
        for r in rollouts[i:i + group_size]:
            if r.error is not None:
                continue
            tokens = tuple(t for turn in r.turns for t in turn.completion_ids)
            repeated += tokens in seen
            counted += 1
            seen.add(tokens)
    return repeated / counted if counted else 0.0


def env_metrics(rows: list[dict], rollouts, group_size: int) -> dict[str, float]:
    """``env/<name>/reward`` (mean) and ``env/<name>/rollouts`` per environment of a mixture
    (rows with an ``"env"`` key, ``env_api/mixture.py``; rollouts ``group_size`` per row in row
    order); ``{}`` for a single environment."""
    names = [row.get("env") for row in rows for _ in range(group_size)]
    out = {}
    for name in sorted({n for n in names if n is not None}):
        rewards = [r.reward for r, n in zip(rollouts, names) if n == name]
        out[f"env/{name}/reward"], out[f"env/{name}/rollouts"] = statistics.fmean(rewards), float(len(rewards))
    return out
