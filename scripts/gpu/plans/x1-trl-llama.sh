#!/bin/bash
# One GPU, ~12 minutes: TRL's fastest fixed side (trl-compile-liger, as in (ak)) on the two Llama-1.2B cases, back to
# back with x1-layer-graphs2.sh's layer graphs (fixed Llama LoRA 77,883 tokens/s, full 69,822).
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
fresh_caches
MODE=fixed STEPS=6 LIMIT=330 SIDES=trl-compile-liger BENCH="llama-1b:lora" FG=1 bash $S best
fresh_caches
MODE=fixed STEPS=6 LIMIT=330 SIDES=trl-compile-liger BENCH="llama-1b:full" FG=1 bash $S best
echo "plan done"
