"""Health rules: what a run already logs, read at every step as someone who has watched many runs
would, so that a run that stopped learning says so while it runs.

Each rule reads the step records (what ``metrics.jsonl`` gets for a logged step) and the
evaluation records (``eval/reward``) seen so far and gives a :class:`Reading`: its figure, its
threshold and whether the alarm is raised. Its docstring gives the threshold, the window (logged
steps, or evaluations) and the source of both. :class:`HealthMonitor` keeps the history and each
rule's state; a rule whose cause another raised rule names (:attr:`Rule.explained_by`) is held
down while that one is raised, so one problem raises one alarm. :class:`Health` runs it inside
``RLTrainer`` (``callbacks.RunCallback`` hands it every log): a line in the Trainer pane when a
rule's state changes, ``health/<rule>`` (0 or 1) in every step's record, and ``health_stop``.

The thresholds were set so that the shipped configs' healthy runs raise nothing
(``tests/test_health.py`` replays recorded runs) and chosen runs that cannot learn raise the
right alarm (``tests/test_health_runs.py``); docs/health.md says what each alarm means and what to do.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vf_rl.config.rules import HEALTH_RULES


@dataclass(frozen=True)
class Reading:
    """What a rule read: ``figure`` (the measured value, in words), ``threshold`` (in words) and
    whether the alarm is ``raised``."""

    raised: bool
    figure: str
    threshold: str


@dataclass
class History:
    """The records a run logged so far: ``steps`` (one dict per logged step, with ``step``) and
    ``evals`` (one per evaluation, with ``step`` and ``eval/reward``)."""

    steps: list[dict]
    evals: list[dict]

    def values(self, key: str, last: int | None = None) -> list[float]:
        """``key``'s values over the step records that have it, oldest first (the ``last`` ones)."""
        found = [r[key] for r in self.steps if isinstance(r.get(key), (int, float))]
        return found[-last:] if last else found


def _steps(history: History, n: int) -> str:
    """``steps 6-10`` for the last ``n`` step records."""
    steps = [r["step"] for r in history.steps[-n:]]
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


NO_SIGNAL_SHARE, NO_SIGNAL_WINDOW = 0.9, 5


def _mean_share(history: History, key: str, window: int, threshold: float, what: str) -> Reading | None:
    """Raised when the mean of ``key`` (a share, 0-1) over the last ``window`` logged steps is
    ``threshold`` or more; ``None`` before ``window`` steps have logged it."""
    shares = history.values(key, window)
    if len(shares) < window:
        return None
    share = statistics.fmean(shares)
    return Reading(share >= threshold, f"{share:.0%} {what} over {_steps(history, window)}", f"{threshold:.0%}")


def no_signal(history: History) -> Reading | None:
    """No learning signal: the share of groups whose rewards are all equal
    (``reward/zero_std_fraction``), averaged over the last 5 logged steps, is 90% or more.

    A group whose rollouts all score the same has advantage 0 for every rollout, so it adds
    nothing to the gradient (DAPO, arXiv:2503.14476, section 3.2; TRL logs it as
    ``frac_reward_zero_std``); at 90% a batch of 64 groups trains on 6. The window is the
    pre-flight's one batch (``orchestrator/preflight.py``, which calls half the groups too many
    before training) made five, so that a run whose spread comes and goes is not called dead.
    Measured (docs/health.md): the CPU demo config has next to none; a constant reward has every
    group from step 1.
    """
    return _mean_share(history, "reward/zero_std_fraction", NO_SIGNAL_WINDOW, NO_SIGNAL_SHARE,
                       "of groups without reward spread")


ENTROPY_FLOOR, ENTROPY_FALL, ENTROPY_WINDOW = 0.1, 0.1, 3


