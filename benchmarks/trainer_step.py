#!/usr/bin/env python
"""Trainer-step throughput: vf-rl's CISPO step vs TRL's ``GRPOTrainer`` with ``loss_type="cispo"``.

Both sides get the same random-initialised model (same weights), the same synthetic batch
(random token ids, random advantages, sampling log-probs = the model's own log-probs + small
noise), the same micro batches and the same optimizer (torch AdamW, fused on CUDA, same lr, no
weight decay). Two batch modes (``--mode``):

* ``fixed``: every sequence is ``--prompt-len`` + ``--completion-len`` tokens, each with its own
  random prompt.
* ``realistic``: groups of ``--group`` rollouts share one prompt (same token ids); each group's
  prompt length is uniform in ``[--prompt-min, --prompt-max]``; each completion's length is
  ``--max-tokens`` with probability ``--cap-share`` (a completion cut at the cap) and otherwise
  log-uniform in ``[4, --max-tokens)`` (``round(exp(U(ln 4, ln max_tokens)))``: many short answers,
  a long tail), all drawn from a generator seeded by ``--seed``. Both sides count only real
  tokens (sum of prompt + completion lengths over the rollouts, a shared prompt once per rollout)
  in tokens/s: padding is not work done.

TRL gets each micro batch (``--micro-batch`` consecutive rollouts) left-padded prompts and
right-padded completions, as ``_generate_and_score_completions`` builds them; vf-rl gets the
samples (with their group and prompt length) and batches them its own way (defaults:
``padding_free``: passes of ``--micro-batch`` x the batch's mean sample length real tokens,
each packed into one row where that saves at least 10% of its padded tokens, else padded;
``share_prompts``). One
timed step is, per side:

* vf-rl: ``RLTrainer._train_on_batch(model, batch)`` (micro batches, forward, log-probs,
  ``cispo_loss``, backward), then grad clipping, ``optimizer.step()``, ``zero_grad()``: the
  trainer's own code path, nothing re-implemented here.
* TRL: for each micro batch ``GRPOTrainer.compute_loss(model, inputs)`` on the input dict that
  ``_generate_and_score_completions`` produces (prompt/completion ids and masks, advantages,
  ``old_per_token_logps``, ``num_items_in_batch``), ``accelerator.backward``; then the same
  clipping / step / zero_grad. Generation, rewards and TRL's extra no-grad forward for
  ``old_per_token_logps`` (done during generation when vLLM is used) are not timed.

Loss normalisation (both: DAPO-style token-level, one optimizer batch):

* vf-rl (``src/vf_rl/algorithm/loss.py``): ``loss = sum_t keep_t * (-r_t * A) / N`` with
  ``r_t = exp(logp_t - logp_sampling_t)`` (gradient flows through ``r``, so
  ``grad = -r * A * grad logp``); tokens with ``r`` outside ``[mask_ratio_low, mask_ratio_high]``
  (0.125, 8) are dropped; ``N`` = loss tokens of the whole batch (all micro batches and
  processes) / world size; micro-batch losses are summed, not averaged.
* TRL 1.16 cispo: ``loss = sum_t mask_t * (-sg(min(r_t, epsilon_high)) * A * logp_t) / N`` with
  ``N = num_items_in_batch / num_processes * gradient_accumulation_steps / steps_per_generation``
  = completion tokens of the generation batch (= the optimizer batch here), so the same ``N``.
  No lower mask; ratios above ``epsilon_high`` are clipped (kept), not dropped. Here
  ``epsilon_high`` = vf-rl's ``mask_ratio_high`` (8).

So the two loss VALUES differ by construction (``-r A`` vs ``-sg(r) A logp``) while their
GRADIENTS are equal whenever every ratio lies in [0.125, 8]. The script checks both on micro
batch 0 before any optimizer step: each side's reported loss against the formula recomputed
from the same log-probs, and the cosine / relative difference of the two gradients.

Sides: ``trl``; ``vf-rl`` (defaults: padding-free, shared prompts, ``torch_compile`` unset, so
compiled layers on a GPU); ``vf-rl-noshare`` (``share_prompts = false``); ``vf-rl-padded``
(``padding_free = false``: the padded path); ``vf-rl-tokens`` (``micro_batch_tokens`` = micro batch
x longest sequence: fewer, fuller passes); ``vf-rl-compile`` / ``vf-rl-eager`` (``torch_compile``
true / false). ``--vf-liger`` gives the eager vf-rl sides liger-kernel; its RoPE patch is
module-wide, so TRL runs it too, and a compiled side would trace it (a graph break per layer,
which made compiled sides look slow): the script refuses ``--vf-liger`` with a compiled side.

By default the sides run one after the other. ``--interleave`` builds them all first and alternates
their timed steps (A B, B A, ...): on a shared machine whose host speed drifts (host-bound LoRA
steps moved by 30% between two runs minutes apart on one H100), both sides see the same drift;
the per-round ratios are printed with their median. ``--profile`` (torch.profiler: kernels) and
``--pyprofile`` (cProfile: Python functions) show where one more step's time goes.

Usage (from the repo root; TRL and datasets need not be in the venv, see benchmarks/README.md):

    python benchmarks/trainer_step.py --model-config qwen2-0.5b --batch 64 --micro-batch 8 \
        --prompt-len 256 --completion-len 256 --steps 5 --warmup 2 [--lora] [--json out.json]
    python benchmarks/trainer_step.py --mode realistic --group 8 --prompt-min 64 --prompt-max 1024 \
        --max-tokens 1024 --cap-share 0.25 --batch 64 --micro-batch 8 ...
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import functools
import gc
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# No network on the benchmark machine: never try the hub, never send telemetry.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# One GPU: GRPOTrainer refuses nn.DataParallel when several are visible to one process.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")

REPO = Path(__file__).resolve().parents[1]
try:
    import vf_rl  # noqa: F401
except ImportError:  # not installed: use the checkout's src/
    sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402
import transformers  # noqa: E402
from learning import trl_options  # noqa: E402  (benchmarks/learning.py: trl[-compile][-liger] -> GRPOConfig keys)
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen3Config  # noqa: E402

from vf_rl.orchestrator.samples import Sample  # noqa: E402

STARTED = time.perf_counter()
"""When the module loaded: the progress lines say how far into the run each side starts."""

# Shapes of the real models (random weights; nothing is downloaded).
MODEL_CONFIGS = {
    "qwen2-0.5b": dict(arch="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True),
    "llama-1b": dict(arch="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=8192, vocab_size=128256, rope_theta=5e5,
                     rms_norm_eps=1e-5, tie_word_embeddings=True),
    "smollm2-135m": dict(arch="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, rope_theta=1e5,
                         rms_norm_eps=1e-5, tie_word_embeddings=True),
    "qwen3-1.7b": dict(arch="qwen3", hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=6144, vocab_size=151936, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen3-4b": dict(arch="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=9728, vocab_size=151936, rope_theta=1e6,
                     rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen2.5-7b": dict(arch="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=False),
    "llama-3.1-8b": dict(arch="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, rope_theta=5e5,
                         rms_norm_eps=1e-5, tie_word_embeddings=False),
    # Qwen2-0.5B's layers and modules at a width where compute is small: the host side of its step (CPU)
    "qwen2-narrow": dict(arch="qwen2", hidden_size=64, num_hidden_layers=24, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=4096, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Qwen3's layers (per-head q/k norms) and vocabulary at a width the CPU runs (vLLM's CPU attention needs a
    # head_dim of 32 or more): the CPU check of the qwen3 cases
    "qwen3-tiny": dict(arch="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=64, intermediate_size=128, vocab_size=151936, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    "tiny": dict(arch="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=256, vocab_size=49152, rope_theta=1e4, rms_norm_eps=1e-5,
                 tie_word_embeddings=True),
}
CONFIG_CLASSES = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}
"""The transformers config class of each ``arch`` of ``MODEL_CONFIGS``."""
# Dense bf16 peak FLOP/s (no sparsity), by a substring of torch.cuda.get_device_name().
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "GH200": 989e12, "A100": 312e12}
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
VF_VARIANTS = {"vf-rl": {}, "vf-rl-noshare": {"share_prompts": False}, "vf-rl-padded": {"padding_free": False},
               "vf-rl-tokens": {"micro_batch_tokens": "micro x max_seq_len"},
               "vf-rl-compile": {"torch_compile": True, "torch_compile_mode": "default"},
               "vf-rl-eager": {"torch_compile": False},
               "vf-rl-stack": {"torch_compile": False},
               "vf-rl-stack-cudagraphs": {"torch_compile": False},
               "vf-rl-layer-graphs": {"torch_compile": True, "torch_compile_mode": "reduce-overhead"},
               "vf-rl-stack-autotune": {"torch_compile": True, "torch_compile_mode": "max-autotune"},
               "vf-rl-unfused": {}}
"""vf-rl: the defaults (on one GPU the compiled layers recorded as CUDA graphs, as vf-rl-layer-graphs, where
the run allows it; config.defaults.records_layers_by_default). vf-rl-compile: each layer compiled, no graphs.
vf-rl-stack: the decoder stack (embedding, every layer, the last norm) compiled as one region
(``vf_rl.trainer.model.compile_stack`` without CUDA graphs) instead of vf-rl's per-layer compile, an
experiment on a host-bound step's launch cost.
vf-rl-stack-cudagraphs: that region as inductor's CUDA graphs (``compile_stack`` with mode
"reduce-overhead": one forward and one backward graph per input shape, replayed without host work)
and micro batches packed and padded to a few shapes. On the CPU inductor skips the CUDA graphs.
vf-rl-layer-graphs: ``torch_compile_mode = "reduce-overhead"``, the trainer's own path: the per-layer
compile, the layers' forward and backward then recorded as one CUDA graph each per padded shape
(``vf_rl.trainer.speed.layer_graphs``) and micro batches padded as for the stack's graphs.
vf-rl-stack-autotune: ``torch_compile_mode = "max-autotune"``, the trainer's own path: the stack's
CUDA graphs, inductor also benchmarking matmul kernels at compile time (a longer first step).
vf-rl-unfused: the defaults without ``vf_rl.trainer.speed.fusion`` (each projection its own product)."""
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def is_trl(side: str) -> bool:
    """A peer side, fed TRL's inputs: TRL's ``GRPOTrainer`` (``trl``, ``trl-*``), or as Unsloth patches
    it (``unsloth``: its model loading, kernels and loss; run through scripts/gpu/unsloth_step.py)."""
    return side in ("trl", "unsloth") or side.startswith("trl-")


def unsloth_model(model, tokenizer, args, out_dir: Path):
    """The ``unsloth`` side's model: ``model`` saved and loaded back through Unsloth's
    ``FastLanguageModel`` in its dtype, with Unsloth's LoRA adapter (``--lora``: the same targets,
    rank and alpha as the other sides) or all weights trained (``full_finetuning``); Unsloth's
    gradient checkpointing with ``--gradient-checkpointing``.

    Raises:
        SystemExit: Unsloth was not imported first (it patches transformers, peft and TRL when
            imported before them): run through scripts/gpu/unsloth_step.py.
    """
    if "unsloth" not in sys.modules:
        raise SystemExit("--sides unsloth: run through scripts/gpu/unsloth_step.py, which imports unsloth before "
                         "transformers, trl and peft, as Unsloth needs")
    from unsloth import FastLanguageModel

    path = out_dir / "unsloth-model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    loaded, _ = FastLanguageModel.from_pretrained(model_name=str(path), max_seq_length=32768, dtype=model.dtype,
                                                  load_in_4bit=False, full_finetuning=not args.lora)
    if not args.lora:
        return loaded
    return FastLanguageModel.get_peft_model(
        loaded, r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0, bias="none",
        target_modules=LORA_TARGETS, random_state=args.seed,
        use_gradient_checkpointing="unsloth" if args.gradient_checkpointing else False)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model-config", choices=sorted(MODEL_CONFIGS), default="qwen2-0.5b")
    p.add_argument("--batch", type=int, default=64, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--completion-len", type=int, default=256)
    p.add_argument("--mode", choices=["fixed", "realistic"], default="fixed", help="batch shape (see the docstring)")
    p.add_argument("--last-completion-len", type=int, default=None,
                   help="fixed: the batch's last sequence has this many completion tokens instead (a long-sequence "
                        "step of one long sequence and a short one beside it, as groups need two: with micro batch 1 "
                        "the peak is the long sequence's and the step takes about half the time of two long ones)")
    p.add_argument("--heartbeat", type=float, default=None,
                   help="print every this many seconds while a step runs: its seconds so far and the GPU memory "
                        "allocated and at its peak (where a long step stands when a time limit ends it)")
    p.add_argument("--vf-micro-batch-tokens", type=int, default=None,
                   help="token budget of the vf-rl-tokens side (default: micro batch x longest sequence)")
    p.add_argument("--group", type=int, default=8, help="realistic: rollouts per prompt")
    p.add_argument("--prompt-min", type=int, default=64, help="realistic: shortest prompt")
    p.add_argument("--prompt-max", type=int, default=1024, help="realistic: longest prompt")
    p.add_argument("--max-tokens", type=int, default=1024, help="realistic: completion cap")
    p.add_argument("--cap-share", type=float, default=0.25, help="realistic: share of completions at the cap")
    p.add_argument("--steps", type=int, default=5, help="timed optimizer steps per side")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps per side first")
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter (both sides) instead of all weights")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument("--gradient-checkpointing", action="store_true", help="both sides (non-reentrant)")
    p.add_argument("--offload-activations", action="store_true",
                   help="with --gradient-checkpointing, both sides: the checkpointed layer inputs in pinned host memory "
                        "(vf-rl's activation_offloading, TRL's gradient_checkpointing_kwargs offload)")
    p.add_argument("--tiled-mlp", action="store_true",
                   help="vf-rl sides: tiled_mlp = true (each MLP run in tiles, no MLP tensors kept for backward)")
    p.add_argument("--vf-liger", action="store_true",
                   help="eager vf-rl sides: liger-kernel's RMSNorm/RoPE/SwiGLU (use_liger with torch_compile = false); "
                        "liger's RoPE patch is module-wide, so TRL gets it too; refused with a compiled vf-rl side")
    p.add_argument("--gpu-gib", type=float, default=None,
                   help="cap this process's GPU memory at this many GiB (torch.cuda.set_per_process_memory_fraction): "
                        "a smaller GPU's limit on a larger one, e.g. 79 for an 80 GB H100 on an H200 (the CUDA "
                        "context's ~0.5 GiB is outside the cap); the device field says so")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping, as Trainer does (0: off)")
    p.add_argument("--logprob-noise", type=float, default=0.05,
                   help="std of the noise added to the model's log-probs to make the sampling log-probs")
    p.add_argument("--uniform-sampling-logprobs", action="store_true",
                   help="sampling log-probs = -log(vocab) + noise (a random-weight model's next-token distribution is "
                        "near uniform, so importance ratios stay near 1) instead of a no-grad forward of every "
                        "sequence: at 384k tokens that pass costs about a quarter of the step")
    p.add_argument("--sides", default="vf-rl,trl",
                   help=f"comma list, run in this order: {', '.join(VF_VARIANTS)}, and TRL sides "
                   "trl[-compile][-liger] (GRPOConfig torch_compile / use_liger_kernel), unsloth (through "
                   "scripts/gpu/unsloth_step.py); ratios are against the fastest of these peer sides")
    p.add_argument("--no-prepare", action="store_true",
                   help="do not accelerator.prepare(model, optimizer) (Trainer.train does it: bf16 autocast and "
                        "fp32 outputs on the model's forward)")
    p.add_argument("--profile", action="store_true",
                   help="profile one more step per side (torch.profiler) and print where its time goes")
    p.add_argument("--trace", type=Path, default=None,
                   help="with --profile: write each side's profiled step as a Chrome trace to this path, the side's "
                        "name before its suffix (a .gz path is compressed)")
    p.add_argument("--pyprofile", action="store_true",
                   help="run one more step per side under cProfile and print the Python functions with the most "
                        "own time (where a host-bound step's CPU goes)")
    p.add_argument("--interleave", action="store_true",
                   help="build every side first, then alternate their timed steps (A B, B A, ...): a drifting "
                        "host slows both alike; prints the per-round ratios")
    p.add_argument("--count-ops", action="store_true",
                   help="count the tensor operations of one more step per side (a proxy for kernel launches)")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 weights and autocast on the CPU too, as on a GPU (for --count-ops; default on the "
                        "CPU: float32)")
    p.add_argument("--no-grad-check", action="store_true",
                   help="skip the loss and gradient checks on micro batch 0 (saves time and host memory)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args(argv)
    if args.batch % args.micro_batch:
        p.error(f"--batch ({args.batch}) must be a multiple of --micro-batch ({args.micro_batch})")
    if args.batch % 2:
        p.error("--batch must be even (both trainers need groups of >= 2 rollouts)")
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps >= 1 and --warmup >= 0")
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not args.sides or len(set(args.sides)) < len(args.sides):
        p.error("--sides: a comma list of distinct sides")
    for side in args.sides:
        if side not in VF_VARIANTS and side != "unsloth":
            try:
                trl_options(side)
            except ValueError as e:
                p.error(f"{e}; vf-rl sides: {', '.join(VF_VARIANTS)}")
            if "vllm_enable_sleep_mode" in trl_options(side):
                p.error(f"--sides: {side}: no vLLM here (sleep applies to learning.py)")
    if args.mode == "realistic" and (args.batch % args.group or args.group < 2):
        p.error(f"--batch ({args.batch}) must be a multiple of --group ({args.group}) >= 2")
    if args.last_completion_len is not None and not (args.mode == "fixed" and
                                                     1 <= args.last_completion_len <= args.completion_len):
        p.error("--last-completion-len: fixed mode only, between 1 and --completion-len")
    if args.offload_activations and not args.gradient_checkpointing:
        p.error("--offload-activations needs --gradient-checkpointing")
    if not 1 <= args.prompt_min <= args.prompt_max or args.max_tokens < 4 or not 0 <= args.cap_share <= 1:
        p.error("need 1 <= --prompt-min <= --prompt-max, --max-tokens >= 4, 0 <= --cap-share <= 1")
    return args


# --- model, tokenizer, batch --------------------------------------------------------------------

def build_model(name: str, device: torch.device, dtype: torch.dtype, seed: int, max_len: int = 32768):
    spec = dict(MODEL_CONFIGS[name])
    arch = spec.pop("arch")
    config_cls = CONFIG_CLASSES[arch]
    config = config_cls(**spec, max_position_embeddings=max(32768, max_len), pad_token_id=PAD_ID, eos_token_id=EOS_ID,
                        bos_token_id=EOS_ID, attention_dropout=0.0)
    transformers.set_seed(seed)
    with torch.device(device):  # initialise on the device: fast for 1B parameters on a GPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.to(device)


def flop_params(model) -> int:
    """Parameters that take part in matmuls: all, minus the input embedding when it is not
    tied to the LM head (a lookup, not a matmul)."""
    total = sum(p.numel() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return total if emb is head else total - emb.numel()


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny word-level tokenizer with a chat template: enough for both trainers' constructors
    (the batch itself is made of random ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<eos>", "<unk>", "system:", "user:", "assistant:"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant: {% endif %}")
    return fast


def batch_shape(args) -> tuple[list[int], list[int], list[int]]:
    """``(prompt_len, completion_len, group)`` per rollout (see the module docstring for the
    realistic distribution; seeded by ``args.seed``)."""
    B = args.batch
    if args.mode == "fixed":
        last = getattr(args, "last_completion_len", None) or args.completion_len  # (records made before it lack it)
        return [args.prompt_len] * B, [args.completion_len] * (B - 1) + [last], [-1] * B
    g = torch.Generator().manual_seed(args.seed + 2)
    groups = B // args.group
    prompts = torch.randint(args.prompt_min, args.prompt_max + 1, (groups,), generator=g).tolist()
    at_cap = torch.rand(B, generator=g) < args.cap_share
    log_len = math.log(4) + torch.rand(B, generator=g) * (math.log(args.max_tokens) - math.log(4))
    lengths = torch.where(at_cap, args.max_tokens, log_len.exp().round().clamp(4, args.max_tokens - 1).long())
    return ([prompts[i // args.group] for i in range(B)], lengths.tolist(), [i // args.group for i in range(B)])


def _rows_at_a_time(forward, rows: int, x: torch.Tensor) -> torch.Tensor:
    """``forward(x)`` for a position-wise module over ``x`` ``[1, L, H]``, ``rows`` positions at a time."""
    return torch.cat([forward(x[:, i:i + rows]) for i in range(0, x.shape[1], rows)], dim=1)


@torch.no_grad()
def sequence_logprobs(model, ids: torch.Tensor, prompt_len: int, rows: int = 4096) -> torch.Tensor:
    """Log-probs ``[C]`` (float32) of the completion tokens of one sequence ``ids`` ``[1, P + C]``:
    the decoder's final hidden states through the LM head ``rows`` positions at a time, so a 32k-token
    sequence never holds ``[32k, vocab]`` logits (nor, past 32k, a ``[L, intermediate]`` MLP tensor)."""
    long = ids.shape[1] > 8 * rows
    mlps = [m.mlp for m in model.modules() if isinstance(getattr(m, "mlp", None), torch.nn.Module)] if long else []
    for mlp in mlps:  # beyond 32k positions each MLP runs ``rows`` positions at a time: no [L, intermediate] tensor
        mlp.forward = functools.partial(_rows_at_a_time, mlp.forward, rows)
    try:
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0, prompt_len - 1:-1]
    finally:
        for mlp in mlps:
            del mlp.forward
    head, targets = model.get_output_embeddings(), ids[0, prompt_len:]
    out = [torch.log_softmax(head(hidden[i:i + rows]).float(), dim=-1).gather(-1, targets[i:i + rows, None])[:, 0]
           for i in range(0, hidden.shape[0], rows)]
    return torch.cat(out)


@torch.no_grad()
def make_batch(model, args, device) -> dict:
    """Random ids (a group's rollouts share the prompt's ids), advantages ~ N(0, 1), sampling
    log-probs = the model's log-probs of the completion tokens + N(0, logprob_noise) (so
    importance ratios are near 1, as in real runs; with ``--uniform-sampling-logprobs``
    ``-log(vocab)`` + the noise, no forward pass).

    Returns ``{"ids": [B] long tensors, "prompt_lens", "groups", "advantages" [B],
    "sampling_lps": [B] float32 tensors of the completion tokens}``.
    """
    prompt_lens, completion_lens, groups = batch_shape(args)
    g = torch.Generator().manual_seed(args.seed + 1)
    vocab = model.config.vocab_size
    ids, prompts = [], {}
    for P, C, grp in zip(prompt_lens, completion_lens, groups):
        prompt = prompts.get(grp) if grp >= 0 else None
        if prompt is None:
            prompt = torch.randint(3, vocab, (P,), generator=g)  # no pad/eos/unk ids
            if grp >= 0:
                prompts[grp] = prompt
        ids.append(torch.cat([prompt, torch.randint(3, vocab, (C,), generator=g)]))
    advantages = torch.randn(len(ids), generator=g)
    model.eval()
    lps = []
    for seq, P in zip(ids, prompt_lens):
        if args.uniform_sampling_logprobs:
            lp = torch.full((len(seq) - P,), -math.log(vocab))
        else:
            lp = sequence_logprobs(model, seq[None].to(device), P).cpu()
        lps.append(lp + torch.randn(lp.shape[0], generator=g) * args.logprob_noise)
    return {"ids": ids, "prompt_lens": prompt_lens, "groups": groups, "advantages": advantages, "sampling_lps": lps}


def real_tokens(batch: dict, rows: range) -> int:
    return sum(len(batch["ids"][i]) for i in rows)


def completion_tokens(batch: dict, rows: range) -> int:
    return sum(len(batch["sampling_lps"][i]) for i in rows)


def vf_samples(batch: dict, rows: range) -> list[Sample]:
    out = []
    for i in rows:
        P, C = batch["prompt_lens"][i], len(batch["sampling_lps"][i])
        out.append(Sample(input_ids=batch["ids"][i].tolist(), loss_mask=[0] * P + [1] * C,
                          sampling_logprobs=[0.0] * P + batch["sampling_lps"][i].tolist(),
                          advantage=float(batch["advantages"][i]), group=batch["groups"][i], prompt_len=P))
    return out


def trl_inputs(batch: dict, device, rows: range, num_items: int) -> dict:
    """One micro batch as ``GRPOTrainer._generate_and_score_completions`` returns it (text-only,
    no vLLM, no reference model): left-padded prompts, right-padded completions."""
    Ps = [batch["prompt_lens"][i] for i in rows]
    Cs = [len(batch["sampling_lps"][i]) for i in rows]
    B, Pm, Cm = len(Ps), max(Ps), max(Cs)
    prompt_ids = torch.full((B, Pm), PAD_ID, dtype=torch.long)
    prompt_mask = torch.zeros(B, Pm, dtype=torch.long)
    completion_ids = torch.full((B, Cm), PAD_ID, dtype=torch.long)
    completion_mask = torch.zeros(B, Cm, dtype=torch.long)
    old = torch.zeros(B, Cm)
    for b, (i, P, C) in enumerate(zip(rows, Ps, Cs)):
        prompt_ids[b, Pm - P:], prompt_mask[b, Pm - P:] = batch["ids"][i][:P], 1
        completion_ids[b, :C], completion_mask[b, :C] = batch["ids"][i][P:], 1
        old[b, :C] = batch["sampling_lps"][i]
    return {
        "prompt_ids": prompt_ids.to(device), "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device), "completion_mask": completion_mask.to(device),
        "advantages": batch["advantages"][list(rows)].to(device),
        "num_items_in_batch": torch.tensor(num_items, device=device),
        "old_per_token_logps": old.to(device),
    }


# --- the two sides --------------------------------------------------------------------------------

def group_size(args) -> int:
    if args.mode == "realistic":
        return args.group
    return next(g for g in (16, 8, 4, 2) if args.batch % g == 0)


def max_seq_len(args) -> int:
    """The longest sequence the batch can hold (vf-rl's ``max_seq_len``)."""
    return args.prompt_max + args.max_tokens if args.mode == "realistic" else args.prompt_len + args.completion_len


def max_completion(args) -> int:
    return args.max_tokens if args.mode == "realistic" else args.completion_len


class VfSide:
    def __init__(self, model, tokenizer, args, device, out_dir: Path, variant: str = "vf-rl"):
        self.args, self.device, self.name = args, device, variant
        self.overrides = VF_VARIANTS[variant]
        self.mode = "RLTrainer._train_on_batch" + "".join(f", {k}={v}" for k, v in self.overrides.items())
        if "micro_batch_tokens" in self.overrides:
            self.mode = f"RLTrainer._train_on_batch, micro_batch_tokens={args.vf_micro_batch_tokens or 'micro x max_seq_len'}"
        self._build_trainer(model, tokenizer, out_dir)
        self.pad_id = tokenizer.pad_token_id

    def _build_trainer(self, model, tokenizer, out_dir):
        from vf_rl.config.rl_config import RLConfig
        from vf_rl.env_api import load_environment
        from vf_rl.orchestrator.orchestrator import Batch
        from vf_rl.trainer.speed import fusion
        from vf_rl.trainer.trainer import RLTrainer

        fusion.ENABLED = self.name != "vf-rl-unfused"  # read as this side's layers are set to compile (its build)
        a = self.args
        seq = max_seq_len(a)
        wanted = dict(output_dir=str(out_dir / self.name), run_name="bench", report_to="none", seed=a.seed,
                      batch_size=a.batch, micro_batch_size=a.micro_batch, rollouts_per_example=group_size(a),
                      max_seq_len=seq, max_tokens=seq - 1, max_prompt_len=seq - 1,
                      learning_rate=a.lr, max_grad_norm=a.max_grad_norm,
                      bf16=self.device.type == "cuda", gradient_checkpointing=a.gradient_checkpointing,
                      activation_offloading=a.offload_activations, tiled_mlp=a.tiled_mlp,
                      use_lora=a.lora, lora_rank=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0,
                      max_steps=a.steps + a.warmup + 1, eval_strategy="no", save_strategy="no",
                      use_liger=a.vf_liger, temperature=1.0, logging_steps=1, **self.overrides)
        if "micro_batch_tokens" in self.overrides:  # pack by tokens (default: the padded path's largest micro batch)
            wanted["micro_batch_tokens"] = a.vf_micro_batch_tokens or a.micro_batch * seq
        known = {f.name for f in dataclasses.fields(RLConfig)}
        config = RLConfig(**{k: v for k, v in wanted.items() if k in known})
        if a.bf16 and self.device.type == "cpu":  # the config refuses bf16 on the CPU: set it past the check
            config.bf16, config.mixed_precision = True, "bf16"
        env = load_environment("reverse-text", source="offline", num_train_examples=4, num_eval_examples=1)
        if a.vf_liger:  # what vf-rl's load_model does for a model it loads itself
            from vf_rl.trainer.model import apply_liger

            if config.torch_compile:  # liger's RoPE patch is module-wide: a compiled side would trace it
                raise SystemExit(f"--vf-liger with the compiled side {self.name}: liger patches modules for every side "
                                 "(a graph break per compiled layer); compare compiled sides without --vf-liger, and "
                                 "liger with --sides vf-rl-eager,trl")
            if not apply_liger(model, config):
                raise SystemExit("--vf-liger: liger-kernel is not installed (or no GPU)")
        transformers.set_seed(a.seed)  # same LoRA initialisation as TRL (which seeds before get_peft_model)
        self.trainer = RLTrainer(model=model, env=env, args=config, processing_class=tokenizer,
                                 served_model_name="bench")
        self.model, self.accelerator, self.Batch = self.trainer.model, self.trainer.accelerator, Batch
        if self.name in ("vf-rl-stack", "vf-rl-stack-cudagraphs"):
            from vf_rl.trainer.model import compile_stack

            graphs = self.name == "vf-rl-stack-cudagraphs"
            compile_stack(self.model, mode="reduce-overhead" if graphs else None)
            self.trainer.cuda_graphs = graphs  # micro batches padded to bucket sizes
            self.trainer.args.torch_compile = True  # every micro batch packed, as for a compiled model
            self.mode = ("RLTrainer._train_on_batch, the decoder stack compiled as one region"
                         + (" of CUDA graphs (reduce-overhead)" if graphs else ""))
        elif self.trainer.cuda_graphs and config.torch_compile_mode == "reduce-overhead":
            self.mode = "RLTrainer._train_on_batch, compiled decoder layers recorded as one CUDA graph per padded shape"
        elif self.trainer.cuda_graphs:
            self.mode = ("RLTrainer._train_on_batch, the decoder stack compiled as one region of CUDA graphs "
                         f"({config.torch_compile_mode})")
        if "torch_compile" not in self.overrides:  # the default: say what it resolved to
            self.mode += f" (torch_compile {'on' if config.torch_compile else 'off'})"

    def prepare(self, optimizer):
        self.model, optimizer = self.accelerator.prepare(self.model, optimizer)
        return optimizer

    def run_batch(self, samples: list[Sample]) -> float:
        """Forward/backward of all micro batches of ``samples``; returns the summed loss."""
        batch = self.Batch(step=0, samples=samples, rollouts=[], metrics={})
        loss, _ = self.trainer._train_on_batch(self.model, batch)
        return float(loss)

    def close(self):
        self.trainer = self.model = self.accelerator = None


class TrlSide:
    def __init__(self, model, tokenizer, args, device, out_dir: Path, variant: str = "trl"):
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        # trl-compile: torch_compile=True; trl-liger: use_liger_kernel=True; unsloth: Unsloth's model (its own
        # adapter and gradient checkpointing, unsloth_model) and its patched trainer
        unsloth = variant == "unsloth"
        options = {} if unsloth else trl_options(variant)
        self.args, self.device, self.name = args, device, variant
        self.mode = "Unsloth's " * unsloth + "GRPOTrainer.compute_loss" + "".join(f", {k}=True" for k in options)
        n_micro = args.batch // args.micro_batch
        config = GRPOConfig(
            output_dir=str(out_dir / variant), report_to="none", seed=args.seed, loss_type="cispo",
            per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=n_micro,
            num_generations=group_size(args), max_completion_length=max_completion(args),
            learning_rate=args.lr, max_grad_norm=args.max_grad_norm, weight_decay=0.0, optim="adamw_torch",
            bf16=device.type == "cuda" or args.bf16, gradient_checkpointing=args.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False,
                                           **({"offload": True} if args.offload_activations and device.type == "cuda" else {})},
            epsilon_high=8.0,  # = vf-rl's mask_ratio_high (TRL's default epsilon_high would be 0.2)
            beta=0.0, temperature=1.0, use_vllm=False, max_steps=args.steps + args.warmup + 1,
            save_strategy="no", eval_strategy="no", logging_steps=1, use_cpu=device.type != "cuda", **options)
        peft_config = None
        if args.lora and not unsloth:
            from peft import LoraConfig

            peft_config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                                     target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
        dataset = Dataset.from_dict({"prompt": ["benchmark"] * args.batch})

        def zero_reward(completions, **kwargs):
            return [0.0] * len(completions)

        self.trainer = GRPOTrainer(model=model, reward_funcs=zero_reward, args=config, train_dataset=dataset,
                                   processing_class=tokenizer, peft_config=peft_config)
        if args.gradient_checkpointing and args.lora and not unsloth:  # what Trainer.train does first
            self.trainer.model.enable_input_require_grads()
        # What Trainer's loop sets before each accumulation window; _compute_loss reads it.
        self.trainer.current_gradient_accumulation_steps = n_micro
        self.model, self.accelerator = self.trainer.model, self.trainer.accelerator

    def prepare(self, optimizer):
        self.model, optimizer = self.accelerator.prepare(self.model, optimizer)
        return optimizer

    def run_batch(self, micro_inputs: list[dict]) -> float:
        total = torch.zeros((), device=self.device)
        self.model.train()
        for inputs in micro_inputs:
            with self.trainer.compute_loss_context_manager():
                loss = self.trainer.compute_loss(self.model, inputs)
            self.accelerator.backward(loss)
            total += loss.detach()
        for values in self.trainer._metrics.values():  # what Trainer.log would drain
            values.clear()
        return float(total)

    def close(self):
        self.trainer = self.model = self.accelerator = None


