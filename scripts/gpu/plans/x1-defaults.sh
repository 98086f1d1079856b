#!/bin/bash
# One GPU, ~25 minutes in order of need (cut where device time ends): the default that records the compiled layers
# as CUDA graphs on one trainer GPU (config/defaults.py records_layers_by_default, RESULTS as) as a user runs it,
# Llama-1.2B LoRA's 1.3x over TRL repeated, and where Llama-1.2B full weights' step goes. Empty caches per part.
#   1 (~5 min): reverse-text at vf-rl's defaults, vLLM on the same GPU ((as): per-layer default 0.418 s steps,
#     53.9 GiB; explicit reduce-overhead 0.385 s, 61.5 GiB, 113.1 s to step 1); the compile now starts once vLLM
#     holds its share of the GPU (its log: "vf-vllm holds N GiB of this GPU after S s"), not at /health: launch to
#     step 1 against (ar)'s 120.1 s and TRL-liger's 124.7 s; vLLM's capture and warm-up must be unharmed
#   2 (~2 min): (as)'s small step at the defaults (the LoRA casts' module walk now once per model; (as) 0.095 s),
#     with cProfile too: which Python the GPU waits on (48.7 ms idle of a 104 ms step in (as))
#   2b (~1 min): benchmarks/gemm_ceiling.py on the fixed Llama-1.2B step, full and LoRA: its matmuls and attention
#     timed alone, the tokens/s no schedule of them can beat (1.3x over TRL's 61,809 asks 80,352 on full weights)
#   3 (~10 min): fixed Llama-1.2B LoRA, vf-rl's defaults then trl-compile-liger, twice, back to back ((as): 79,150
#     against 59,537, 1.33x; (aq)'s TRL ran 65,165): the spread of both sides
#   4 (~2 min): fixed Llama-1.2B full at the defaults, profiled, with its trace ((as): 72,304 tokens/s, 54% MFU,
#     1.17x TRL; issue 29's 1.3x asks 80,352): which kernels and gaps the step is
#   5 (~5 min): fixed Llama-1.2B full, trl-compile-liger then vf-rl's defaults
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
fresh_caches
name=learning-reverse-text-defaults
timeout 600 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 2 \
  --sides vf-rl --shared --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name > /tmp/e2e/$name.log 2>&1
fresh_caches
timeout 420 python3 benchmarks/trainer_step.py --mode realistic --model-config smollm2-135m --lora --lora-rank 8 \
  --lora-alpha 32 --batch 128 --micro-batch 128 --group 8 --prompt-min 40 --prompt-max 90 --max-tokens 128 \
  --cap-share 0.2 --steps 6 --warmup 3 --no-grad-check --sides vf-rl --profile --pyprofile \
  --trace /tmp/e2e/trace-small-defaults.json.gz \
  --json /tmp/e2e/small-step-defaults-smollm2-vf-rl.json > /tmp/e2e/small-step-defaults-smollm2-vf-rl.log 2>&1
for kind in full lora; do  # part 2b (~1 min): the fixed Llama-1.2B step's matmuls alone, a ceiling on its tokens/s
  flag=""; [ $kind = lora ] && flag=--lora
  timeout 150 python3 benchmarks/gemm_ceiling.py --model-config llama-1b $flag \
    --json /tmp/e2e/gemm-ceiling-llama-1b-$kind.json > /tmp/e2e/gemm-ceiling-llama-1b-$kind.log 2>&1
done
for round in 1 2; do
  for side in vf-rl trl-compile-liger; do
    fresh_caches
    MODE=fixed STEPS=6 LIMIT=330 SIDES=$side BENCH="llama-1b:lora" FG=1 bash $S best
    mv /tmp/e2e/best-fixed-llama-1b-lora-$side.json /tmp/e2e/defaults-fixed-llama-1b-lora-$side-$round.json
    mv /tmp/e2e/best-fixed-llama-1b-lora-$side.log /tmp/e2e/defaults-fixed-llama-1b-lora-$side-$round.log
  done
done
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl --profile \
  --trace /tmp/e2e/trace-llama-full-defaults.json.gz > /tmp/e2e/profile-fixed-llama-1b-full-defaults.log 2>&1
for side in trl-compile-liger vf-rl; do
  fresh_caches
  MODE=fixed STEPS=6 LIMIT=330 SIDES=$side BENCH="llama-1b:full" FG=1 bash $S best
done
echo "plan done"