def entropy_collapse(history: History) -> Reading | None:
    """Entropy collapse: the median entropy per trained token over the last 3 logged steps is
    below 0.1 nats and below a tenth of the highest such median of the run, while the training
    reward (mean of the same steps) is no higher than over the run's first 3 steps.

    The seed guides: "entropy should decrease but not collapse"; "Model collapse. Symptoms: all
    outputs become identical, entropy -> 0". A healthy run's entropy falls as it learns (Cui et
    al., arXiv:2505.22617), and a run that converged is nearly deterministic with its reward at
    its best, so the rule asks for a fall to nearly nothing without a reward to show for it.
    A median, so that one step alone neither raises nor clears it.
    Measured (docs/health.md): the CPU demo config's entropy falls slowly and stays far above the
    floor; a GPU run that converged went below it with its reward up (not raised); a learning rate
    100 times the demo's took it to 0 within two steps, with the reward at 0.
    """
    entropies = history.values("entropy")
    rewards = history.values("reward")
    if len(entropies) < ENTROPY_WINDOW or len(rewards) < ENTROPY_WINDOW:
        return None
    medians = [statistics.median(entropies[i - ENTROPY_WINDOW:i]) for i in range(ENTROPY_WINDOW, len(entropies) + 1)]
    now, highest = medians[-1], max(medians)
    start, recent = statistics.fmean(rewards[:ENTROPY_WINDOW]), statistics.fmean(rewards[-ENTROPY_WINDOW:])
    raised = now < ENTROPY_FLOOR and now < ENTROPY_FALL * highest and recent <= start
    return Reading(raised, f"entropy {now:.3f} nats over {_steps(history, ENTROPY_WINDOW)} (highest {highest:.3f}), "
                   f"reward {recent:.3f} (first steps {start:.3f})",
                   f"below {ENTROPY_FLOOR} nats and {ENTROPY_FALL:.0%} of the highest, reward not up")


MISMATCH_KL, MISMATCH_WINDOW = 0.1, 3


def mismatch(history: History) -> Reading | None:
    """Sampler/trainer mismatch: the median over the last 3 logged steps of ``mismatch_kl`` (the
    k3 estimate of KL(sampler || trainer) per trained token) is 0.1 nats or more.

    The ratio between the trainer's and the sampler's probabilities of each sampled token carries
    kernel differences, a weight sync that did not arrive, and the optimizer steps between sampling
    and training; the seed guides: "importance_ratio should stay close to 1.0". At 0.1 nats per
    token, CISPO's ratio mask (``mask_ratio_low``/``high``) starts to drop tokens from the loss.
    A median, so that one step alone neither raises nor clears it.
    Measured (docs/health.md): kernel mismatch alone is orders of magnitude below the threshold
    on the CPU and in bf16 on a GPU, the CPU demo config's one-step lag about ten times below it;
    a learning rate 100 times the demo's is ten times above it at its second step.
    """
    kls = history.values("mismatch_kl", MISMATCH_WINDOW)
    if len(kls) < MISMATCH_WINDOW:
        return None
    kl = statistics.median(kls)
    return Reading(kl >= MISMATCH_KL, f"mismatch_kl {kl:.3f} over {_steps(history, MISMATCH_WINDOW)} (median)",
                   f"{MISMATCH_KL}")


TRUNCATED_SHARE, TRUNCATED_RISE, LENGTH_WINDOW = 0.5, 0.2, 5


def length_growth(history: History) -> Reading | None:
    """Length growth to the limit: the share of truncated rollouts (``truncated/rate``, cut at
    ``max_tokens`` or ``max_seq_len``) over the last 5 logged steps is 50% or more and at least
    20 points above its share over the run's first 5 steps.

    The pre-flight calls half the rollouts cut a problem of the first batch (its
    ``truncated_share``); this rule asks for a rise as well, so that a run that starts with many
    cut answers (the pre-flight's business) raises it only if they grow. Growing completions that
    hit the limit are the usual sign of a reward that pays for length (verifiers' and prime-rl's
    ``zero_truncated_completions``/``mask_truncated_completions`` exist for it; DAPO,
    arXiv:2503.14476, section 3.4, overlong reward shaping). Measured (docs/health.md): the CPU
    demo config starts with most answers cut and cuts fewer as it learns; a reward that pays for
    length takes the share to nearly all within about ten steps.
    """
    rates = history.values("truncated/rate")
    if len(rates) < 2 * LENGTH_WINDOW:
        return None
    start, now = statistics.fmean(rates[:LENGTH_WINDOW]), statistics.fmean(rates[-LENGTH_WINDOW:])
    raised = now >= TRUNCATED_SHARE and now - start >= TRUNCATED_RISE
    return Reading(raised, f"{now:.0%} of rollouts truncated over {_steps(history, LENGTH_WINDOW)}, "
                   f"{start:.0%} over the first {LENGTH_WINDOW}",
                   f"{TRUNCATED_SHARE:.0%} and {TRUNCATED_RISE * 100:.0f} points above the start")


HELD_OUT_DROP, HELD_OUT_RELATIVE, REWARD_WINDOW = 0.03, 0.2, 5


