#!/bin/bash
# One GPU, ~6 minutes: fixed Llama-1.2B full and LoRA with per-layer compile (vf-rl's default torch_compile mode),
# the varlen kernel bounded, against x1-bound.sh's layer graphs on the same cases (which mode is faster now).
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton
MODE=fixed STEPS=6 LIMIT=200 SIDES=vf-rl BENCH="llama-1b:full llama-1b:lora" FG=1 bash $S best
echo "plan done"
