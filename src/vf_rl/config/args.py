"""vf-rl's own trainer arguments (``[trainer.args]`` in a vf-rl TOML), without torch or transformers.

``RLArgs`` declares every key vf-rl adds to ``transformers.TrainingArguments`` and the
TrainingArguments defaults it changes for RL. :class:`vf_rl.RLConfig` is ``RLArgs`` on top of
``TrainingArguments``; the launcher validates ``[trainer.args]`` against these fields without
importing torch (``config/rules.py``), and ``scripts/gen_config_table.py`` writes the README's
table from them. Defaults follow the seed docs; where the docs and the original code disagree we
chose (README "Configuration"): LoRA rank 16 / alpha 16 (docs), temperature 1.0 (tutorial and
code).
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
                     "presence_penalty": 0.0, "frequency_penalty": 0.0}
"""The built-in value of each sampling key left unset (``None``) by the user and by the
environment (precedence: the user's value > the environment's ``sampling_args`` > this)."""

OLDER_NAMES = {"num_generations": "rollouts_per_example", "num_batches_ahead": "max_off_policy_steps"}
"""Older key names of the seeds (TRL / verifiers GRPOTrainer) with the same meaning: accepted
on both paths and mapped to the current key."""
REFUSED_NAMES = {"num_iterations": "each batch gets one optimizer step (num_iterations = 1); remove the key"}
"""Older key names with no current key of that meaning: refused with this hint."""
TRL_NAMES = {"max_completion_length": "max_tokens", "max_prompt_length": "max_prompt_len", "epsilon": "epsilon_low",
             "scale_rewards": "advantage_type", "importance_sampling_level": "loss_type",
             "vllm_gpu_memory_utilization": "inference.args.gpu_memory_utilization",
             "vllm_tensor_parallel_size": "inference.args.tensor_parallel_size"}
"""TRL ``GRPOConfig`` keys that are no key here, and the vf-rl key of that meaning (a ``[trainer.args]``
key, or a dotted path in another table): an unknown key of these names is refused with a pointer to it.
TRL's names that vf-rl keeps (``beta``, ``epsilon_high``, ``loss_type``, ``temperature``...) need none;
``num_generations`` is an older name (``OLDER_NAMES``); ``per_device_train_batch_size`` (``micro_batch_size``)
and ``gradient_accumulation_steps`` are TrainingArguments keys that ``rules.py`` points to the keys to use."""
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""``torch_compile_mode`` values that replay CUDA graphs, micro batches padded to a few shapes:
``"reduce-overhead"`` records the compiled decoder layers (``trainer/speed/layer_graphs.py``),
``"max-autotune"`` compiles the decoder stack as one region of inductor's CUDA graphs
(``trainer/model.py: compile_model``)."""


