#!/bin/bash
# One GPU (an H100 for issue 29's figures; an H200 otherwise), ~25 minutes: issue 29's fixed-length cases with the
# decoder stack as CUDA graphs (trainer_step.py's vf-rl-stack-cudagraphs side, one replay per forward and per
# backward) against trl-compile-liger (the fastest TRL side at fixed length in RESULTS q/r), most host-bound case
# first. Each side is its own process, 6 timed steps after 2 warm-up steps, 64 x (256 + 256) tokens, micro batch 8.
#   0 (~1 min): scripts/gpu/cudagraph_accum_check.py (passes since RESULTS aj, where it found pytorch#169545)
#   1. Qwen2-0.5B LoRA: per-layer regions (vf-rl), the stack region, the stack as CUDA graphs, trl-compile-liger
#   2. Llama-1.2B LoRA, Qwen2-0.5B full, Llama-1.2B full: the stack as CUDA graphs against trl-compile-liger
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
timeout 300 python3 scripts/gpu/cudagraph_accum_check.py > /tmp/e2e/cudagraph-accum-check.log 2>&1; echo "rc=$?" >> /tmp/e2e/cudagraph-accum-check.log
MODE=fixed STEPS=6 LIMIT=300 SIDES="vf-rl-stack-cudagraphs trl-compile-liger vf-rl vf-rl-stack" \
  BENCH="qwen2-0.5b:lora" FG=1 bash $S best
MODE=fixed STEPS=6 LIMIT=300 SIDES="vf-rl-stack-cudagraphs trl-compile-liger" \
  BENCH="llama-1b:lora qwen2-0.5b:full llama-1b:full" FG=1 bash $S best
echo "plan done"
