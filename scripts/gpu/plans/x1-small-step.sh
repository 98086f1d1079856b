#!/bin/bash
# One GPU, ~25 minutes (the last parts are cut where device time ends). Empty inductor and Triton caches per part.
#   1-2 (~10 min): reverse-text on SmolLM2-135M, vLLM and the trainer on one GPU, 2 minutes after step 1: vf-rl at
#     its defaults, then TRL's fastest shared side (trl-liger, (aj)), back to back: launch to the end of step 1
#     (issue 26: no later than TRL's; (aj) alphabet-sort 92.0 against 84.0 s). The launcher no longer imports
#     transformers for TrainingArguments keys (12.6 s before the panes started in (aq), a fresh machine's cache).
#   3 (~3 min): why reverse-text's step in torch_compile_mode = "reduce-overhead" took 0.32 s ((aq); per-layer
#     compile 0.17 s in (ao)): trainer_step.py realistic, SmolLM2-135M LoRA r8 at reverse-text's sizes (128 rollouts
#     = 16 x 8, one micro batch, prompts 40-90 tokens, completions up to 128), no vLLM on the GPU; per-layer compile
#     and layer graphs, each with a profiled step
#   4 (~5 min): reverse-text in the mode, as in (aq) (whole-GPU peak 85.0 GiB; the trainer now empties the
#     allocator's cache after each recording)
#   5 (~2 min): fixed Llama-1.2B LoRA, layer graphs, profiled (58% MFU; issue 29's 1.3x asks ~64%)
#   6 (~4 min): part 3's batch through the stack's graphs
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
learn() {  # name, sides, extra args
  fresh_caches
  timeout 600 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 2 \
    --sides $2 --shared "${@:3}" --json /tmp/e2e/$1.json --plot /tmp/e2e/$1.png --out /tmp/e2e/$1 > /tmp/e2e/$1.log 2>&1
}
small() {  # side
  fresh_caches
  timeout 420 python3 benchmarks/trainer_step.py --mode realistic --model-config smollm2-135m --lora --lora-rank 8 \
    --lora-alpha 32 --batch 128 --micro-batch 128 --group 8 --prompt-min 40 --prompt-max 90 --max-tokens 128 \
    --cap-share 0.2 --steps 6 --warmup 3 --no-grad-check --sides $1 --profile --trace /tmp/e2e/trace-small.json.gz \
    --json /tmp/e2e/small-step-smollm2-$1.json > /tmp/e2e/small-step-smollm2-$1.log 2>&1
}
learn learning-reverse-text-first-vfrl vf-rl
learn learning-reverse-text-first-trl-liger trl-liger
small vf-rl
small vf-rl-layer-graphs
learn learning-reverse-text-layergraphs-emptycache vf-rl --vf-arg torch_compile=true \
  --vf-arg 'torch_compile_mode="reduce-overhead"'
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b --lora --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl-layer-graphs --profile \
  --trace /tmp/e2e/trace-llama-lora.json.gz > /tmp/e2e/profile-fixed-llama-1b-lora-layer-graphs.log 2>&1
small vf-rl-stack-cudagraphs
echo "plan done"
