#!/bin/bash
# One GPU (an H100 for issue 29's figures), ~14 minutes, after `session.sh unsloth` (Unsloth's wheels installed
# into /tmp/site-unsloth and its smoke run; .u1 and .u2 carried first): issue 29's Unsloth peer on the four
# fixed-length cases, each its own process through scripts/gpu/unsloth_step.py (Unsloth imported first, its own
# trl 1.15.0), then trl-compile-liger and the trainer's CUDA-graph mode on Qwen2-0.5B LoRA on the same machine.
# 64 x (256 + 256) tokens, micro batch 8, 2 warm-up + 6 timed steps, as RESULTS ak. TRL's cispo loss on both peer
# sides: the first step's summed loss of unsloth and trl-compile-liger should agree.
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
F="--mode fixed --batch 64 --micro-batch 8 --prompt-len 256 --completion-len 256 --steps 6 --warmup 2 --no-grad-check"
for case in qwen2-0.5b:lora llama-1b:lora qwen2-0.5b:full llama-1b:full; do
  m=${case%%:*}; kind=${case##*:}; flag=""; [ $kind = lora ] && flag=--lora
  name=best-fixed-$m-$kind-unsloth
  PYTHONPATH=/tmp/site-unsloth:$PYTHONPATH timeout 400 python3 scripts/gpu/unsloth_step.py $F --model-config $m $flag \
    --sides unsloth --json /tmp/e2e/$name.json > /tmp/e2e/$name.log 2>&1
done
MODE=fixed STEPS=6 LIMIT=300 SIDES="trl-compile-liger vf-rl-stack-cudagraphs" BENCH="qwen2-0.5b:lora" FG=1 bash $S best
echo "plan done"
