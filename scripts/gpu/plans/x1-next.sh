#!/bin/bash
# One GPU (nvidia-h100-x1: issue 29's done-when is on an H100), ~25 minutes, each side its own trainer_step.py process,
# the parts in the order of what they close:
#   1. realistic Qwen2-0.5B LoRA against trl-compile (2.51x on an H200 in ah; the 2.5x bullet is on an H100)
#   2. fixed length, Qwen2-0.5B LoRA (the most host-bound case, 1.23x in RESULTS r): per-layer regions, the decoder
#      stack as one region (1.61x there), that region as CUDA graphs (one replay per forward and per backward: no host
#      time per layer), against trl-compile-liger
#   3. realistic Qwen2-0.5B full against trl-compile
#   4. realistic Qwen2-0.5B LoRA with the stack region: with attention traced it no longer breaks the graph at each
#      layer (what made it slower in r)
#   0 (first, ~1 min): scripts/gpu/cudagraph_accum_check.py, whether the stack's CUDA graphs accumulate gradients over
#      micro batches as eager code does (the benchmark's gradient check sees micro batch 0 alone)
# (The gradient check of ah's traced attention ran in ai: cosine 0.9994 against eager and TRL.)
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
timeout 300 python3 scripts/gpu/cudagraph_accum_check.py > /tmp/e2e/cudagraph-accum-check.log 2>&1; echo "rc=$?" >> /tmp/e2e/cudagraph-accum-check.log
MODE=realistic STEPS=6 LIMIT=500 SIDES="vf-rl trl-compile" BENCH="qwen2-0.5b:lora" FG=1 bash $S best
MODE=fixed STEPS=6 LIMIT=300 SIDES="vf-rl vf-rl-stack vf-rl-stack-cudagraphs trl-compile-liger" BENCH="qwen2-0.5b:lora" \
  FG=1 bash $S best
MODE=realistic STEPS=6 LIMIT=500 SIDES="vf-rl trl-compile" BENCH="qwen2-0.5b:full" FG=1 bash $S best
MODE=realistic STEPS=6 LIMIT=300 SIDES="vf-rl-stack" BENCH="qwen2-0.5b:lora" FG=1 bash $S best
echo "plan done"
