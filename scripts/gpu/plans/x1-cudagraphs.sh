#!/bin/bash
# One GPU, ~5 minutes: scripts/gpu/cudagraph_accum_check.py with compile_stack's zero-filled .grad (the check failed
# without it in RESULTS (aj): pytorch/pytorch#169545), then fixed-length Qwen2-0.5B LoRA, the stack region against
# the same region as CUDA graphs.
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
timeout 300 python3 scripts/gpu/cudagraph_accum_check.py > /tmp/e2e/cudagraph-accum-check.log 2>&1; echo "rc=$?" >> /tmp/e2e/cudagraph-accum-check.log
MODE=fixed STEPS=6 LIMIT=300 SIDES="vf-rl-stack vf-rl-stack-cudagraphs" BENCH="qwen2-0.5b:lora" FG=1 bash $S best
echo "plan done"
