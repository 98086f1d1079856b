#!/bin/bash
# One GPU, ~15 minutes: why reverse-text's training step in torch_compile_mode = "reduce-overhead" takes 0.32 s
# (RESULTS aq; the per-layer compile's 0.17 s in (ao)) on SmolLM2-135M, one micro batch of 128 rollouts (~4,000
# tokens), and what the trainer now reserves while it records shapes (it empties the allocator's cache after each).
# Empty inductor and Triton caches for each part.
#   1 (~7 min): trainer_step.py realistic, SmolLM2-135M LoRA r8, reverse-text's sizes (128 rollouts = 16 x 8, one
#     micro batch, prompts 40-90 tokens, completions up to 128), no vLLM on the GPU: per-layer compile, layer graphs,
#     the stack's graphs, each with a profiled step (torch.profiler)
#   2 (~5 min): reverse-text end to end in the mode, as in (aq) (whole-GPU peak 85.0 GiB there)
#   3 (~2 min): fixed Llama-1.2B LoRA, layer graphs, profiled (52-58% MFU; issue 29's 1.3x asks ~64%)
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
for side in vf-rl vf-rl-layer-graphs vf-rl-stack-cudagraphs; do
  fresh_caches
  timeout 360 python3 benchmarks/trainer_step.py --mode realistic --model-config smollm2-135m --lora --lora-rank 8 \
    --lora-alpha 32 --batch 128 --micro-batch 128 --group 8 --prompt-min 40 --prompt-max 90 --max-tokens 128 \
    --cap-share 0.2 --steps 6 --warmup 3 --no-grad-check --sides $side --profile \
    --json /tmp/e2e/small-step-smollm2-$side.json > /tmp/e2e/small-step-smollm2-$side.log 2>&1
done
fresh_caches
name=learning-reverse-text-layergraphs-emptycache
timeout 600 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 2 \
  --sides vf-rl --shared --vf-arg torch_compile=true --vf-arg 'torch_compile_mode="reduce-overhead"' \
  --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name > /tmp/e2e/$name.log 2>&1
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b --lora --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl-layer-graphs --profile \
  > /tmp/e2e/profile-fixed-llama-1b-lora-layer-graphs.log 2>&1
echo "plan done"
