"""Every key a run logs (``<output_dir>/metrics.jsonl``, the Trainer pane's lines, Weights & Biases):
what it means, its unit, its healthy range and what to do when it is out of it. The one
declaration: ``docs/metrics.md`` is generated from :data:`METRICS` (``scripts/gen_metrics_page.py``,
and the docs site at build time), and ``tests/test_metric_catalog.py`` fails on a key the code logs
that is not declared here.

A key is exact (``grad_norm``) or a pattern whose ``<placeholder>`` stands for one or more path
segments (``reward/<func>``: one key per reward function). ``eval/<key>`` is every key declared with
``rollouts=True``, computed over the evaluation's rollouts instead of the training batch's.
Pure data: no torch, importable by every process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One logged key.

    Attributes:
        key: the key, or a pattern with ``<placeholder>`` segments.
        group: the title of its group (the page's section), one of :data:`GROUPS`.
        unit: its unit (``"s"``, ``"fraction"``, ``"tokens"``, ``"nats"``, ...).
        meaning: what it measures and where it comes from.
        healthy: its range in a run that learns.
        action: what to do when it is out of that range.
        when: when it is logged, where not at every step of every run.
        console: its label on the Trainer pane's step line (``reward=``), if it is shown there.
        rollouts: a statistic of scored rollouts: also logged as ``eval/<key>`` by an evaluation.
    """

    key: str
    group: str
    unit: str
    meaning: str
    healthy: str
    action: str
    when: str = ""
    console: str = ""
    rollouts: bool = False

    def pattern(self) -> re.Pattern:
        """The regular expression of the keys this entry declares (a placeholder: one or more segments)."""
        return re.compile("^" + "/".join(".+" if re.fullmatch(r"<[^>]+>", s) else re.escape(s)
                                         for s in self.key.split("/")) + "$")


REWARD, POLICY, OPTIM, LENGTHS, FAILURES, FILTER, MIXTURE, TIME, RESOURCES, HEALTH, EVAL, END = (
    "Reward and learning signal", "Policy: importance ratio, entropy, clipping", "Loss and optimizer",
    "Lengths and tokens", "Failed rollouts and tools", "Difficulty filtering", "Several environments or servers",
    "Time and throughput", "Memory, compilation, restarts", "Health alarms", "Evaluation", "End of training")
GROUPS = (REWARD, POLICY, OPTIM, LENGTHS, FAILURES, FILTER, MIXTURE, TIME, RESOURCES, HEALTH, EVAL, END)
"""The page's sections, in order."""

_RATIO_OFF = ("The sampler and the trainer disagree: keep top_p = 1 and top_k unset (the trainer does not model "
              "truncated sampling), check that every weight sync reaches the server (timing/sync_s, "
              "server/reconnects), lower learning_rate if it grows during the run.")
_NO_SIGNAL = ("No group has anything to learn from: raise temperature or rollouts_per_example, give partial "
              "credit in the reward, or turn on use_difficulty_filtering; all 0 from step 1: evaluate the baseline "
              "(vf-rl eval, --preflight).")

