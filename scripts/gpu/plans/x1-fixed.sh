#!/bin/bash
# One GPU, ~25 minutes: issue 29's four fixed-length cases (64 x (256 + 256), micro batch 8) with the code as it is
# since (an): a packed micro batch gathers its keys only when its samples carry a group, so the benchmark's fixed
# batch (distinct prompts, no groups) runs (ak)'s form again. (an) with the identity gather: Qwen2-0.5B LoRA
# per-layer 33,313 tokens/s, CUDA graphs 97,857; (ak) without it: CUDA graphs 111,599 (1.99x TRL compile+liger),
# (am) per-layer padded 43,230.
#   1 (~4 min): Qwen2-0.5B LoRA, per-layer then CUDA graphs (empty inductor caches: a user's first run)
#   2 (~20 min; not with PART1_ONLY=1): the four cases, the CUDA-graph stack against TRL compile+liger and TRL compile, back to back
S=scripts/gpu/session.sh
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
mkdir -p /tmp/e2e
for side in vf-rl vf-rl-stack-cudagraphs; do
  fresh_caches
  timeout 450 python3 benchmarks/trainer_step.py --mode fixed --model-config qwen2-0.5b --lora --batch 64 \
    --micro-batch 8 --prompt-len 256 --completion-len 256 --steps 6 --warmup 2 --no-grad-check --sides $side \
    --json /tmp/e2e/gather-fixed-qwen2-0.5b-lora-$side.json > /tmp/e2e/gather-fixed-qwen2-0.5b-lora-$side.log 2>&1
done
[ "${PART1_ONLY:-0}" = 1 ] && exit 0
fresh_caches
MODE=fixed STEPS=6 LIMIT=300 SIDES="vf-rl-stack-cudagraphs trl-compile-liger trl-compile" \
  BENCH="llama-1b:lora qwen2-0.5b:full llama-1b:full qwen2-0.5b:lora" FG=1 bash $S best
echo "plan done"
