#!/bin/bash
# One GPU, ~22 minutes: the trainer's CUDA-graph mode (torch_compile_mode = "reduce-overhead": the decoder stack
# as CUDA graphs, packed micro batches padded to a few shapes) on a GPU, as a user runs it.
#   0 (~1 min): scripts/gpu/cudagraph_accum_check.py: accumulated gradients, then one recorded graph replayed over
#     packed micro batches of different layouts (bf16, FlashAttention varlen) against the stack without CUDA graphs
#   1 (~12 min): reverse-text on SmolLM2-135M, vLLM and the trainer on one GPU, 3 minutes per side after step 1:
#     the CUDA-graph mode, then per-layer compiled regions (new lengths every step: how often graphs record, the
#     train time per step, reward against seconds)
#   2 (~6 min): realistic Qwen2-0.5B LoRA trainer step (trainer_step.py), the CUDA-graph mode against per-layer
#   3 (~4 min): fixed Qwen2-0.5B LoRA in the CUDA-graph mode twice, inductor's caches empty then warm: the first
#     step a user's second run waits (RESULTS ak: 90 s cold)
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
timeout 300 python3 scripts/gpu/cudagraph_accum_check.py > /tmp/e2e/cudagraph-accum-check.log 2>&1
echo "rc=$?" >> /tmp/e2e/cudagraph-accum-check.log
for tag in cg layers; do
  args=(--vf-arg torch_compile=true)
  [ $tag = cg ] && args+=(--vf-arg 'torch_compile_mode="reduce-overhead"')
  name=learning-reverse-text-$tag
  timeout 720 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 3 \
    --sides vf-rl --shared "${args[@]}" --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name \
    > /tmp/e2e/$name.log 2>&1
done
MODE=realistic STEPS=6 LIMIT=400 SIDES="vf-rl-stack-cudagraphs vf-rl" BENCH="qwen2-0.5b:lora" FG=1 bash $S best
F="--mode fixed --model-config qwen2-0.5b --lora --batch 64 --micro-batch 8 --prompt-len 256 --completion-len 256"
rm -rf /tmp/cg-caches
for start in cold warm; do
  TORCHINDUCTOR_CACHE_DIR=/tmp/cg-caches/inductor TRITON_CACHE_DIR=/tmp/cg-caches/triton timeout 300 python3 \
    benchmarks/trainer_step.py $F --steps 4 --warmup 2 --no-grad-check --sides vf-rl-stack-cudagraphs \
    --json /tmp/e2e/cg-first-step-$start.json > /tmp/e2e/cg-first-step-$start.log 2>&1
done
echo "plan done"
