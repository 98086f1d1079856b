"""The trainer's peak GPU memory per process, estimated from the model's config and the run's
sizes before anything starts (``vf-rl @ cfg --dry-run``, the launch, ``--preflight``).

The estimate adds six parts (bytes; activations in the model's bf16):

* **weights**: ``2 P`` (``P`` parameters, bf16).
* **gradients** and **optimizer state**: full fine-tuning keeps bf16 gradients and torch AdamW's
  two moments in the parameters' dtype, ``2 P + 4 P``, plus one LM-head-sized gradient (``2 V h``)
  that backward holds before it is added to the tied embedding's; LoRA keeps the adapter (``A``
  trainable parameters) in float32 with float32 gradients and moments, ``16 A`` in all.
* **activations**: what autograd keeps for backward, per token of a forward pass and per decoder
  layer, counted from the tensors a Llama/Qwen2-style layer saves (hidden size ``h``, MLP size
  ``I``, key/value width ``kv``): eager ``22 h + 4 kv + 8 I`` (two RMSNorms keep their float32
  input and bf16 output, 6 h each; the q/k/v and o projections' inputs, q/k/v after RoPE and the
  attention output, 8 h + 4 kv; the MLP's input, gate, up, SiLU and product, 2 h + 8 I), and
  ``14 h + 4 kv + 6 I`` with fused layers (``torch_compile`` or liger-kernel: a norm keeps only
  its bf16 input, the SiLU is recomputed). Gradient checkpointing keeps each layer's input
  (``2 h``; in host memory with ``activation_offloading``) and recomputes one layer at a time,
  whose saved tensors and their gradients are live at once in its backward (twice the per-layer
  count; within 8% of the 8B LoRA peaks at 4k-128k tokens). Layers recorded as CUDA graphs
  (``torch_compile_mode = "reduce-overhead"``, ``trainer/speed/layer_graphs.py``) count them twice: a
  recording's warm-up passes leave a pass's activations in the allocator's cache while its capture
  takes them again from the graphs' pool. ``tiled_mlp`` drops the ``8 I`` /
  ``6 I`` of every layer and adds one tile's (``hidden`` tokens) and their gradients. The count
  follows Korthikanti et al., *Reducing Activation Recomputation in Large Transformer Models*
  (2022), section 4, for these layers, with memory-efficient attention (no ``[s, s]`` scores).
* **logits**: the log-probs of the trained tokens come from the LM head in chunks
  (``trainer/speed/logprobs.py``): the bf16 ``[M, V]`` logits of a pass's ``M`` trained tokens are kept
  when they take at most ``LOGPROB_KEEP_BYTES``, and two float32 chunks of at most
  ``LOGPROB_CHUNK_BYTES`` are live at once.
* **weight sync**: the ``ipc`` and ``nccl`` transports pack the merged weights into flat buffers
  on the trainer's GPU (``2 P``; ``ipc`` keeps them for the workers to read, ``nccl`` holds them
  while the next step runs), one merged weight at a time (``trainer/weights.merged_tensors``).
  ``filesystem`` and ``lora`` take no GPU memory for it.

The tokens of a pass are what the trainer forwards at once (:func:`pass_tokens`):
``micro_batch_tokens`` when set, else ``micro_batch_size`` x the batch's mean sample length
(``packing.default_token_budget``), and at most the process's share of the batch, each group's
prompt once with ``share_prompts``; before any rollout the bound ``micro_batch_size x
max_seq_len`` stands in for it. Checked (``tests/test_memory.py``) against every peak the
trainer-step benchmarks measured (``docs/benchmarks.md``: within 25% on each,
most within 10%) and against the learning benchmarks' whole-GPU peaks with vLLM
(``learning-*.json``: within 21% on each single-turn run, for the environment's prompts and
completions at ``max_tokens``; -5% to +40% on the multi-turn runs, estimated at their bound of
``max_seq_len`` tokens per sample). Not modelled: mixture-of-experts layers (counted as dense), DeepSpeed ZeRO
stages below 3, the CUDA context and the allocator's cached blocks (``CUDA_OVERHEAD_BYTES`` is
added when comparing with a GPU's memory).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from vf_rl.config.gpus import gpu_total_bytes, trainer_gpu_of, visible_gpus

GIB = 2**30
GPU_80GB_BYTES = 85_520_809_984
"""An 80 GB H100's ``torch.cuda.get_device_properties().total_memory`` (79.6 GiB)."""
CUDA_OVERHEAD_BYTES = int(1.5 * GIB)
"""Held outside the trainer's tensors on its GPU: the CUDA context, kernels and allocator slack."""
LOGPROB_CHUNK_BYTES = 256 * 2**20
"""Float32 logits per chunk of ``trainer.logprobs.chunked_logprobs`` (rows = this / (4 * vocab))."""
LOGPROB_KEEP_BYTES = 2**30
"""``chunked_logprobs`` keeps the ``[M, V]`` logits (in the weight's dtype) for the backward pass
instead of recomputing them when they take at most this many bytes (what a padded forward holds
anyway); larger ones are recomputed chunk by chunk. Both live here, where the launch's estimate
reads them without importing torch."""
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only model that its memory depends on."""

    params: int
    hidden: int
    layers: int
    intermediate: int
    kv_width: int  # num_key_value_heads x head_dim
    q_width: int  # num_attention_heads x head_dim
    vocab: int

    @classmethod
    def from_config(cls, config: Any) -> "ModelShape":
        """From a transformers config (or its ``config.json`` as a dict). Parameters are counted
        for a Llama/Qwen2/Mistral-style layer: q/k/v/o projections (Qwen2's q/k/v biases), a gated
        MLP, two norms; the embedding, and an LM head unless tied.

        Raises:
            ValueError: the config lacks ``hidden_size``, ``num_hidden_layers`` or ``vocab_size``."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        text = get("text_config")  # multimodal configs nest the language model's
        if text is not None and get("hidden_size") is None:
            return cls.from_config(text)
        try:
            h, layers, vocab = int(get("hidden_size")), int(get("num_hidden_layers")), int(get("vocab_size"))
        except (TypeError, ValueError):
            raise ValueError("the model's config has no hidden_size / num_hidden_layers / vocab_size") from None
        heads = int(get("num_attention_heads") or max(h // 128, 1))
        head_dim = int(get("head_dim") or h // heads)
        kv = int(get("num_key_value_heads") or heads) * head_dim
        q = heads * head_dim
        inter = int(get("intermediate_size") or 4 * h)
        bias = (q + 2 * kv) if get("model_type") in ("qwen2", "qwen2_moe") or get("attention_bias") else 0
        per_layer = h * (q + 2 * kv) + bias + q * h + 3 * h * inter + 2 * h
        tied = bool(get("tie_word_embeddings", False))
        params = layers * per_layer + h + vocab * h * (1 if tied else 2)
        return cls(params=params, hidden=h, layers=layers, intermediate=inter, kv_width=kv, q_width=q, vocab=vocab)

    def lora_params(self, rank: int, targets: Any = None) -> int:
        """Trainable parameters of a rank-``rank`` LoRA adapter on ``targets`` (module names;
        ``None`` or ``"all-linear"``: every projection of the layer): ``rank x (in + out)`` each."""
        h, inter, q, kv = self.hidden, self.intermediate, self.q_width, self.kv_width
        sizes = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h,
                 "gate_proj": h + inter, "up_proj": h + inter, "down_proj": inter + h}
        names = sizes if targets in (None, "all-linear") else [targets] if isinstance(targets, str) else targets
        return self.layers * rank * sum(sizes.get(n, 2 * h) for n in names)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part (module docstring) and the sizes they came from."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    tokens_per_pass: int
    trained_tokens_per_pass: int
    sync: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits + self.sync

    def describe(self) -> str:
        """``"15.6 GiB (weights 2.3, gradients 2.3, optimizer 4.6, activations 5.4, logits 1.0; 4096 tokens per pass)"``,
        with ``weight sync`` after ``logits`` when the transport holds buffers on the GPU."""
        names = ("weights", "gradients", "optimizer", "activations", "logits") + (("sync",) if self.sync else ())
        parts = ", ".join(f"{'weight sync' if name == 'sync' else name} {getattr(self, name) / GIB:.1f}"
                          for name in names)
        return f"{self.total / GIB:.1f} GiB ({parts}; {self.tokens_per_pass} tokens per pass)"

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total": self.total, "total_gib": self.total / GIB}


def estimate_trainer_peak(shape: ModelShape, *, lora: bool, tokens_per_pass: int, trained_tokens_per_pass: int,
                          lora_rank: int = 16, lora_targets: Any = None, fused_layers: bool = True,
                          gradient_checkpointing: bool = False, activation_offloading: bool = False,
                          tiled_mlp: bool = False, zero3_processes: int = 1,
                          sync_buffers: bool = False, recorded_layers: bool = False) -> MemoryEstimate:
    """The peak bytes one trainer process holds during a step (module docstring's formula).

    Args:
        tokens_per_pass: tokens forwarded at once (a packed row's, or a padded micro batch's ``B x L``).
        trained_tokens_per_pass: the trained (loss) tokens among them, whose log-probs the LM head computes.
        fused_layers: ``torch_compile`` or liger-kernel is on.
        activation_offloading: with ``gradient_checkpointing``, the layers' inputs are in host memory.
        tiled_mlp: the MLPs keep no intermediates (``trainer/speed/tiling.py``), but one tile's of ``hidden`` tokens.
        zero3_processes: DeepSpeed ZeRO-3 shards weights, gradients and optimizer state over this many processes.
        sync_buffers: the weight-sync transport packs the merged weights on the GPU (``ipc``, ``nccl``).
        recorded_layers: the layers are recorded as CUDA graphs (activations counted twice).
    """
    h, kv, inter, layers, vocab = shape.hidden, shape.kv_width, shape.intermediate, shape.layers, shape.vocab
    shards = max(zero3_processes, 1)
    if lora:
        trainable = shape.lora_params(lora_rank, lora_targets)
        weights, gradients, optimizer = 2 * shape.params // shards + 4 * trainable, 4 * trainable, 8 * trainable
    else:
        weights, gradients, optimizer = 2 * shape.params // shards, (2 * shape.params // shards + 2 * vocab * h), \
            4 * shape.params // shards
    mlp = (6 if fused_layers else 8) * inter  # the MLP's gate, up, activation and product tensors
    per_layer = (14 * h + 4 * kv if fused_layers else 22 * h + 4 * kv) + (0 if tiled_mlp else mlp)
    if gradient_checkpointing:
        # the recomputed layer's saved tensors and, during its backward, their gradients: 2 x per_layer
        activations = tokens_per_pass * ((0 if activation_offloading else layers * 2 * h) + 2 * per_layer)
    else:
        activations = tokens_per_pass * layers * per_layer
    if tiled_mlp:  # one tile's MLP tensors and their gradients, in its backward
        activations += 2 * mlp * min(tokens_per_pass, h)
    if recorded_layers:  # a recording's warm-up passes (cached) and its capture (the graphs' pool)
        activations *= 2
    kept = trained_tokens_per_pass * vocab * 2
    logits = (kept if kept <= LOGPROB_KEEP_BYTES else 0) + 2 * min(trained_tokens_per_pass * vocab * 4,
                                                                    LOGPROB_CHUNK_BYTES)
    return MemoryEstimate(weights, gradients, optimizer, activations, logits, tokens_per_pass, trained_tokens_per_pass,
                          sync=2 * shape.params if sync_buffers else 0)


def _fused(a: dict, liger_installed: bool | None = None) -> bool:
    if a.get("torch_compile"):
        return True
    if liger_installed is None:
        import importlib.util

        liger_installed = importlib.util.find_spec("liger_kernel") is not None
    return bool(a.get("use_liger")) and liger_installed


def load_shape(model: str) -> ModelShape:
    """The :class:`ModelShape` of a local model directory or hub id, from its ``config.json``
    (the hub cache, else a download unless offline: ``config.tools.model_file``).

    Raises:
        ValueError: no ``config.json`` could be had, or it lacks the sizes."""
    import json

    from vf_rl.config.tools import model_file

    path = model_file(model, "config.json")
    if path is None:
        raise ValueError(f"no config.json for {model} here or in the hub cache, and the hub cannot be reached")
    try:
        return ModelShape.from_config(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None


def pass_tokens(a: dict, processes: int = 1, mean_sample_tokens: float | None = None,
                mean_trained_tokens: float | None = None, mean_prompt_tokens: float | None = None) -> tuple[int, int]:
    """``(tokens, trained tokens)`` of the trainer's largest forward pass for resolved trainer
    args ``a`` (``packing.plan_micro_batches``): packed (``padding_free``), a pass takes up to its
    token budget (``micro_batch_tokens``, else ``micro_batch_size`` x the mean sample) of the
    process's share of the batch (``batch_size / processes`` rollouts), each group's prompt once
    with ``share_prompts``; padded, ``micro_batch_size`` samples. Lengths are per-sample means
    in tokens (a pre-flight's measurement: the whole sample, its completions, its first prompt);
    without them each sample is the bound ``max_seq_len`` and trains ``max_tokens`` (unset: the
    environment's limit, bounded by the sample). With CUDA graphs (``torch_compile_mode``) the
    pass is the packed row padded to a bucket size (``packing.pad_to_buckets``): the budget's, or
    the share's own where the whole share is one pass."""
    from vf_rl.config.args import CUDA_GRAPH_MODES

    micro, max_seq_len = int(a["micro_batch_size"]), int(a["max_seq_len"])
    sample = min(float(mean_sample_tokens or max_seq_len), max_seq_len)
    trained = min(float(mean_trained_tokens or a["max_tokens"] or sample), sample)  # max_tokens None: up to the sample
    budget = int(a["micro_batch_tokens"] or micro * math.ceil(sample))
    tokens, trained = _unpadded_pass(a, processes, micro, sample, trained, budget, bool(mean_sample_tokens),
                                     mean_prompt_tokens)
    if a.get("torch_compile") and a.get("torch_compile_mode") in CUDA_GRAPH_MODES:
        from vf_rl.config.shape_grid import bucket

        tokens = bucket(tokens + 1, 64)  # at least one padding segment; the budget's or, one pass, the share's
    return tokens, trained


def _unpadded_pass(a: dict, processes: int, micro: int, sample: float, trained: float, budget: int, measured: bool,
                   mean_prompt_tokens: float | None) -> tuple[int, int]:
    """:func:`pass_tokens` before any CUDA-graph padding."""
    if not measured:
        return budget, min(budget, round(budget / sample * trained))
    rollouts = max(-(-int(a["batch_size"]) // max(processes, 1)), 1)
    prompt = min(float(mean_prompt_tokens or 0.0), sample - trained)
    if not a.get("padding_free", True):
        n = min(micro, rollouts)
        return round(n * sample), round(n * trained)
    groups = -(-rollouts // max(int(a["rollouts_per_example"]), 1)) if a.get("share_prompts", True) else rollouts
    batch = rollouts * (sample - prompt) + groups * prompt  # the process's share, packed
    tokens = min(budget, round(batch))
    return tokens, min(tokens, round(tokens * rollouts * trained / batch))


def estimate_for_run(config, shape: ModelShape | None = None, mean_sample_tokens: float | None = None,
                     mean_trained_tokens: float | None = None, mean_prompt_tokens: float | None = None,
                     liger_installed: bool | None = None) -> MemoryEstimate:
    """The estimate for a resolved :class:`~vf_rl.config.schema.VfRlConfig`, for the pass of
    :func:`pass_tokens`: with a pre-flight's measured mean lengths (tokens per sample, of its
    prompt and of its trained completions), else the bound ``micro_batch_size x max_seq_len``.

    Args:
        liger_installed: whether liger-kernel is installed where the trainer runs (its fused
            layers apply with ``use_liger`` and ``torch_compile = false``); ``None``: here.

    Raises:
        ValueError: as :func:`load_shape`."""
    from vf_rl.config.layout import layout_devices, trainer_values
    from vf_rl.config.rules import choose_weight_sync

    a = trainer_values(config)
    shape = shape or load_shape(config.model)
    ds = a.get("deepspeed")
    processes = max(int(config.trainer.processes or 1), 1)
    tokens, trained = pass_tokens(a, processes, mean_sample_tokens, mean_trained_tokens, mean_prompt_tokens)
    zero3 = processes if ds and "3" in str(ds) else 1
    return estimate_trainer_peak(shape, lora=bool(a["use_lora"]), tokens_per_pass=tokens, trained_tokens_per_pass=trained,
                                 lora_rank=int(a["lora_rank"]), lora_targets=a.get("lora_target_modules"),
                                 fused_layers=_fused(a, liger_installed),
                                 gradient_checkpointing=bool(a.get("gradient_checkpointing")),
                                 activation_offloading=bool(a.get("activation_offloading")),
                                 tiled_mlp=bool(a.get("tiled_mlp")), zero3_processes=zero3,
                                 recorded_layers=bool(a.get("torch_compile"))
                                 and a.get("torch_compile_mode") == "reduce-overhead",
                                 sync_buffers=choose_weight_sync(a["weight_sync"], *layout_devices(config, a))
                                 in ("ipc", "nccl"))


def inference_bytes(config, gpu_bytes: int = GPU_80GB_BYTES) -> int:
    """What vLLM takes of each of its GPUs: ``inference.args.gpu_memory_utilization`` (the
    resolved config's; vLLM's default 0.9) x ``gpu_bytes``."""
    return int(float(config.inference.args.get("gpu_memory_utilization", 0.9)) * gpu_bytes)


def fit_report(config, estimate: MemoryEstimate, gpu_bytes: int = GPU_80GB_BYTES) -> tuple[bool, str]:
    """``(fits, one line)``: the estimate plus vLLM's share (``shared = true``:
    :func:`inference_bytes`) and ``CUDA_OVERHEAD_BYTES`` against ``gpu_bytes``, and what to
    change when it does not fit."""
    from vf_rl.config.layout import trainer_values

    a = trainer_values(config)
    vllm = inference_bytes(config, gpu_bytes) if config.inference.shared else 0
    need = estimate.total + vllm + CUDA_OVERHEAD_BYTES
    where = "an 80 GB GPU" if gpu_bytes == GPU_80GB_BYTES else f"this GPU ({gpu_bytes / GIB:.1f} GiB)"
    line = (f"trainer memory per GPU (estimate): {estimate.describe()}"
            + (f" + vLLM's share {vllm / GIB:.1f} GiB" if vllm else "") + f" = {need / GIB:.1f} GiB of {where}")
    if need <= gpu_bytes:
        return True, line
    hints = []
    if not a["use_lora"]:
        hints.append("use_lora = true")
    if not a.get("gradient_checkpointing"):
        hints.append("gradient_checkpointing = true")
    elif not a.get("activation_offloading") and estimate.activations > 0.25 * estimate.total:
        hints.append("activation_offloading = true")
    elif not a.get("tiled_mlp") and estimate.activations > 0.25 * estimate.total:
        hints.append("tiled_mlp = true")
    if (a.get("torch_compile") and a.get("torch_compile_mode") == "reduce-overhead"
            and estimate.activations > 0.25 * estimate.total):  # a recording holds a pass's activations twice
        hints.append("torch_compile_mode = 'default'")
    if estimate.activations + estimate.logits > 0.25 * estimate.total:
        hints.append("a smaller micro_batch_size (or micro_batch_tokens)")
    if vllm:
        hints.append("a lower inference.args.gpu_memory_utilization, or shared = false on two GPUs")
    if estimate.sync:  # the adapter alone, or a file: no buffers of merged weights on the GPU
        hints.append("weight_sync = 'lora'" if a["use_lora"] else "weight_sync = 'filesystem'")
    return False, f"{line}: does not fit; try " + ", ".join(hints or ["a smaller model"])


VLLM_OVERHEAD_BYTES = 2 * GIB
"""What vLLM holds beside the weights, the KV cache and one forward's activations: the CUDA context,
captured CUDA graphs, the sampler's buffers."""
VLLM_BATCHED_TOKENS = 8192
"""Tokens of one vLLM forward (its ``max_num_batched_tokens`` default with chunked prefill)."""
SHARED_SPLIT_HEADROOM = 1.15
"""The derived vLLM share is this much above its estimated need (allocator rounding, fragmentation)."""


def inference_bytes_needed(shape: ModelShape, kv_tokens: int, batched_tokens: int = VLLM_BATCHED_TOKENS) -> int:
    """vLLM's memory (bytes) for ``shape`` with room for ``kv_tokens`` tokens of KV cache: bf16
    weights ``2 P``, the KV cache ``2 (K and V) x layers x kv_width x 2 bytes`` per token, the bf16
    activations of one forward of ``batched_tokens`` tokens (the gated MLP's ``2 I`` and ``4 h`` per
    token), and :data:`VLLM_OVERHEAD_BYTES`."""
    kv = 4 * shape.layers * shape.kv_width * kv_tokens
    activations = 2 * batched_tokens * (2 * shape.intermediate + 4 * shape.hidden)
    return 2 * shape.params + kv + activations + VLLM_OVERHEAD_BYTES


def shared_memory_utilization(shape: ModelShape, a: dict, gpu_bytes: int = GPU_80GB_BYTES,
                              floor: float = 0.3) -> float:
    """vLLM's ``gpu_memory_utilization`` on a GPU it shares with the trainer (``shared = true``):
    :func:`inference_bytes_needed` for every rollout in flight at its longest (``batch_size x
    max_off_policy_steps x max_seq_len`` tokens of KV cache), times :data:`SHARED_SPLIT_HEADROOM`,
    as a share of ``gpu_bytes`` rounded up to 0.01, at least ``floor`` and at most 0.9; the trainer
    gets the rest. The floor is the share small models run well with (``docs/benchmarks.md``): more
    KV cache than they need, and the rest still holds their trainer.
    ``a``: the resolved trainer arguments."""
    in_flight = int(a["batch_size"]) * max(int(a.get("max_off_policy_steps") or 1), 1)
    need = inference_bytes_needed(shape, in_flight * int(a["max_seq_len"])) * SHARED_SPLIT_HEADROOM
    return min(max(math.ceil(100 * need / gpu_bytes) / 100, floor), 0.9)


SHARED_GPU_MEMORY_UTILIZATION = 0.3
"""vLLM's share of the GPU memory with ``[inference] shared = true`` where it cannot be derived from
the model's sizes (:func:`shared_split`; the trainer takes the rest)."""


def shared_split(config, a: dict) -> tuple[float, str]:
    """``(gpu_memory_utilization, why)`` for vLLM on the GPU it shares with the trainer (``config``: a
    ``VfRlConfig``, ``a``: its trainer arguments): from the model's sizes and the run's
    (:func:`shared_memory_utilization`) on the GPU they share (an 80 GB one when none can be
    queried), else :data:`SHARED_GPU_MEMORY_UTILIZATION` when the model's config cannot be read or
    there is no GPU."""
    if not config.inference.gpus:
        return SHARED_GPU_MEMORY_UTILIZATION, "inference.shared = true"
    try:
        shape = load_shape(config.model)
    except ValueError:
        return SHARED_GPU_MEMORY_UTILIZATION, "inference.shared = true (the model's config.json was not readable)"
    first = trainer_gpu_of(config, visible_gpus()) or "0"
    gpu = gpu_total_bytes(first)
    share = shared_memory_utilization(shape, a, gpu or GPU_80GB_BYTES, floor=SHARED_GPU_MEMORY_UTILIZATION)
    where = f"GPU {first} ({gpu / GIB:.0f} GiB)" if gpu else "an 80 GB GPU"
    return share, (f"inference.shared = true: the weights and a KV cache for batch_size x max_off_policy_steps x "
                   f"max_seq_len tokens, of {where}, at least {SHARED_GPU_MEMORY_UTILIZATION}")


def recorded_layers_fit(config) -> bool:
    """Whether a resolved config's trainer estimate (:func:`launch_check` on :func:`trainer_gpu_of`, else an
    80 GB GPU) fits; for a run whose layers record as CUDA graphs by default, which hold a pass's
    activations twice while recording. True when the model's config cannot be read."""
    checked = launch_check(config, trainer_gpu_of(config, visible_gpus()))
    return checked is None or checked[0]


def launch_check(config, trainer_gpu: str | None = None) -> tuple[bool, str] | None:
    """What ``vf-rl`` says before it starts a run whose trainer has GPUs: ``(fits, line)`` against
    the trainer's GPU (``trainer_gpu``, else an 80 GB one); ``None`` for a CPU trainer. A model
    whose config cannot be read is reported as not estimated (``fits`` True)."""
    if not config.trainer.gpus:
        return None
    try:
        estimate = estimate_for_run(config)
    except ValueError as exc:
        return True, f"trainer memory per GPU: not estimated ({exc})"
    total = gpu_total_bytes(trainer_gpu) if trainer_gpu is not None else None
    return fit_report(config, estimate, total or GPU_80GB_BYTES)
