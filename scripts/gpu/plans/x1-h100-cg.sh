#!/bin/bash
# One H100 (issue 29's device), ~30 minutes: the accumulation and layout check, then the four fixed-length cases in
# the trainer's CUDA-graph mode (vf-rl-layer-graphs: torch_compile_mode = "reduce-overhead", the compiled layers
# recorded), the stack's inductor graphs (vf-rl-stack-cudagraphs) and trl-compile-liger back to back, then
# Llama-1.2B full (1.24x on an H200, RESULTS ak) with torch_compile_mode = "max-autotune".
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
timeout 300 python3 scripts/gpu/cudagraph_accum_check.py > /tmp/e2e/cudagraph-accum-check.log 2>&1
echo "rc=$?" >> /tmp/e2e/cudagraph-accum-check.log
MODE=fixed STEPS=6 LIMIT=300 SIDES="vf-rl-layer-graphs vf-rl-stack-cudagraphs trl-compile-liger" \
  BENCH="qwen2-0.5b:lora llama-1b:lora qwen2-0.5b:full llama-1b:full" FG=1 bash $S best
MODE=fixed STEPS=6 LIMIT=500 SIDES="vf-rl-stack-autotune" BENCH="llama-1b:full" FG=1 bash $S best
echo "plan done"