def held_out_drop(history: History) -> Reading | None:
    """Reward rising while held-out reward falls: the last evaluation's ``eval/reward`` is below
    the best earlier one by at least 0.03 and by at least 20% of it, while the training reward
    (mean of the last 5 logged steps) is above its mean over the 5 steps up to that best
    evaluation (the first 5 steps when it was the one before training).

    Training reward that rises while the reward on prompts the run never trains on falls is
    reward hacking or over-fitting (Gao et al., arXiv:2210.10760, the proxy reward rising as the
    gold reward falls; the seed guides: check that the reward functions give the expected
    scores). The window is every evaluation since the best; the drop must clear both an absolute
    and a relative margin, so that the noise between evaluations raises nothing.
    Measured (docs/health.md): the CPU demo config's evaluations rise with its reward; a training
    grader with a shortcut took the held-out reward to 0 within two evaluations.
    """
    evals = [r for r in history.evals if isinstance(r.get("eval/reward"), (int, float))]
    rewards = [r for r in history.steps if isinstance(r.get("reward"), (int, float))]
    if len(evals) < 2 or not rewards:
        return None
    best = max(evals[:-1], key=lambda r: r["eval/reward"])
    last = evals[-1]
    at_best = [r["reward"] for r in rewards if r["step"] <= best["step"]][-REWARD_WINDOW:] or \
        [r["reward"] for r in rewards[:REWARD_WINDOW]]
    now = [r["reward"] for r in rewards if r["step"] > best["step"]][-REWARD_WINDOW:]
    if not now:
        return None
    before, after = statistics.fmean(at_best), statistics.fmean(now)
    drop = best["eval/reward"] - last["eval/reward"]
    raised = drop >= max(HELD_OUT_DROP, HELD_OUT_RELATIVE * abs(best["eval/reward"])) and after > before
    return Reading(raised, f"eval/reward {last['eval/reward']:.3f} at step {last['step']}, from "
                   f"{best['eval/reward']:.3f} at step {best['step']}, while reward went {before:.3f} -> {after:.3f}",
                   f"a drop of {HELD_OUT_DROP} and {HELD_OUT_RELATIVE:.0%} while reward rises")


DUPLICATE_SHARE, DUPLICATE_WINDOW = 0.5, 5


def repeated_completions(history: History) -> Reading | None:
    """Repeated completions within groups: the share of rollouts whose completion repeats another
    of their group token for token (``completions/duplicate_fraction``), averaged over the last 5
    logged steps, is 50% or more.

    Identical rollouts of a prompt score alike and teach nothing; the seed guides list
    "degenerate outputs (repetition)" and "all outputs become identical" as instability and
    collapse. At half, a group of 8 has at most 4 distinct answers. Measured (docs/health.md):
    sampling at temperature 1 the CPU demo config repeats next to none; a run that converged
    (reward near its best) may raise it at its end, when there is little left to learn.
    """
    return _mean_share(history, "completions/duplicate_fraction", DUPLICATE_WINDOW, DUPLICATE_SHARE,
                       "of rollouts repeat another of their group")


GRAD_SPIKE, GRAD_WINDOW, GRAD_MIN_STEPS, GRAD_JUMP, GRAD_RECENT = 10.0, 20, 5, 3.0, 5


def grad_spike(history: History) -> Reading | None:
    """Gradient-norm spike: the step's ``grad_norm`` (before clipping) is 10 times the median of
    the (up to) 20 logged steps before it or more, and 3 times the largest of the 5 before it
    (a jump, not a rising trend), once 5 steps are there to compare with.

    Gradient-norm spikes come before loss spikes and divergence (Molybog et al.,
    arXiv:2304.09871; Takase et al., arXiv:2312.16903); a median of the steps before is robust to
    the spike itself. ``max_grad_norm`` clips the update, not the cause.
    Measured (docs/health.md): a long healthy GPU run stays at half the threshold; a run learning
    a shortcut fast has its norm rise ten-fold over ten steps, each step less than 3 times the
    ones before (a trend, not raised).
    """
    norms = history.values("grad_norm", GRAD_WINDOW + 1)
    if len(norms) < GRAD_MIN_STEPS + 1:
        return None
    median, recent = statistics.median(norms[:-1]), max(norms[-GRAD_RECENT - 1:-1])
    if median <= 0:  # no gradient before (no signal): nothing to compare with
        return None
    ratio = norms[-1] / median
    raised = ratio >= GRAD_SPIKE and norms[-1] >= GRAD_JUMP * recent
    return Reading(raised, f"grad_norm {norms[-1]:.3g} at step {history.steps[-1]['step']}, {ratio:.1f} times the "
                   f"median {median:.3g} of the steps before, {norms[-1] / recent:.1f} times their recent largest",
                   f"{GRAD_SPIKE:g} times the median and {GRAD_JUMP:g} times the recent largest")


