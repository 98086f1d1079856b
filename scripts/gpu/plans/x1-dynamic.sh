#!/bin/bash
# One GPU, ~20 minutes: the trainer's compile with dynamic shapes from the first step (trainer/model.py,
# dynamic=True), replacing the compile for the first shape and the second, dynamic one at the first new length
# (benchmarks/RESULTS.md, al), and the compile on a synthetic batch before the first step (trainer/warmup.py; on one
# shared GPU once vLLM is up, so the learning runs show step 1 without its compile, not the start overlapped: that is
# plans/x2-warmup.sh). Every run starts with empty inductor and Triton caches of its own.
#   0 (~1 min): scripts/gpu/cudagraph_accum_check.py (accumulation, packed layouts) with the stack now dynamic
#   1 (~8 min): reverse-text on SmolLM2-135M, vLLM and the trainer on one GPU, 2 minutes per side after step 1, the
#     per-layer default then the CUDA-graph mode: the training time of steps 1-3 (al: 21.1, 19.1, 0.26 s per-layer;
#     111.2, 1.8, 186.6 s as CUDA graphs)
#   2 (~5 min): fixed Qwen2-0.5B LoRA, 64 x (256 + 256), per-layer then CUDA graphs: tokens/s against the static
#     compile's (ak: 111,599 as CUDA graphs; al: first step 112.7 s cold)
#   3 (~6 min): realistic Qwen2-0.5B LoRA, CUDA graphs then per-layer (al: first step 188.9 and 37.2 s, steady
#     0.30 and 0.54 s per step)
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
fresh_caches
timeout 300 python3 scripts/gpu/cudagraph_accum_check.py > /tmp/e2e/cudagraph-accum-check.log 2>&1
echo "rc=$?" >> /tmp/e2e/cudagraph-accum-check.log
for tag in layers cg; do
  args=(--vf-arg torch_compile=true)
  [ $tag = cg ] && args+=(--vf-arg 'torch_compile_mode="reduce-overhead"')
  name=learning-reverse-text-dynamic-$tag
  fresh_caches
  timeout 600 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 2 \
    --sides vf-rl --shared "${args[@]}" --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name \
    > /tmp/e2e/$name.log 2>&1
done
F="--mode fixed --model-config qwen2-0.5b --lora --batch 64 --micro-batch 8 --prompt-len 256 --completion-len 256"
for side in vf-rl vf-rl-stack-cudagraphs; do
  fresh_caches
  timeout 300 python3 benchmarks/trainer_step.py $F --steps 6 --warmup 2 --no-grad-check --sides $side \
    --json /tmp/e2e/dynamic-fixed-qwen2-0.5b-lora-$side.json > /tmp/e2e/dynamic-fixed-qwen2-0.5b-lora-$side.log 2>&1
done
fresh_caches
MODE=realistic STEPS=6 LIMIT=400 SIDES="vf-rl-stack-cudagraphs vf-rl" BENCH="qwen2-0.5b:lora" FG=1 bash $S best
echo "plan done"
