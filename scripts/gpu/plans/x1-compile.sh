#!/bin/bash
# One GPU, ~23 minutes, then what is left: the trainer's compile as it is since (am): static for the first sizes,
# then once with the sizes that changed dynamic (dynamo's automatic dynamic shapes), both on two synthetic batches
# before the first step (trainer/warmup.py; on one shared GPU once vLLM is up); LoRA's layers one graph; compiled
# micro batches always packed. (am) compiled with dynamic=True: CUDA graphs crashed (SIGSEGV), the per-layer compile
# took 68.7 s on reverse-text and 87.7 s for fixed Qwen2-0.5B LoRA's first step. Every run starts with empty inductor
# and Triton caches.
#   0 (~1 min): scripts/gpu/cudagraph_accum_check.py (accumulation, packed layouts: passed in al; three shapes through
#     the static then dynamic compile, new)
#   1 (~5 min): reverse-text on SmolLM2-135M, vLLM and the trainer on one GPU, 2 minutes after step 1, per-layer (the
#     default): the warm-up's seconds ("torch_compile: compiled in"), the training time of steps 1-3 (am: 68.7 s,
#     then 0.61, 0.21, 0.16 s)
#   2 (~8 min): fixed Qwen2-0.5B LoRA, 64 x (256 + 256), per-layer then CUDA graphs: tokens/s and the first step
#     (am per-layer: 43,230 tokens/s, 87.7 s; ak CUDA graphs static: 111,599 tokens/s, 90.0 s)
#   3 (~9 min): reverse-text as in 1 in the CUDA-graph mode (al: steps 1-3 trained 111.2, 1.8, 186.6 s)
#   4 (what device time is left): realistic Qwen2-0.5B LoRA, CUDA graphs then per-layer (al: first step 188.9 and
#     37.2 s, steady 0.30 and 0.54 s per step)
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
reverse_text() {  # $1: layers or cg
  local args=(--vf-arg torch_compile=true) name=learning-reverse-text-compile-$1
  [ "$1" = cg ] && args+=(--vf-arg 'torch_compile_mode="reduce-overhead"')
  fresh_caches
  timeout 600 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 2 \
    --sides vf-rl --shared "${args[@]}" --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name \
    > /tmp/e2e/$name.log 2>&1
}
fixed() {  # $1: a trainer_step.py side
  fresh_caches
  timeout 450 python3 benchmarks/trainer_step.py --mode fixed --model-config qwen2-0.5b --lora --batch 64 \
    --micro-batch 8 --prompt-len 256 --completion-len 256 --steps 6 --warmup 2 --no-grad-check --sides $1 \
    --json /tmp/e2e/compile-fixed-qwen2-0.5b-lora-$1.json > /tmp/e2e/compile-fixed-qwen2-0.5b-lora-$1.log 2>&1
}
fresh_caches
timeout 300 python3 scripts/gpu/cudagraph_accum_check.py > /tmp/e2e/cudagraph-accum-check.log 2>&1
echo "rc=$?" >> /tmp/e2e/cudagraph-accum-check.log
reverse_text layers
fixed vf-rl
fixed vf-rl-stack-cudagraphs
reverse_text cg
fresh_caches
MODE=realistic STEPS=6 LIMIT=500 SIDES="vf-rl-stack-cudagraphs vf-rl" BENCH="qwen2-0.5b:lora" FG=1 bash $S best
echo "plan done"