ERROR_SHARE, ERROR_WINDOW = 0.2, 3


def errors(history: History) -> Reading | None:
    """Failed rollouts: the share of rollouts that failed (``errors/rate``: the environment raised,
    the server could not be reached or timed out), averaged over the last 3 logged steps, is 20%
    or more.

    A failed rollout scores 0 and trains as one (its group's advantage says "worse"), so failures
    teach the model whatever made them. The pre-flight calls half the first batch failing fatal
    (``failed_share``); during training a fifth for three steps running is a cause to look at
    (``errors/<kind>`` says which). Measured (docs/health.md): the recorded runs fail none.
    """
    return _mean_share(history, "errors/rate", ERROR_WINDOW, ERROR_SHARE, "of rollouts failed")


@dataclass(frozen=True)
class Rule:
    """A health rule: its ``name`` (``health/<name>``, and what ``health_stop`` names), the
    function that reads the history, what to do when it is raised, and the rules whose alarm
    explains this one's (``explained_by``: while one of them is raised, this one is held down)."""

    name: str
    read: Callable[[History], Reading | None]
    next_step: str
    explained_by: tuple[str, ...] = ()


_COLLAPSE = ("mismatch", "entropy_collapse")
RULES: dict[str, Rule] = {rule.name: rule for rule in (
    Rule("errors", errors, "read errors/<kind> and the trainer log's error lines; fix the environment or the server"),
    Rule("mismatch", mismatch, "the trainer and the sampler disagree: lower learning_rate (a step moves the policy "
         "too far); keep top_p = 1 and top_k unset; check that the weight syncs reach the server (timing/sync_s)",
         ("entropy_collapse",)),
    Rule("entropy_collapse", entropy_collapse, "the policy became deterministic without a better reward: lower "
         "learning_rate, raise temperature, or set beta > 0; resume from an earlier checkpoint", ("mismatch",)),
    Rule("held_out_drop", held_out_drop, "the training reward pays for something the held-out reward does not: "
         "read the rollouts of recent steps for a shortcut, fix the reward, resume from the best evaluation's "
         "checkpoint"),
    Rule("length_growth", length_growth, "completions grow to max_tokens: check that the reward does not pay for "
         "length; raise max_tokens, or set zero_truncated_completions = true", _COLLAPSE),
    Rule("repeated_completions", repeated_completions, "rollouts of a prompt repeat each other: raise temperature; "
         "if reward is at its best, the run has converged", (*_COLLAPSE, "held_out_drop")),
    Rule("no_signal", no_signal, "check that the reward tells rollouts apart (vf-rl @ cfg --preflight); make the "
         "task easier or harder, raise temperature or rollouts_per_example, give partial credit, or set "
         "use_difficulty_filtering = true",
         ("errors", *_COLLAPSE, "held_out_drop", "length_growth", "repeated_completions")),
    Rule("grad_spike", grad_spike, "lower learning_rate or max_grad_norm; look at the step's rollouts for an "
         "outlier", (*_COLLAPSE, "held_out_drop")),
)}
assert tuple(RULES) == HEALTH_RULES, "config.rules.HEALTH_RULES must name the rules of trainer/health.py"


def line(name: str, reading: Reading, raised: bool) -> str:
    """The pane's line for a state change: ``[vf-rl] health: <rule>: <figure> (threshold <t>);
    next: <what to do>`` when raised, ``...; next: nothing (cleared)`` when cleared."""
    todo = RULES[name].next_step if raised else "nothing (cleared)"
    return f"[vf-rl] health: {name}: {reading.figure} (threshold {reading.threshold}); next: {todo}"


