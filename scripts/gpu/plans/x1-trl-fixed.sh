#!/bin/bash
# One GPU, ~5 minutes a case: TRL's fastest fixed side (trl-compile-liger, (ak)) on CASES (default the four fixed
# cases), for a ratio against vf-rl's sides measured on the same machine just before (RESULTS aq: CASES="llama-1b:lora
# llama-1b:full", then "qwen2-0.5b:lora qwen2-0.5b:full" after x1-layer-graphs2.sh).
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
for case in ${CASES:-qwen2-0.5b:lora qwen2-0.5b:full llama-1b:lora llama-1b:full}; do
  rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton
  MODE=fixed STEPS=6 LIMIT=330 SIDES=trl-compile-liger BENCH="$case" FG=1 bash $S best
done
echo "plan done"
