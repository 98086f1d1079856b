#!/bin/bash
# One GPU, ~31 minutes: the trainer's compile as it is since (an): a packed row's length, segment count and gathered
# keys marked dynamic before the first compile (model._mark_row_sizes), so each region compiles once, on two
# synthetic batches before the first step (trainer/speed/warmup.py); keys gathered only for samples of groups (the fixed
# benchmark's distinct prompts run without the gather). Every run starts with empty inductor and Triton caches.
# Baselines from (an), where each region compiled twice (static, then dynamic) and the fixed batch gathered its keys:
#   0 (ran in (ao): all passed with the sizes dynamic from the first compile): scripts/gpu/cudagraph_accum_check.py
#   0b (~4 min): scripts/gpu/layer_graphs_check.py: per-layer CUDA graphs recorded by hand over the compiled layers
#     (make_graphed_callables), fixed then realistic Qwen2-0.5B LoRA: do they train as the compiled layers do, how
#     fast, how soon
#     (new; the stack as CUDA graphs ran 97,857-111,599 tokens/s after a 90-109 s first step, per-layer 33-43k)
#   1 (~5 min): reverse-text on SmolLM2-135M, vLLM and the trainer on one GPU, 2 minutes after step 1, per-layer:
#     "torch_compile: compiled in" (an: 25.2 s), steps 1-3 (0.58, 0.28, 0.27 s), launch to step 1 (138.1 s)
#   2 (~8 min): fixed Qwen2-0.5B LoRA, 64 x (256 + 256), per-layer then CUDA graphs: tokens/s and the first step
#     (an: 33,313 tokens/s, 21.0 s; 97,857, 109.4 s; ak's CUDA graphs without the gather: 111,599)
#   3 (~9 min): reverse-text as in 1 in the CUDA-graph mode (an: compiled in 305.3 s, launch to step 1 396.7 s)
#   4 (what device time is left): realistic Qwen2-0.5B LoRA, CUDA graphs then per-layer (an: first step 203.1 and
#     22.9 s; 114,781 and 103,708 tokens/s)
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
timeout 300 python3 scripts/gpu/layer_graphs_check.py > /tmp/e2e/layer-graphs-check.log 2>&1
echo "rc=$?" >> /tmp/e2e/layer-graphs-check.log
timeout 300 python3 scripts/gpu/layer_graphs_check.py --mode realistic --warmup 3 \
  > /tmp/e2e/layer-graphs-check-realistic.log 2>&1
echo "rc=$?" >> /tmp/e2e/layer-graphs-check-realistic.log
reverse_text layers
fixed vf-rl
fixed vf-rl-stack-cudagraphs
reverse_text cg
fresh_caches
MODE=realistic STEPS=6 LIMIT=500 SIDES="vf-rl-stack-cudagraphs vf-rl" BENCH="qwen2-0.5b:lora" FG=1 bash $S best
echo "plan done"