class HealthMonitor:
    """Every rule's state over a run: :meth:`observe` each record (a step's or an evaluation's)
    as it is logged; :meth:`flags` are the ``health/<rule>`` values of the current states.

    One problem, one alarm: a rule whose condition starts while a rule that explains it
    (:attr:`Rule.explained_by`) is raised is held by that one, not raised, for as long as its
    condition lasts; the raised rule stays raised while its own condition or one it holds lasts
    (a learning rate far too high shows as a mismatch first, then a collapse, then no spread and
    repeated answers: one alarm, raised until all of them are gone).
    """

    def __init__(self):
        self.history = History([], [])
        self.raised = dict.fromkeys(RULES, False)
        self.held_by: dict[str, str] = {}
        self.readings: dict[str, Reading] = {}

    def observe(self, record: dict) -> list[tuple[str, bool, Reading]]:
        """Add ``record`` (a step record has ``reward``, an evaluation's ``eval/reward``; others are
        ignored) and read every rule. Returns the rules whose state changed: ``(name, raised, reading)``."""
        if "eval/reward" in record:
            self.history.evals.append(record)
        elif "reward" in record:
            self.history.steps.append(record)
        else:
            return []
        wanted = {}
        for name, rule in RULES.items():
            reading = rule.read(self.history)
            if reading is not None:
                self.readings[name] = reading
            wanted[name] = reading is not None and reading.raised
        self.held_by = {s: c for s, c in self.held_by.items() if wanted[s]}
        changes = []
        for name in RULES:  # a raised rule stays while its condition, or one it holds, lasts
            if self.raised[name] and not wanted[name] and name not in self.held_by.values():
                self.raised[name] = False
                changes.append((name, False, self.readings[name]))
        for name, rule in RULES.items():  # in order: a rule raised here can hold the ones after it
            if not wanted[name] or self.raised[name] or name in self.held_by:
                continue
            cause = next((c for c in rule.explained_by if self.raised[c]), None)
            if cause is not None:
                self.held_by[name] = cause
            else:
                self.raised[name] = True
                changes.append((name, True, self.readings[name]))
        return changes

    def flags(self) -> dict[str, float]:
        """``{"health/<rule>": 0.0 or 1.0}`` for every rule."""
        return {f"health/{name}": float(raised) for name, raised in self.raised.items()}


def replay(records: list[dict]) -> tuple[HealthMonitor, list[tuple[int, str, bool, Reading]]]:
    """Run ``records`` (``metrics.jsonl``'s, in order) through a new monitor. Returns it and every
    state change as ``(step, rule, raised, reading)``."""
    monitor, changes = HealthMonitor(), []
    for record in records:
        changes += [(record.get("step", 0), *change) for change in monitor.observe(record)]
    return monitor, changes


class Health:
    """The health rules inside a run, fed by ``RunCallback.on_log``: a line in the pane at every
    state change, ``health/<rule>`` added to each step's logs (before ``metrics.jsonl`` is
    written), and ``health_stop``: a listed rule's alarm saves a checkpoint of the step and ends
    the run, its line the reason (:attr:`stop_reason`; ``vf-train`` exits non-zero with it).

    A resumed run reads ``metrics.jsonl`` (already cut back to the checkpoint) first, so the
    windows go on where they were and an alarm raised before the checkpoint is not raised again.
    The main process reads the rules; with several processes it tells the others at each step's
    log whether to stop (an evaluation is logged on the main process only).
    """

    def __init__(self, args, state, output_dir: str | Path):
        self.stop_names = set(getattr(args, "health_stop", None) or ())
        self.monitor = HealthMonitor()
        self.pending: str | None = None
        self.stop_reason: str | None = None
        path = Path(output_dir) / "metrics.jsonl"
        if state.global_step > 0 and path.exists():
            self.monitor = replay([json.loads(line) for line in path.read_text().splitlines() if line.strip()
                                   and json.loads(line).get("step", 0) <= state.global_step])[0]

    def on_log(self, args, state, control, logs: dict, say: Callable[[str], None]) -> None:
        """Read ``logs`` (every process calls it; only the main one reads the rules); ``say`` prints
        a line in the pane."""
        step_record = "reward" in logs and "eval/reward" not in logs
        if state.is_world_process_zero:
            for name, raised, reading in self.monitor.observe({"step": state.global_step, **logs}):
                text = line(name, reading, raised)
                say(text)
                if raised and name in self.stop_names and self.pending is None:
                    self.pending = text
            if step_record:
                logs.update(self.monitor.flags())
        stop = self.pending
        if args.world_size > 1:
            if not step_record:
                return
            from accelerate.utils import broadcast_object_list

            stop = broadcast_object_list([stop], from_process=0)[0]
        if stop is not None and self.stop_reason is None:
            self.stop_reason = stop
            control.should_training_stop = control.should_save = True
            if state.is_world_process_zero:
                say(f"[vf-rl] health_stop: ending the run at step {state.global_step} with its checkpoint "
                    f"(resume: --resume)")


def stop_reason(trainer) -> str | None:
    """The line of the health rule that ended ``trainer``'s run (``health_stop``), or ``None``."""
    for callback in trainer.callback_handler.callbacks:
        health = getattr(callback, "health", None)
        if isinstance(health, Health) and health.stop_reason:
            return health.stop_reason
    return None
