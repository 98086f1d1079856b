#!/bin/bash
# One GPU on a host of its own (~24 minutes after the transfers, in order of need; cut where device time ends): issue
# 29's two Llama-1.2B fixed-length cases (64 x (256 + 256) tokens, micro batch 8) against trl-compile-liger, back to
# back, inductor and Triton caches emptied before each side (benchmarks/RESULTS.md, Trainer step at fixed length:
# LoRA 1.37-1.39x, full 1.20x on 2026-11-30).
#   1 (~12 min): Llama-1.2B LoRA, vf-rl then trl-compile-liger, then trl-compile-liger then vf-rl
#   2 (~2 min): Llama-1.2B LoRA profiled with its trace (the step's start and end)
#   3 (~6 min): Llama-1.2B full, vf-rl then trl-compile-liger
#   4 (~2 min): Llama-1.2B full profiled with its trace (where the gaps between kernels fall)
#   5 (~2 min): the small step (SmolLM2 LoRA, 128 rollouts) at the defaults, profiled
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
pair() {  # $1 case (llama-1b:lora), $2 round, then the sides in order
  local case=$1 round=$2; shift 2
  local m=${case%%:*} kind=${case##*:}
  for side in "$@"; do
    fresh_caches
    MODE=fixed STEPS=8 LIMIT=330 SIDES=$side BENCH="$case" FG=1 bash $S best
    mv /tmp/e2e/best-fixed-$m-$kind-$side.json /tmp/e2e/clean-fixed-$m-$kind-$side-$round.json
    mv /tmp/e2e/best-fixed-$m-$kind-$side.log /tmp/e2e/clean-fixed-$m-$kind-$side-$round.log
  done
}
pair llama-1b:lora 1 vf-rl trl-compile-liger
pair llama-1b:lora 2 trl-compile-liger vf-rl
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b --lora --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl --profile \
  --trace /tmp/e2e/trace-llama-lora-clean.json.gz > /tmp/e2e/profile-fixed-llama-1b-lora-clean.log 2>&1
pair llama-1b:full 1 vf-rl trl-compile-liger
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl --profile \
  --trace /tmp/e2e/trace-llama-full-clean.json.gz > /tmp/e2e/profile-fixed-llama-1b-full-clean.log 2>&1
fresh_caches
TAG=clean LIMIT=300 FG=1 bash $S small-step
echo "plan done"
