#!/bin/bash
# One GPU (nvidia-h100-x1 for issue 29's H100 figures), ~24 minutes: packed attention traced into the compiled decoder
# layers (RESULTS ah: 1.73x on realistic Qwen2-0.5B LoRA on an H200, 2.51x compiled TRL), on an H100:
#   1. the gradient check on realistic batches: vf-rl (compiled layers, traced varlen attention) against TRL and the
#      eager vf-rl side, one process, before any optimizer step (cosine and relative L2 of every LoRA gradient)
#   2. realistic Qwen2-0.5B LoRA and full against trl-compile (the best TRL side there, RESULTS s), one process each
S=scripts/gpu/session.sh
R="--mode realistic --prompt-min 64 --prompt-max 1024 --max-tokens 1024 --cap-share 0.25 --group 8 --batch 64 --micro-batch 8"
mkdir -p /tmp/e2e
timeout 300 python3 benchmarks/trainer_step.py $R --model-config qwen2-0.5b --lora --steps 2 --warmup 1 \
  --sides vf-rl,vf-rl-eager,trl --json /tmp/e2e/gradcheck-realistic-qwen2-0.5b-lora.json \
  > /tmp/e2e/gradcheck-realistic-qwen2-0.5b-lora.log 2>&1
MODE=realistic STEPS=6 LIMIT=500 SIDES="vf-rl trl-compile" BENCH="qwen2-0.5b:lora qwen2-0.5b:full" FG=1 bash $S best
echo "plan done"