# --- measurement -----------------------------------------------------------------------------------

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def grads_by_name(model) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


@torch.no_grad()
@torch.compiler.set_stance("force_eager")  # a check, not timed: no extra compile of the no-grad forward
def formula_values(model, batch: dict, device, rows: range) -> dict:
    """Both losses recomputed from one no-grad forward per rollout (fp32 log-softmax) on ``rows``."""
    vf = trl = 0.0
    ratios = []
    n = completion_tokens(batch, rows)
    for i in rows:
        lp = sequence_logprobs(model, batch["ids"][i][None].to(device), batch["prompt_lens"][i])
        ratio = torch.exp(lp - batch["sampling_lps"][i].to(device))
        adv = float(batch["advantages"][i])
        keep = (ratio >= 0.125) & (ratio <= 8.0)
        vf += float((-(ratio * adv)).masked_fill(~keep, 0.0).sum())
        trl += float((-(ratio.clamp(max=8.0) * adv * lp)).sum())
        ratios.append(ratio)
    ratio = torch.cat(ratios)
    return {"vf_formula": vf / n, "trl_formula": trl / n, "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max()), "ratio_mean": float(ratio.mean())}


class Opened:
    """One side, built, checked on micro batch 0 and ready to time: ``step()`` runs one optimizer
    step (all micro batches, clip, ``optimizer.step()``, ``zero_grad``) and returns its summed loss."""

    def __init__(self, name, master, tokenizer, batch, args, device, out_dir, keep_grads=False, ref_grads=None):
        self.name, self.device, self.args = name, device, args
        self.base_mem = allocated(device)
        model = copy.deepcopy(master).to(device)
        t0 = time.perf_counter()
        if name == "unsloth":
            model = unsloth_model(model, tokenizer, args, out_dir)
        if is_trl(name):
            side = TrlSide(model, tokenizer, args, device, out_dir, variant=name)
        else:
            side = VfSide(model, tokenizer, args, device, out_dir, variant=name)
        del model
        self.build_s = time.perf_counter() - t0
        if args.gradient_checkpointing and name != "unsloth":  # what Trainer.train does with the side's kwargs
            kwargs = dict(side.trainer.args.gradient_checkpointing_kwargs or {"use_reentrant": False})
            offload = {"offload": True} if kwargs.pop("offload", False) else {}
            side.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, **offload)
            side.model.config.use_cache = False
        self.params = [p for p in side.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(self.params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                      fused=device.type == "cuda")
        if not args.no_prepare:
            optimizer = side.prepare(optimizer)
        self.side, self.optimizer = side, optimizer

        mb = args.micro_batch
        n_micro = args.batch // mb
        everything, first = range(args.batch), range(mb)
        if not is_trl(name):
            self.full, check = vf_samples(batch, everything), vf_samples(batch, first)
        else:
            n_items = completion_tokens(batch, everything)
            self.full = [trl_inputs(batch, device, range(i * mb, (i + 1) * mb), n_items) for i in range(n_micro)]
            check = [trl_inputs(batch, device, first, completion_tokens(batch, first))]

        # Check: micro batch 0 alone (normalised by its own tokens), before any optimizer step. Its
        # time is left out of the time to first step (a run has no such check).
        self.grads, self.grad_check, self.check_loss, self.formulas = {}, None, None, {}
        t_check = time.perf_counter()
        if not args.no_grad_check:
            self.check_loss = side.run_batch(check)
            sync(device)
            if keep_grads:
                self.grads = {n: g.detach().to("cpu", copy=True) for n, g in grads_by_name(side.model).items()}
            if ref_grads:
                self.grad_check = compare_grads(ref_grads, grads_by_name(side.model), device)
            self.formulas = formula_values(side.model, batch, device, first)
            optimizer.zero_grad(set_to_none=True)
        self.check_s = time.perf_counter() - t_check
        self.t0 = t0
        self.first_step_s = None  # build + prepare + the first optimizer step (compilation included), seconds
        self.tokens = real_tokens(batch, everything)
        self.losses, self.times = [], []
        self.held = allocated(device) - self.base_mem  # bytes this side holds between steps (weights, AdamW state)
        self.peak = None  # the most it held during any step, bytes

    def step(self) -> float:
        loss = self.side.run_batch(self.full)
        if self.args.max_grad_norm:
            if self.side.accelerator is not None:
                self.side.accelerator.clip_grad_norm_(self.params, self.args.max_grad_norm)
            else:
                torch.nn.utils.clip_grad_norm_(self.params, self.args.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def timed_step(self, timed: bool) -> None:
        """One step, with its wall time (seconds, after a device sync) kept when ``timed``. Only
        this side's step changes the allocated memory while it runs, so what it holds during the
        step is what it held before plus the allocator's peak above the step's start."""
        sync(self.device)
        before = allocated(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        with heartbeat(self.name, self.args.heartbeat, self.device):
            self.losses.append(self.step())
            sync(self.device)
        elapsed = time.perf_counter() - start
        if self.first_step_s is None:
            self.first_step_s = time.perf_counter() - self.t0 - self.check_s
        print(f"[{self.name}] {'timed' if timed else 'warm-up'} step: {elapsed:.1f} s", flush=True)
        if self.device.type == "cuda":
            peak = self.held + torch.cuda.max_memory_allocated(self.device) - before
            self.peak = peak if self.peak is None else max(self.peak, peak)
            self.held += allocated(self.device) - before
        if timed:
            self.times.append(elapsed)

    def warm_up(self) -> None:
        for _ in range(self.args.warmup):
            self.timed_step(timed=False)

    def result(self, extra_resident: int = 0) -> dict:
        """The side's numbers. Peak memory = the most this side held during a step (warmup
        included) + ``extra_resident`` (memory left by earlier sides, counted as before)."""
        args = self.args
        ops = count_ops(self.step) if args.count_ops else None
        if args.profile:
            trace = args.trace and args.trace.with_name(args.trace.name.replace(".", f"-{self.name}.", 1))
            profile_step(self.step, self.name, self.device, trace)
        if args.pyprofile:
            python_profile(self.step, self.name, self.device)
        peak = None if self.peak is None else self.peak + extra_resident
        mean_t = statistics.mean(self.times)
        return {
            "side": self.name, "mode": self.side.mode, "build_s": self.build_s, "first_step_s": self.first_step_s,
            "trainable_params": sum(p.numel() for p in self.params),
            "step_s": self.times, "step_s_mean": mean_t,
            "step_s_std": statistics.stdev(self.times) if len(self.times) > 1 else 0.0,
            "tokens_per_step": self.tokens, "tokens_per_s": self.tokens / mean_t, "peak_mem_bytes": peak,
            "peak_gib": None if peak is None else peak / 2**30,
            "mem_before_side_bytes": self.base_mem, "check_loss_mb0": self.check_loss,
            "first_step_loss": self.losses[0], "losses": self.losses,
            **{f"check_{k}": v for k, v in self.formulas.items()}, "grad_check": self.grad_check,
            "steady_tokens_per_s": self.tokens / statistics.median(self.times),
            "gradient_checkpointing": bool(getattr(self.side.model, "is_gradient_checkpointing", False)),
            "ops_per_step": ops,
        }

    def close(self) -> None:
        self.side.close()
        self.side = self.optimizer = self.params = self.full = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@contextlib.contextmanager
def heartbeat(name: str, every_s: float | None, device):
    """While the block runs, every ``every_s`` seconds (None: never) one line: the seconds since it
    began and the GPU memory allocated now and at its peak (GiB)."""
    if not every_s:
        yield
        return
    done, start = threading.Event(), time.perf_counter()

    def beat():
        while not done.wait(every_s):
            mem = ""
            if device.type == "cuda":
                mem = (f": {torch.cuda.memory_allocated(device) / 2**30:.1f} GiB allocated, "
                       f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB peak")
            print(f"[{name}] step running for {time.perf_counter() - start:.0f} s{mem}", flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def allocated(device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def run_sides(master, tokenizer, batch, args, device, out_dir) -> tuple[dict, dict | None]:
    """Every side of ``args.sides``: built on a fresh copy of the weights, checked on micro batch
    0 (the gradients of each later side compared with the first's), warmed up and timed.

    Sequential (default): one side after the other, each closed before the next is built.
    ``--interleave``: all sides built first, then the timed steps alternate between them, the
    order reversed every round (A B, B A, ...), so that a host or GPU whose speed drifts (a
    shared machine) slows both sides alike; each side's peak memory is then what it holds plus
    its own steps' transient, without the other sides' memory.

    Returns ``(results by side, {side: per-round ratios t_trl / t_side} or None without trl or
    when sequential)``.
    """
    check = not args.no_grad_check and len(args.sides) >= 2
    opened, ref_grads, results = [], None, {}
    for i, name in enumerate(args.sides):
        print(f"[{name}] building and running {args.warmup} warmup + {args.steps} timed steps, "
              f"{time.perf_counter() - STARTED:.0f} s after the start"
              + (" (interleaved)" if args.interleave else "") + " ...", flush=True)
        if args.interleave:  # warmed up once all are built: a later side's global patch (liger's RoPE) then
            side = Opened(name, master, tokenizer, batch, args, device, out_dir,  # recompiles a compiled side
                          keep_grads=check and i == 0, ref_grads=ref_grads)  # during warmup, not when timed
            ref_grads = ref_grads or side.grads or None
            side.grads = None
            opened.append(side)
            continue
        side = None
        try:  # sequential: a side that runs out of memory is a result (the next side still runs)
            side = Opened(name, master, tokenizer, batch, args, device, out_dir,
                          keep_grads=check and i == 0, ref_grads=ref_grads)
            ref_grads = ref_grads or side.grads or None  # every later side is compared with the first
            side.grads = None
            side.warm_up()
            for _ in range(args.steps):
                side.timed_step(timed=True)
            results[name] = side.result(extra_resident=side.base_mem)  # leftovers count (warned)
        except torch.OutOfMemoryError as e:
            print(f"[{name}] out of memory: {str(e).splitlines()[0]}", flush=True)
            results[name] = {"side": name, "oom": True, "mode": side.side.mode if side else name,
                             "error": str(e).splitlines()[0],
                             "total_bytes": torch.cuda.get_device_properties(device).total_memory}
        if side is not None:
            side.close()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del ref_grads
    if not args.interleave:
        return results, None
    for side in opened:
        side.warm_up()
    for r in range(args.steps):
        for side in (opened if r % 2 == 0 else opened[::-1]):
            side.timed_step(timed=True)
    for side in opened:  # (no out-of-memory handling here: run long shapes sequentially)
        results[side.name] = side.result()
    rounds = None
    trl_sides = [s for s in opened if is_trl(s.name)]
    if trl_sides:  # against the fastest TRL side
        trl = min(trl_sides, key=lambda s: statistics.median(s.times))
        rounds = {s.name: [t_trl / t for t_trl, t in zip(trl.times, s.times)] for s in opened if not is_trl(s.name)}
    for side in opened:
        side.close()
    return results, rounds


def profile_step(step, name: str, device, trace: Path | None = None) -> None:
    """Run ``step()`` once more under torch.profiler and print where its time goes: the 25
    operations with the most device (CUDA) time, or CPU time on the CPU, and the totals; on a GPU
    also how long it ran no kernel (:func:`device_gaps`). ``trace``: the Chrome trace written there."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        step()
        sync(device)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    busy = sum(getattr(e, key, 0) for e in events) / 1e6
    print(f"[{name}] profiled step: {wall:.3f} s wall (profiler on), {busy:.3f} s summed self "
          f"{'device' if device.type == 'cuda' else 'CPU'} time, {sum(e.count for e in events)} events")
    if device.type == "cuda":
        print(f"[{name}] {device_gaps(prof.events())}")
    print(events.table(sort_by=key, row_limit=25, max_name_column_width=60))
    if trace:
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
        print(f"[{name}] trace: {trace}")


def device_gaps(events, least_us: float = 50.0, top: int = 5) -> str:
    """Between a profiled step's first and last kernel (profiler events of device type CUDA,
    times in microseconds): the time some kernel ran (overlaps counted once) and the time none
    did, in gaps of at least ``least_us`` (the host not keeping the GPU fed) and shorter; then
    the idle time by the kernel each gap ends at (what the GPU waited for the host to launch),
    ``top`` names, and the ``top`` largest gaps with the kernels on either side."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type.name == "CUDA")
    if not spans:
        return "no kernel events"
    busy, end, last, long_gaps, short_idle, before = 0.0, spans[0][0], spans[0][2], [], 0.0, {}
    for start, stop, name in spans:
        if start > end:
            gap = start - end
            if gap >= least_us:
                long_gaps.append((gap, last, name))
            else:
                short_idle += gap
            total_gap, count = before.get(name, (0.0, 0))
            before[name] = (total_gap + gap, count + 1)
        busy += max(stop, end) - max(start, end)
        if stop >= end:
            end, last = stop, name
    total = end - spans[0][0]

    def short(name):
        return name if len(name) <= 48 else name[:45] + "..."

    lines = [f"device: {busy / 1e3:.1f} ms busy of {total / 1e3:.1f} ms from first to last kernel; idle in "
             f"{len(long_gaps)} gaps >= {least_us:.0f} us: {sum(g for g, _, _ in long_gaps) / 1e3:.1f} ms (largest "
             f"{max((g for g, _, _ in long_gaps), default=0) / 1e3:.1f} ms), in shorter ones {short_idle / 1e3:.1f} ms"]
    if before:
        ranked = sorted(before.items(), key=lambda kv: -kv[1][0])[:top]
        lines.append("  idle before: " + "; ".join(f"{short(n)} {t / 1e3:.1f} ms ({c})" for n, (t, c) in ranked))
    if long_gaps:
        lines.append("  largest gaps: " + "; ".join(f"{g / 1e3:.1f} ms {short(a)} -> {short(b)}"
                                                    for g, a, b in sorted(long_gaps, reverse=True)[:top]))
    return "\n".join(lines)


def python_profile(step, name: str, device) -> None:
    """Run ``step()`` once more under cProfile and print the 25 Python functions (and builtins
    such as ``run_backward`` and the torch ops called from Python) with the most own time."""
    import cProfile
    import io
    import pstats

    sync(device)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    step()
    sync(device)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    print(f"[{name}] cProfile'd step: {time.perf_counter() - start:.3f} s wall (profiler on)")
    print(out.getvalue().split("\n", 3)[-1].replace(str(Path(sys.prefix)), "<prefix>"))


def count_ops(step) -> dict:
    """Run ``step()`` once more and count the tensor operations that reach the kernels (below
    autograd, forward and backward: a TorchDispatchMode), by name. On a GPU each is about one
    kernel launch, so on a host-bound step the total tracks the step time."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.counts[str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    with Counting() as mode:
        step()
    return {"total": sum(mode.counts.values()), **dict(mode.counts.most_common(25))}


@torch.no_grad()
def compare_grads(a: dict, b: dict, device) -> dict:
    """Cosine and relative L2 difference of two gradients ({param name: tensor}); ``a`` is the
    reference (the side run first)."""
    common = sorted(set(a) & set(b))
    dot = na = nb = nd = 0.0
    for n in common:
        x, y = a[n].to(device, torch.float64), b[n].to(device, torch.float64)
        dot += float((x * y).sum())
        na += float((x * x).sum())
        nb += float((y * y).sum())
        nd += float(((x - y) ** 2).sum())
    return {"tensors_compared": len(common), "only_first": len(set(a) - set(b)), "only_second": len(set(b) - set(a)),
            "cosine": dot / math.sqrt(na * nb) if na and nb else float("nan"),
            "rel_l2_diff": math.sqrt(nd / na) if na else float("nan"),
            "norm_first": math.sqrt(na), "norm_second": math.sqrt(nb)}


def preload(sides) -> None:
    """Import TRL (and RLTrainer) before any model exists: fail fast when missing, keep import
    time out of the measurements, and keep the frames that TRL's lazy import machinery may
    retain (seen with vLLM installed) from pinning a model in memory."""
    if any(is_trl(side) for side in sides):
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401
    if not all(is_trl(side) for side in sides):
        from vf_rl.trainer.trainer import RLTrainer  # noqa: F401


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    for mod in ("trl", "accelerate", "peft", "datasets"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = "missing"
    return out


def describe_batch(batch: dict, args) -> str:
    P, C = batch["prompt_lens"], [len(x) for x in batch["sampling_lps"]]
    real = sum(P) + sum(C)
    if args.mode == "fixed":
        last = "" if args.last_completion_len is None else f", the last with {args.last_completion_len} completion"
        return (f"fixed, {args.batch} x ({args.prompt_len} prompt + {args.completion_len} completion){last} = {real} "
                "tokens/step")
    cap = sum(c == args.max_tokens for c in C)
    return (f"realistic (seed {args.seed}), {args.batch} rollouts = {args.batch // args.group} prompts x {args.group}, "
            f"prompts {min(P)}-{max(P)} tokens (uniform in [{args.prompt_min}, {args.prompt_max}]), completions "
            f"{min(C)}-{max(C)} (mean {statistics.mean(C):.0f}; {cap} = {100 * cap / len(C):.0f}% at max_tokens "
            f"{args.max_tokens}; else log-uniform in [4, {args.max_tokens})); {real} real tokens/step "
            f"({sum(P[i] for i in range(0, len(P), args.group))} of them in distinct prompts)")


def fmt_mem(b):
    return "n/a" if b is None else f"{b / 2**30:.2f}"


def main(argv=None):
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" or args.bf16 else torch.float32
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        if args.gpu_gib:
            device_name += f" (memory capped at {args.gpu_gib:g} GiB)"
    else:
        device_name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    peak_flops = next((v for k, v in PEAK_FLOPS.items() if k in device_name), None) if device.type == "cuda" else None
    command = "python " + shlex.join(sys.argv if argv is None else [sys.argv[0], *argv])

    preload(args.sides)
    t0 = time.perf_counter()
    longest = args.prompt_len + args.completion_len if args.mode == "fixed" else args.prompt_max + args.max_tokens
    model = build_model(args.model_config, device, dtype, args.seed, max_len=longest)
    n_params = sum(p.numel() for p in model.parameters())
    n_flop = flop_params(model)
    batch = make_batch(model, args, device)
    master = model.to("cpu")  # each side starts from a copy of these weights
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        if args.gpu_gib:  # the cap holds the sides' steps, not the harness's own sampling pass above
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(args.gpu_gib * 2**30 / total, 1.0),
                                                      torch.cuda.current_device())  # needs an index
    setup_s = time.perf_counter() - t0
    tokenizer = build_tokenizer()

    check = not args.no_grad_check and len(args.sides) >= 2
    with tempfile.TemporaryDirectory(prefix="vf-rl-bench-") as tmp:
        results, rounds = run_sides(master, tokenizer, batch, args, device, Path(tmp))
    grad_check = results[args.sides[-1]]["grad_check"] if check else None

    for r in results.values():
        r["mfu"] = 6 * n_flop * r["tokens_per_s"] / peak_flops if peak_flops and not r.get("oom") else None
    ran = {name: r for name, r in results.items() if not r.get("oom")}
    best_trl = max((n for n in ran if is_trl(n)), key=lambda n: ran[n]["tokens_per_s"], default=None)
    ratios = {name: r["tokens_per_s"] / ran[best_trl]["tokens_per_s"]
              for name, r in ran.items() if not is_trl(name) and best_trl}
    ratio = ratios.get("vf-rl")

    v = versions()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Trainer step: vf-rl CISPO vs TRL GRPOTrainer(loss_type=\"cispo\")", "",
        f"- date: {now}",
        f"- device: {device_name}" + (f" (peak {peak_flops / 1e12:.0f} TFLOP/s bf16 dense)" if peak_flops else ""),
        f"- versions: python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, trl {v['trl']}, "
        f"accelerate {v['accelerate']}, peft {v['peft']}, datasets {v['datasets']}",
        f"- command: `{command}`",
        f"- model: {args.model_config}" + ("" if args.model_config == "tiny" else "-like") + ", random init, "
        f"{n_params / 1e6:.1f} M parameters ({n_flop / 1e6:.1f} M in matmuls), {str(dtype).replace('torch.', '')}, "
        "sdpa; " + (f"LoRA r={args.lora_rank} alpha={args.lora_alpha:g} on {','.join(LORA_TARGETS)}"
                    if args.lora else "full fine-tune")
        + (", gradient checkpointing" if args.gradient_checkpointing else "")
        + (" offloaded to host memory" if args.offload_activations else ""),
        f"- batch: {describe_batch(batch, args)}, micro batch {args.micro_batch} "
        f"({args.batch // args.micro_batch} per step); torch AdamW lr {args.lr:g}"
        + (" fused" if device.type == "cuda" else "") + f", clip {args.max_grad_norm:g}; "
        f"{args.warmup} warmup + {args.steps} timed steps" + ("" if args.no_prepare else "; accelerator.prepare'd"),
        f"- setup (model init + sampling log-probs): {setup_s:.1f} s", "",
        "| side | what runs | first step (s) | step time (s) | tokens/s | MFU | peak mem (GiB) | trainable params |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        if r.get("oom"):
            lines.append(f"| {r['side']} | {r['mode']} | - | out of memory | - | - | > {fmt_mem(r['total_bytes'])} | - |")
            continue
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(f"| {r['side']} | {r['mode']} | {r['first_step_s']:.1f} | {r['step_s_mean']:.3f} ± "
                     f"{r['step_s_std']:.3f} | {r['tokens_per_s']:,.0f} | {mfu} | {fmt_mem(r['peak_mem_bytes'])} | "
                     f"{r['trainable_params']:,} |")
    lines.append("")
    lines.append("First step = building the side, accelerator.prepare and its first optimizer step, compilation "
                 "included (not the weights' copy to the GPU, not the checks below).")
    lines.append("MFU = 6 x params-in-matmuls x tokens/s / peak (attention score FLOPs not counted"
                 + ("; with LoRA the real FLOPs are ~2/3 of that" if args.lora else "") + "). "
                 "Peak memory is the most that side held during its warmup and timed steps (weights, grads, AdamW "
                 "state, activations; torch.cuda.max_memory_allocated above each step's start)"
                 + (". Interleaved: steps alternate between the sides, order reversed every round; each side's "
                    "peak leaves out the other sides' memory." if args.interleave else "."))
    lines += ["", "Loss check on micro batch 0, before any optimizer step (normalised by that micro batch's "
              "tokens):", ""]
    lines.append("- normalisation, vf-rl: sum over loss tokens of keep*(-r*A) / N, keep = mask & 0.125 <= r <= 8 "
                 "(dropped, not clipped), N = loss tokens of the whole optimizer batch / world size")
    lines.append("- normalisation, TRL cispo: sum over completion tokens of -sg(min(r, eps_high))*A*logp / N, "
                 "N = num_items_in_batch / processes * grad_accum / steps_per_generation = completion tokens of the "
                 "optimizer batch (steps_per_generation = grad_accum); eps_high = 8 here, no lower mask")
    lines.append("- so the values differ by construction (-r*A vs -sg(r)*A*logp); the gradients are the same while "
                 "every ratio is in [0.125, 8]")
    for r in ran.values() if not args.no_grad_check else ():
        key = "trl_formula" if is_trl(r["side"]) else "vf_formula"
        lines.append(f"- {r['side']}: loss {r['check_loss_mb0']:.6g}; the same formula from a separate no-grad "
                     f"forward: {r['check_' + key]:.6g}; ratios in [{r['check_ratio_min']:.4f}, "
                     f"{r['check_ratio_max']:.4f}], mean {r['check_ratio_mean']:.4f}")
    lines.append("- first optimizer step's summed loss: " + ", ".join(
        f"{name} {r['first_step_loss']:.6g}" for name, r in ran.items()))
    first = args.sides[0]
    for second in args.sides[1:]:
        gc_ = results[second].get("grad_check")
        if not gc_:
            continue
        lines.append(f"- gradients (micro batch 0, {gc_['tensors_compared']} tensors): cosine "
                     f"{gc_['cosine']:.6f}, |g_{first} - g_{second}| / |g_{first}| = "
                     f"{gc_['rel_l2_diff']:.3e}, |g_{first}| = {gc_['norm_first']:.4g}, "
                     f"|g_{second}| = {gc_['norm_second']:.4g}"
                     + (f" (in one side only: {gc_['only_first']} / {gc_['only_second']})"
                        if gc_["only_first"] or gc_["only_second"] else ""))
    for r in ran.values() if not args.interleave else ():  # interleaved peaks leave the others out
        if r["mem_before_side_bytes"] > 64 * 2**20:
            lines.append(f"- warning: {fmt_mem(r['mem_before_side_bytes'])} GiB were still allocated before the "
                         f"{r['side']} side started (counted in its peak)")
    lines.append("")
    for name, values in (rounds or {}).items():
        lines.append(f"- interleaved rounds, {name}/{best_trl} tokens/s per round (t_trl / t_{name}): "
                     + ", ".join(f"{v:.2f}" for v in values) + f"; median {statistics.median(values):.2f}")
    for name, value in ratios.items():
        mem = results[name]["peak_mem_bytes"], results[best_trl]["peak_mem_bytes"]
        lines.append(f"ratio {name}/{best_trl} (the fastest TRL side) tokens/s: {value:.2f}"
                     + (f"; peak memory {name}/{best_trl}: {mem[0] / mem[1]:.2f}" if mem[1] else ""))
    print("\n".join(lines), flush=True)

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"date": now, "device": device_name, "peak_flops": peak_flops, "versions": v, "command": command,
                  "args": {k: (str(x) if isinstance(x, Path) else x) for k, x in vars(args).items()},
                  "n_params": n_params, "n_flop_params": n_flop, "results": results, "grad_check": grad_check,
                  "ratio_vf_over_trl_tokens_per_s": ratio, "ratios_over_trl": ratios, "best_trl_side": best_trl,
                  "interleaved": args.interleave, "round_ratios_over_trl": rounds}
        args.json.write_text(json.dumps(record, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