METRICS: tuple[Metric, ...] = (
    # --- the batch's rewards (orchestrator/metrics.py, orchestrator/orchestrator.py) ---
    Metric("reward", REWARD, "reward", "Mean reward of the step's rollouts (the rubric's weighted sum).",
           "Rises over the run; a start between 0.1 and 0.7 learns fastest.",
           "Flat at 0: the task is too hard (few-shot turns, an easier split, a vf-sft warm-up). Near 1 from the "
           "start: too easy. Falling after a rise: look at entropy and mismatch_kl, lower learning_rate.",
           console="reward", rollouts=True),
    Metric("reward/std", REWARD, "reward", "Standard deviation of the rewards over all the step's rollouts.",
           "Above 0.", "0: every rollout scored the same; see reward/within_group_std.",
           console="std", rollouts=True),
    Metric("reward/within_group_std", REWARD, "reward",
           "Mean over groups (the rollouts of one prompt) of the reward's standard deviation within the group: "
           "the learning signal, since an advantage is a reward minus its group's mean.",
           "Above 0 and not falling to 0 while the reward is below its best.", _NO_SIGNAL, rollouts=True),
    Metric("reward/zero_std_fraction", REWARD, "fraction of groups", "Groups whose rollouts all scored the same "
           "(TRL's frac_reward_zero_std): their advantages are 0, so they add nothing to the gradient.",
           "Below 0.5; 0 to a few tenths in a run that learns (more late in a run whose reward is near its best).",
           "0.9 or more for 5 steps raises the health rule no_signal. " + _NO_SIGNAL, rollouts=True),
    Metric("reward/<func>", REWARD, "the function's", "Mean unweighted value of each reward function of the "
           "rubric, keyed by the function's name.", "Moves with reward.",
           "A function stuck at its minimum or maximum adds nothing to the signal: check it on a few "
           "completions (vf-rl eval).", rollouts=True),
    Metric("advantage/absmean", REWARD, "reward", "Mean absolute advantage of the step's rollouts.",
           "Above 0; with group_mean about reward/within_group_std, with group_mean_std about 1 in groups with "
           "spread.", "As reward/within_group_std."),
    Metric("completions/duplicate_fraction", REWARD, "fraction of rollouts", "Rollouts whose completion (all model "
           "turns' token ids) repeats another rollout of their group token for token; failed rollouts left out.",
           "Low (a few percent when sampling at temperature 1); it may rise at the end of a run that converged.",
           "Half or more: a group has few distinct answers and teaches little (health rule repeated_completions); "
           "raise temperature, look at entropy.", rollouts=True),
    Metric("off_policy/staleness", REWARD, "steps", "Optimizer steps between the weights the batch was sampled "
           "with and the weights it trains.", "0 to max_off_policy_steps (1 by default).",
           "Above max_off_policy_steps cannot happen; 0 at every step: generation does not overlap training."),
    # --- the policy (algorithm/loss.py) ---
    Metric("importance_ratio", POLICY, "ratio", "Mean over loss tokens of exp(logp_trainer - logp_sampler), each "
           "token against the log-prob it was sampled with.", "About 1 (within 1 +/- 0.01).", _RATIO_OFF,
           console="importance_ratio"),
    Metric("mismatch_kl", POLICY, "nats per token", "k3 estimate of KL(sampler || trainer) per loss token "
           "(r - log r - 1): how far the trainer's distribution is from the one sampled.",
           "Near 0: below 0.01 (a few 1e-3 in bf16, far less in float32).", "As importance_ratio."),
    Metric("logprob_diff/mean", POLICY, "nats", "Mean |logp_trainer - logp_sampler| over loss tokens (kernel "
           "differences, dtype and the step between sampling and training).",
           "Near 0: below 0.1 in bf16, far less in float32.", "As importance_ratio."),
    Metric("logprob_diff/max", POLICY, "nats", "Largest |logp_trainer - logp_sampler| of any loss token.",
           "Below about 1.", "A few tokens far off are masked by cispo's mask_ratio_low and mask_ratio_high; many: as "
           "importance_ratio."),
    Metric("entropy", POLICY, "nats per token", "Mean entropy of the policy's next-token distribution at the "
           "sampling temperature over loss tokens.", "Falls slowly over the run.",
           "Near 0 within a few steps while the reward stalls (entropy collapse): lower learning_rate, raise "
           "temperature. Rising toward log(vocabulary size): the policy is diverging, lower learning_rate.",
           console="entropy"),
    Metric("kl_ref", POLICY, "nats per token", "k3 estimate of KL(policy || reference) per loss token, the "
           "penalty beta weighs (the reference: the base model, or the adapter off with LoRA).",
           "Small and growing slowly.", "Growing fast while the reward falls: raise beta or lower learning_rate.",
           when="beta > 0"),
    Metric("masked/low_fraction", POLICY, "fraction of loss tokens", "Loss tokens dropped because their importance "
           "ratio is below mask_ratio_low.", "Near 0 (below 0.01).", "As importance_ratio.", when="loss_type = \"cispo\""),
    Metric("masked/high_fraction", POLICY, "fraction of loss tokens", "Loss tokens dropped because their importance "
           "ratio is above mask_ratio_high.", "Near 0 (below 0.01).", "As importance_ratio.", when="loss_type = \"cispo\""),
    Metric("tokens/masked_fraction", POLICY, "fraction of loss tokens", "Loss tokens dropped by either mask.",
           "Near 0 (below 0.01).", "As importance_ratio.", when="loss_type = \"cispo\""),
    Metric("clipped/low_fraction", POLICY, "fraction of loss tokens", "Loss tokens with a negative advantage whose "
           "ratio is below 1 - epsilon_low, so the clip removes their gradient.", "A few percent at most.",
           "Large: the policy moves far in one step; lower learning_rate.",
           when="loss_type = \"dapo\", \"grpo\", \"dr_grpo\", \"bnpo\" or \"gspo\""),
    Metric("clipped/high_fraction", POLICY, "fraction of loss tokens", "Loss tokens with a positive advantage whose "
           "ratio is above 1 + epsilon_high, so the clip removes their gradient.", "A few percent at most.",
           "Large: the policy moves far in one step; lower learning_rate.",
           when="loss_type = \"dapo\", \"grpo\", \"dr_grpo\", \"bnpo\" or \"gspo\""),
    Metric("sequence_ratio", POLICY, "ratio", "Mean over loss tokens of their sample's sequence ratio, the geometric "
           "mean of its token ratios.", "About 1.", "As importance_ratio.", when="loss_type = \"gspo\""),
    # --- the optimizer (transformers.Trainer) ---
    Metric("loss", OPTIM, "loss", "The step's loss as backpropagated: the loss function's per-token losses "
           "(plus beta times kl_ref), normalised over the batch.",
           "Finite and near 0; its level says nothing about learning (advantages are centred on each group's "
           "mean): read reward.", "NaN or inf: lower learning_rate, and look at grad_norm.", console="loss"),
    Metric("grad_norm", OPTIM, "norm", "Norm of the whole gradient before clipping (clipped to max_grad_norm, 1.0 "
           "by default).", "Steady, without spikes.",
           "Spikes of 10x its usual value: lower learning_rate. 0 at every step: nothing is trained (no loss "
           "tokens, or every advantage 0: see reward/within_group_std).", console="grad_norm"),
    Metric("learning_rate", OPTIM, "1", "The learning rate of this step (lr_scheduler_type's schedule).",
           "As configured.", "Not what you set: check lr_scheduler_type and warmup_steps."),
    Metric("epoch", OPTIM, "fraction", "transformers' epoch counter; in vf-rl the fraction of max_steps done.",
           "Step / max_steps.", "Nothing to do."),
    # --- lengths (orchestrator/metrics.py, trainer) ---
    Metric("tokens/completion", LENGTHS, "tokens per rollout", "Mean sampled tokens per rollout, all its turns.",
           "Below max_tokens times the turns, without a steady climb to the limit.",
           "Climbing to max_tokens: see truncated/rate.", rollouts=True),
    Metric("truncated/rate", LENGTHS, "fraction of rollouts", "Rollouts cut at max_tokens (a turn) or longer than "
           "max_seq_len.", "Low and not rising: below 0.5.",
           "High from the start: raise max_tokens (and max_seq_len with it) or ask for shorter answers. Rising "
           "during the run: the policy grows its answers to the limit; check that the reward does not pay for "
           "length, set mask_truncated_completions or zero_truncated_completions.", rollouts=True),
    Metric("turns/mean", LENGTHS, "turns per rollout", "Mean model turns per rollout.",
           "1 in a single-turn environment; in a multi-turn one, the turns the task needs.",
           "1 in a multi-turn environment: no rollout got past its first turn (see errors/*, tools/*).",
           rollouts=True),
    Metric("tokens/loss", LENGTHS, "tokens", "Loss tokens (completion tokens trained on) of the batch on this "
           "trainer process.", "Above 0.", "0: every rollout failed or was masked (errors/rate, "
           "mask_truncated_completions)."),
    Metric("tokens/trained", LENGTHS, "tokens", "Tokens forwarded by this trainer process: real tokens, a group's "
           "shared prompt once, no padding.", "Above 0.", "Nothing to do; it sets throughput/train_tokens_per_s."),
    # --- failures and tools ---
    Metric("errors/rate", FAILURES, "fraction of rollouts", "Rollouts that failed: reward 0, no loss tokens (the "
           "reward 0 still enters its group's mean).", "0.",
           "Above 0: the Trainer pane prints each cause once per batch ([orchestrator] batch N: ... failed); fix "
           "that cause (Troubleshooting).", rollouts=True),
    Metric("errors/<kind>", FAILURES, "fraction of rollouts", "Rollouts that failed, by kind: model (the server's "
           "reply), tool, parser, reward (a reward function raised), timeout (generation_timeout), environment.",
           "0.", "The kind says where to look: model: the inference log; tool and parser: the environment's tools "
           "and tool_call_parser; timeout: raise generation_timeout or lower max_tokens.",
           when="a step with a failed rollout", rollouts=True),
    Metric("tools/calls", FAILURES, "calls per rollout", "Mean tool calls per rollout.",
           "Above 0 for a task that needs its tools.", "0: the model never calls a tool: a tool_call_parser that "
           "fits the model, few-shot turns, a vf-sft warm-up.", when="tool environments", rollouts=True),
    Metric("tools/parse_failures", FAILURES, "failures per rollout", "Mean tool calls per rollout that could not "
           "be parsed.", "0, or falling.", "Above 0 and not falling: the model's tool-call format is not the one "
           "tool_call_parser reads.", when="tool environments", rollouts=True),
    # --- difficulty filtering (orchestrator/filtering.py) ---
    Metric("filter/filtered_fraction", FILTER, "fraction of groups", "Groups dropped (no reward spread, or outside "
           "difficulty_min/max_reward) among those generated for the step.", "Below about 0.5.",
           "Near 1: almost no group has spread and most of the generation is thrown away: the task is too hard "
           "or too easy for the model (see reward).", when="use_difficulty_filtering"),
    Metric("filter/extra_rollouts", FILTER, "rollouts", "Rollouts generated beyond the batch's own.",
           "A fraction of batch_size.", "Large: generation costs that many times the batch; see "
           "filter/filtered_fraction.", when="use_difficulty_filtering"),
    Metric("filter/rounds", FILTER, "rounds", "Generation rounds the step took.", "Below max_filter_rounds.",
           "At max_filter_rounds: the batch was filled with dropped groups (a message says so); raise "
           "oversampling_factor or max_filter_rounds.", when="use_difficulty_filtering"),
    Metric("filter/generated_reward", FILTER, "reward", "Mean reward of every rollout generated for the step, "
           "unbiased by the filter (unlike reward).", "Rises over the run.", "As reward.",
           when="use_difficulty_filtering"),
    # --- mixtures and several servers ---
    Metric("env/<name>/reward", MIXTURE, "reward", "Mean reward of each environment's rollouts in a mixture "
           "([[env]] tables).", "Each rises.", "One flat while the others rise: raise its weight, or warm the "
           "model up on it.", when="several environments", rollouts=True),
    Metric("env/<name>/rollouts", MIXTURE, "rollouts", "Rollouts of each environment in the batch.",
           "In proportion to the environments' weight.", "Nothing to do.", when="several environments",
           rollouts=True),
    Metric("servers/<i>/rollouts", MIXTURE, "rollouts", "Rollouts the step sent to server i of "
           "vllm_server_urls.", "About equal over the servers.", "0 for one server: it is not answering "
           "(servers/active).", when="several servers"),
    Metric("servers/active", MIXTURE, "servers", "Servers that get rollouts; one that failed is left out until "
           "the next weight sync reaches it.", "All of vllm_server_urls.",
           "Fewer: a server died or cannot be reached; its log says why.", when="several servers"),
    # --- time (trainer/trainer.py, orchestrator) ---
    Metric("timing/generation_s", TIME, "s", "Seconds to generate and score the step's batch (it runs while "
           "the step before trains).", "About timing/train_s or below.",
           "Much above timing/train_s: generation is the bottleneck (timing/wait_s): more inference GPUs, "
           "a smaller max_tokens, max_off_policy_steps = 2.", console="gen"),
    Metric("timing/wait_s", TIME, "s", "Seconds the trainer waited for the batch.", "Near 0 after step 1.",
           "A large share of the step: generation does not keep up; see timing/generation_s.", console="wait"),
    Metric("timing/train_s", TIME, "s", "Seconds of forward, loss and backward over the batch.", "Steady.",
           "Growing: longer completions (tokens/trained); on a GPU see compile/recompiles.", console="train"),
    Metric("timing/sync_s", TIME, "s", "Seconds the trainer spent on the weight sync (with nccl and ipc the push "
           "overlaps the next step: only its snapshot counts).", "A small share of the step.",
           "Large: another weight_sync (GPU layouts and weight sync).", console="sync"),
    Metric("timing/sync_push_s", TIME, "s", "Seconds the last weight push took from start to the server's reply.",
           "Below timing/train_s, so the push hides under the next step.", "Above it: larger buckets "
           "(weight_sync_bucket_mb) or weight_sync = \"lora\".", when="weight_sync = \"nccl\" or \"ipc\""),
    Metric("timing/elapsed_s", TIME, "s", "Seconds since the server first answered (start-up excluded); starts "
           "again at a resume.", "Rises by the step's time.", "Nothing to do."),
    Metric("throughput/generation_tokens_per_s", TIME, "tokens/s", "Completion tokens of the batch divided by "
           "timing/generation_s.", "Steady.", "Falling: longer prompts or the server's KV cache is full "
           "(inference log)."),
    Metric("throughput/train_tokens_per_s", TIME, "tokens/s", "tokens/trained divided by timing/train_s.",
           "Steady.", "Falling: see timing/train_s."),
    # --- resources ---
    Metric("memory/peak_gib", RESOURCES, "GiB", "Most memory PyTorch held in tensors on this trainer GPU during "
           "the step, the weight push included.", "Below the GPU's memory, less vLLM's share on a shared GPU.",
           "Near the limit: micro_batch_size or micro_batch_tokens lower, gradient_checkpointing = true (the "
           "launch's memory estimate says what each part takes).", when="a GPU trainer"),
    Metric("memory/reserved_peak_gib", RESOURCES, "GiB", "Most memory PyTorch's allocator reserved on this GPU "
           "during the step (what nvidia-smi counts, less the CUDA context).", "As memory/peak_gib.",
           "As memory/peak_gib; far above memory/peak_gib: fragmentation, "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.", when="a GPU trainer"),
    Metric("oom/splits", RESOURCES, "micro batches", "Micro batches split in two since the trainer started, after "
           "running out of GPU memory or for being at least the size that did (the step's gradient is unchanged).",
           "0.", "Above 0: the step pays a retry; lower micro_batch_size or micro_batch_tokens to stop it."),
    Metric("compile/recompiles", RESOURCES, "frames", "Frames torch.compile compiled since the warm-up compile "
           "ended.", "0.", "Rising: a guard fails and each compile costs seconds of a step; TORCH_LOGS=recompiles "
           "names it."),
    Metric("server/reconnects", RESOURCES, "restarts", "Times the trainer waited for a restarted inference server "
           "and pushed the current weights to it.", "0.",
           "Above 0: the server was killed (often out of memory) or its vLLM engine died; "
           "<output_dir>/logs/inference.restarts lists when."),
    # --- health alarms ---
    Metric("health/<rule>", HEALTH, "0 or 1", "1 while a health rule's alarm is raised, 0 otherwise, one key per "
           "rule (errors, mismatch, entropy_collapse, held_out_drop, length_growth, repeated_completions, "
           "no_signal, grad_spike: docs/health.md); the Trainer pane prints a line when a rule's state changes.", "0.",
           "The pane's line gives the figure, the threshold and the next step; health_stop names rules that end "
           "the run."),
    # --- evaluation (RLTrainer.evaluate) ---
    Metric("eval/<key>", EVAL, "as the key", "Each rollout statistic above (the keys marked eval/ in their group) "
           "over the evaluation's rollouts of the environment's eval split, with the current weights: eval/reward "
           "is the held-out reward.", "eval/reward rises with reward.",
           "reward rising while eval/reward falls: the policy learns something the held-out rows do not reward "
           "(reward hacking, or too few training rows).", when="eval_strategy = \"steps\""),
    Metric("eval/timing_s", EVAL, "s", "Seconds the evaluation took.", "Small beside eval_steps steps.",
           "Large: fewer num_eval_examples or eval_rollouts_per_example.", when="eval_strategy = \"steps\""),
    # --- the record and the end of training (transformers.Trainer) ---
    Metric("step", END, "step", "The optimizer step the record belongs to (every line of metrics.jsonl).",
           "Rises by 1.", "Nothing to do."),
    Metric("train_runtime", END, "s", "transformers' seconds of Trainer.train, start-up after the model load "
           "included.", "", "Nothing to do.", when="the last record"),
    Metric("train_loss", END, "loss", "Mean of loss over the run's steps.", "Finite.", "As loss.",
           when="the last record"),
    Metric("train_samples_per_second", END, "1/s", "transformers' count of its own placeholder samples (a step's "
           "micro_batch_size), not rollouts: use throughput/*.", "", "Nothing to do.", when="the last record"),
    Metric("train_steps_per_second", END, "steps/s", "Optimizer steps per second of train_runtime.", "",
           "Nothing to do.", when="the last record"),
    Metric("total_flos", END, "FLOPs", "transformers' estimate of the floating-point operations (from its "
           "placeholder inputs: not the real count).", "", "Nothing to do.", when="the last record"),
)
"""Every key vf-rl logs, in the page's order."""


def find(key: str) -> Metric | None:
    """The entry that declares ``key``: an exact key first, then a pattern (``eval/<key>`` for an
    ``eval/`` key whose rest is a ``rollouts`` entry's); ``None`` when none does."""
    exact = {m.key: m for m in METRICS}
    if key in exact:
        return exact[key]
    if key.startswith("eval/"):
        inner = find(key.removeprefix("eval/"))
        if inner is not None and inner.rollouts:
            return exact["eval/<key>"]
    return next((m for m in METRICS if "<" in m.key and m.key != "eval/<key>" and m.pattern().match(key)), None)


def step_line_keys() -> list[tuple[str, str]]:
    """``(label, key)`` of each key the Trainer pane's step line shows, in :data:`METRICS` order."""
    return [(m.console, m.key) for m in METRICS if m.console]
