#!/bin/bash
# One GPU, ~6 minutes: TRL's fastest fixed side (trl-compile-liger, as in (ak)) on the two Qwen2-0.5B cases, back to
# back with x1-layer-graphs2.sh's layer graphs (fixed Qwen LoRA 105,015 tokens/s, full 122,735).
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
fresh_caches
MODE=fixed STEPS=6 LIMIT=190 SIDES=trl-compile-liger BENCH="qwen2-0.5b:lora" FG=1 bash $S best
fresh_caches
MODE=fixed STEPS=6 LIMIT=190 SIDES=trl-compile-liger BENCH="qwen2-0.5b:full" FG=1 bash $S best
echo "plan done"