@dataclass
class RLArgs:
    """vf-rl's trainer arguments (see :class:`vf_rl.RLConfig`, which adds TrainingArguments').

    Units: lengths in tokens, timeouts in seconds, ``batch_size`` and ``micro_batch_size`` in
    rollouts (samples). Sampling keys left ``None`` take the environment's value, else
    ``SAMPLING_DEFAULTS``.
    """

    # LoRA
    use_lora: bool = field(default=True, metadata={"help": "Train a LoRA adapter (peft) instead of all weights."})
    lora_rank: int = field(default=16, metadata={"help": "LoRA rank r."})
    lora_alpha: float = field(default=16, metadata={"help": "LoRA alpha (scale = alpha / r, or alpha / sqrt(r) with rsLoRA)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: Any = field(default=None, metadata={"help": "Module names to adapt, or \"all-linear\"; default q,k,v,o,gate,up,down projections."})
    lora_modules_to_save: list[str] | None = field(default=None, metadata={"help": "Modules trained in full next to the adapter."})
    lora_use_rslora: bool = field(default=False, metadata={"help": "Rank-stabilised LoRA scaling."})
    lora_config: Any = field(default=None, metadata={"help": "A ready peft LoraConfig (Python API only); overrides the lora_* keys."})
    # Batch
    rollouts_per_example: int = field(default=16, metadata={"help": "Rollouts per prompt (group size, >= 2)."})
    batch_size: int = field(default=512, metadata={"help": "Rollouts per optimizer step (global)."})
    micro_batch_size: int = field(default=8, metadata={"help": "Rollouts per forward/backward pass per process."})
    padding_free: bool = field(default=True, metadata={"help": "Form micro batches by a token budget (micro_batch_tokens) and pack each into one row of real tokens (no padding; attention stays within each sample) where that saves work, instead of padding micro_batch_size rows."})
    micro_batch_tokens: int | None = field(default=None, metadata={"help": "padding_free only: up to this many real tokens per forward/backward pass per process, any number of samples (a shared prompt counts once). None: micro_batch_size x the batch's mean sample length (the real tokens of an average padded micro batch). A micro batch runs as one packed row when that removes at least 10% of its padded tokens, else padded."})
    share_prompts: bool = field(default=True, metadata={"help": "padding_free only: rollouts of one prompt in a micro batch compute the prompt once and attend to its keys/values (same log-probs and gradients, fewer tokens)."})
    max_seq_len: int = field(default=2048, metadata={"help": "Longest training sequence (prompt + completion), tokens."})
    max_prompt_len: int = field(default=512, metadata={"help": "Prompts longer than this (tokens) are filtered out."})
    max_concurrent: int = field(default=1024, metadata={"help": "Most rollouts in flight at once."})
    orchestrator_process: bool = field(default=True, metadata={"help": "Generate rollouts in a separate process, so that the trainer's Python does not slow them (false: a thread in the trainer process; environments that cannot be sent to another process use the thread too)."})
    # Algorithm (algorithm/loss.py, algorithm/advantage.py)
    loss_type: str = field(default="cispo", metadata={"help": "Policy loss: \"cispo\" (CISPO with importance-ratio masking), \"dapo\" (PPO/GRPO clipped surrogate with DAPO's clip-higher, the batch's token mean), TRL's \"grpo\" (each sample's token mean, then the mean over samples), \"dr_grpo\" (summed, over samples x max_tokens), \"bnpo\" (token mean over each trainer process's share), \"gspo\" (sequence-level ratio, GSPO), or \"module:function\" for your own (see examples/custom_loss.py); docs/algorithm.md has each formula."})
    advantage_type: str = field(default="group_mean", metadata={"help": "Advantage: \"group_mean\" (reward minus its group's mean) or \"group_mean_std\" (also divided by the group's std, GRPO), or \"module:function\"."})
    epsilon_low: float = field(default=0.2, metadata={"help": "loss_type = \"dapo\", \"grpo\", \"dr_grpo\", \"bnpo\" or \"gspo\": ratios below 1 - epsilon_low are clipped (TRL's epsilon)."})
    epsilon_high: float = field(default=0.28, metadata={"help": "loss_type = \"dapo\", \"grpo\", \"dr_grpo\", \"bnpo\" or \"gspo\": ratios above 1 + epsilon_high are clipped (DAPO's clip-higher; TRL's default is epsilon_high = epsilon, 0.2)."})
    # Online difficulty filtering (orchestrator/filtering.py; DAPO's dynamic sampling, arXiv:2503.14476)
    use_difficulty_filtering: bool = field(default=False, metadata={"help": "Drop groups whose rewards have (near) zero spread (no gradient) before training and refill the batch by generating more groups."})
    difficulty_threshold: float = field(default=0.0, metadata={"help": "With filtering: groups whose reward std is at or below this (plus 1e-6) are dropped."})
    difficulty_min_reward: float | None = field(default=None, metadata={"help": "With filtering: also drop groups whose mean reward is below this (too hard)."})
    difficulty_max_reward: float | None = field(default=None, metadata={"help": "With filtering: also drop groups whose mean reward is above this (too easy)."})
    oversampling_factor: float = field(default=1.0, metadata={"help": "With filtering: the first round generates this many times the batch's groups (>= 1)."})
    max_filter_rounds: int = field(default=4, metadata={"help": "With filtering: most generation rounds per batch; a batch still short then is filled with dropped groups (zero advantage) and a message."})
    # KL to the reference policy
    beta: float = field(default=0.0, metadata={"help": "KL penalty to the reference policy (k3 estimator on the trained tokens, logged as kl_ref); LoRA: the base model (adapter off); full weights: a frozen copy (its memory)."})
    # Off-policy depth
    max_off_policy_steps: int = field(default=1, metadata={"help": "Generation runs up to this many steps ahead of training (older name: num_batches_ahead); 1 = one step off-policy."})
    # Loss masks
    mask_ratio_low: float = field(default=0.125, metadata={"help": "loss_type = \"cispo\": drop tokens whose importance ratio is below this."})
    mask_ratio_high: float = field(default=8.0, metadata={"help": "loss_type = \"cispo\": drop tokens whose importance ratio is above this."})
    mask_env_responses: bool = field(default=True, metadata={"help": "Exclude environment-written tokens from the loss."})
    preflight: str = field(default="warn", metadata={"help": "Check the first batch of a run (not of a resumed one) before training on it, as `vf-rl @ cfg --preflight` does (vf_rl.orchestrator.preflight): \"warn\" prints the verdict (baseline reward, groups without spread, truncation, failures) and goes on, \"strict\" stops the run when the verdict is failing, too_hard or no_spread, \"off\" skips it. It only reads the batch the run generates anyway."})
    health_stop: list[str] | None = field(default=None, metadata={"help": "Health rules whose alarm ends the run (docs/health.md): a checkpoint of that step (it resumes with --resume), the rule's line as the reason, exit status 7. Any of errors, mismatch, entropy_collapse, held_out_drop, length_growth, repeated_completions, no_signal, grad_spike. None (or []): every alarm is printed in the Trainer pane and logged (health/<rule>), and the run goes on."})
    mask_truncated_completions: bool = field(default=False, metadata={"help": "Exclude truncated rollouts (a turn cut off at max_tokens, or longer than max_seq_len) from the loss."})
    zero_truncated_completions: bool = field(default=False, metadata={"help": "Give truncated rollouts (cut off at max_tokens, or longer than max_seq_len) reward 0."})
    # Sampling
    max_tokens: int | None = field(default=None, metadata={"help": "Most new tokens per model turn (None: the environment's, else max_seq_len)."})
    temperature: float | None = field(default=None, metadata={"help": "Sampling temperature; the trainer's log-probs use it too (None: the environment's, else 1.0)."})
    top_p: float | None = field(default=None, metadata={"help": "Nucleus sampling threshold (None: the environment's, else 1.0)."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k sampling (None: the environment's, else off)."})
    min_p: float | None = field(default=None, metadata={"help": "Min-p sampling threshold (None: the environment's, else 0.0)."})
    repetition_penalty: float | None = field(default=None, metadata={"help": "vLLM repetition penalty (None: the environment's, else 1.0)."})
    presence_penalty: float | None = field(default=None, metadata={"help": "OpenAI presence penalty (None: the environment's, else 0.0)."})
    frequency_penalty: float | None = field(default=None, metadata={"help": "OpenAI frequency penalty (None: the environment's, else 0.0)."})
    # Inference server
    vllm_server_host: str = field(default="127.0.0.1", metadata={"help": "Host of the vf-vllm server."})
    vllm_server_port: int = field(default=8000, metadata={"help": "Port of the vf-vllm server."})
    vllm_server_urls: list[str] | None = field(default=None, metadata={"help": "Several vf-vllm servers, e.g. [\"http://10.0.0.2:8000\", \"http://10.0.0.3:8000\"]: rollouts are spread over them (a group per server, least loaded first) and every weight sync reaches each. Default: the one at vllm_server_host:vllm_server_port."})
    vllm_server_timeout: float = field(default=300.0, metadata={"help": "Seconds to wait for the server to come up."})
    generation_timeout: float = field(default=600.0, metadata={"help": "Seconds allowed for generating one batch; rollouts not finished by then count as errors."})
    request_timeout: float = field(default=600.0, metadata={"help": "Seconds allowed for one request to the inference server (a chat completion)."})
    stall_warning_timeout: float = field(default=120.0, metadata={"help": "Seconds a wait on another process (the trainer on the orchestrator's batch or on a weight push, the orchestrator on vLLM) may go without progress (no rollout done, no request answered, no token generated) before the watchdog prints one line naming who waits on whom for what, with the other side's state (docs/faults.md)."})
    stall_timeout: float = field(default=480.0, metadata={"help": "Seconds such a wait may go without progress before the run stops with the watchdog's line as its reason, a checkpoint of the last complete step and exit status 5 (vf-train --resume goes on from it). Below generation_timeout, so that a stopped server is named rather than counted as timed-out rollouts."})
    # Weight sync
    weight_sync: str = field(default="auto", metadata={"help": "How new weights reach vLLM: \"filesystem\" (a safetensors file), \"nccl\" (GPU-to-GPU broadcast; trainer and server on different GPUs), \"ipc\" (CUDA IPC; trainer and server on one GPU), \"lora\" (adapter only, hot-loaded) or \"auto\" (nccl when the trainer and vLLM are on different GPUs of this machine, ipc when they share the trainer's GPU, else filesystem)."})
    weight_sync_port: int = field(default=0, metadata={"help": "TCP port for forming the NCCL weight-sync group (0: a free port)."})
    weight_sync_bucket_mb: int = field(default=1024, metadata={"help": "Largest flat buffer per NCCL broadcast or CUDA IPC buffer, MiB."})
    # Other
    shuffle_dataset: bool = field(default=True, metadata={"help": "Shuffle the training rows once (seeded by `seed`)."})
    use_liger: bool = field(default=True, metadata={"help": "Use liger-kernel when installed (GPU only, with torch_compile = false; a warning when it is not installed)."})
    torch_compile: bool | None = field(default=None, metadata={"help": "Compile each decoder layer in place with torch.compile (torch_compile_backend, default inductor; torch_compile_mode; with torch_compile_mode = 'reduce-overhead' the compiled layers then recorded as CUDA graphs, with 'max-autotune' the whole decoder stack as inductor's CUDA graphs with autotuned kernels instead; either pads micro batches to a few shapes); it compiles on two synthetic batches before the first step (while vf-vllm starts, unless [inference] shared), and liger-kernel is not applied. None: on with a GPU (without DeepSpeed), where small models' steps are bound by the host's Python, off on the CPU. torch_compile_mode unset: 'reduce-overhead' with one trainer process, padding_free and neither gradient_checkpointing nor tiled_mlp (faster, docs/benchmarks.md), else each layer compiled without graphs."})
    activation_offloading: bool = field(default=False, metadata={"help": "With gradient_checkpointing on a GPU: keep each decoder layer's checkpointed input in pinned host memory from the forward to the backward (transformers' gradient checkpointing offload), freeing layers x tokens x hidden x 2 bytes of GPU memory per pass for a copy each way; for long sequences. On the CPU it changes nothing."})
    tiled_mlp: bool = field(default=False, metadata={"help": "Run each decoder layer's MLP over the sequence in tiles of about hidden_size tokens, keeping none of its [tokens, intermediate_size] tensors for the backward pass (recomputed tile by tile there, as ALST's TiledMLP): the MLP's share of the activation memory, most of a layer's at 7-8B, for one more MLP forward; for long sequences, with gradient_checkpointing and activation_offloading. Needs lora_dropout = 0."})
    attn_implementation: str | None = field(default=None, metadata={"help": "Attention kernel; default flash_attention_2 when installed (GPU, bf16), else sdpa."})

    # TrainingArguments fields whose defaults differ for RL
    output_dir: str | None = field(default=None, metadata={"help": "Default outputs/<run_name>."})
    run_name: str | None = field(default="vf-rl", metadata={"help": "Run name (output directory and trackers)."})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate."})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "constant, linear, cosine, ... (transformers names)."})
    max_steps: int = field(default=500, metadata={"help": "Optimizer steps (one batch each)."})
    max_time_s: float | None = field(default=None, metadata={"help": "Stop after the first step that ends this many seconds after step 1 ended (step 1's server wait, model warm-up and compile are not counted); that step is saved and evaluated as the last of max_steps would be. None: stop at max_steps only."})
    save_steps: float = field(default=50, metadata={"help": "Checkpoint every N steps (the last step is always saved)."})
    save_only_model: bool = field(default=False, metadata={"help": "Checkpoints hold weights only (no optimizer/scheduler/RNG state: cannot resume exactly)."})
    resume_from_checkpoint: bool | str | None = field(default=None, metadata={"help": "true: resume from the last checkpoint in output_dir; or a checkpoint path."})
    eval_on_start: bool | None = field(default=None, metadata={"help": "Evaluate before the first step (default: on when eval_strategy is not \"no\")."})
    num_eval_examples: int = field(default=64, metadata={"help": "Examples of the environment's eval split used per evaluation (-1: all)."})
    eval_rollouts_per_example: int | None = field(default=None, metadata={"help": "Rollouts per eval example (default rollouts_per_example)."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N steps."})
    log_rollouts_every: int = field(default=5, metadata={"help": "Write the rollouts of step 1, of every N-th step and of the last to <output_dir>/rollouts/step-NNNNNN.jsonl.gz, one JSON line per rollout: group, prompt, completion, expected answer, reward, advantage (vf-rl view shows them). 0: none."})
    report_to: Any = field(default="none", metadata={"help": "\"none\" or \"wandb\"."})
    wandb: dict | None = field(default=None, metadata={"help": "[trainer.args.wandb] table: project, name (with report_to = \"wandb\")."})
    bf16: bool | None = field(default=None, metadata={"help": "bfloat16 training; default on with CUDA, off on the CPU."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Kept False: batches are built by the orchestrator."})
    dataloader_pin_memory: bool = field(default=False, metadata={"help": "Kept False: the trainer's data loader only counts steps (batches come from the orchestrator)."})
    # Older names (OLDER_NAMES, REFUSED_NAMES): mapped to the current key, never read
    num_generations: int | None = field(default=None, metadata={"help": "Older name of rollouts_per_example.", "older_name": True})
    num_batches_ahead: int | None = field(default=None, metadata={"help": "Older name of max_off_policy_steps.", "older_name": True})
    num_iterations: int | None = field(default=None, metadata={"help": "Not supported: one optimizer step per batch.", "older_name": True})


def rl_fields() -> dict[str, dataclasses.Field]:
    """RLArgs' fields by name (vf-rl's keys and the TrainingArguments defaults it changes),
    the older names left out."""
    return {f.name: f for f in dataclasses.fields(RLArgs) if not f.metadata.get("older_name")}


class SamplingArgs(dict):
    """Chat-completion arguments that know which of their keys only hold a built-in default
    (``defaults``: top-level names, and ``extra_body.<name>`` inside ``extra_body``): an
    environment's own value replaces those, never the ones a user set."""

    def __init__(self, values=(), defaults=()):
        super().__init__(values)
        self.defaults = frozenset(defaults)
