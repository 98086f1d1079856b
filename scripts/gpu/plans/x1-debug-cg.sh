#!/bin/bash
# One GPU, ~25 minutes, for a session with ~27 minutes of device time after the transfers: x1-start-debug.sh
# (~4 min: vLLM's engine spawned against forked), then x1-cudagraphs.sh's cases without the sides already measured
# on an H200 (RESULTS ah/aj: per-layer regions, the stack region): the accumulation check, then the stack as CUDA
# graphs against trl-compile-liger on Qwen2-0.5B LoRA first, the other three cases after.
S=scripts/gpu/session.sh
bash scripts/gpu/plans/x1-start-debug.sh
mkdir -p /tmp/e2e
timeout 300 python3 scripts/gpu/cudagraph_accum_check.py > /tmp/e2e/cudagraph-accum-check.log 2>&1; echo "rc=$?" >> /tmp/e2e/cudagraph-accum-check.log
MODE=fixed STEPS=6 LIMIT=300 SIDES="vf-rl-stack-cudagraphs trl-compile-liger" \
  BENCH="qwen2-0.5b:lora llama-1b:lora qwen2-0.5b:full llama-1b:full" FG=1 bash $S best
echo "plan done"
