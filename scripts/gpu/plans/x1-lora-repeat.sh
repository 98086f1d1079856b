#!/bin/bash
# One GPU, ~25 minutes in order of need (cut where device time ends), issue 29's Llama-1.2B LoRA at fixed length
# (64 x (256 + 256) tokens, micro batch 8: (as) 79,150 tokens/s, 1.33x TRL's 59,537; (au) 75,516 and 75,258 against
# 59,354 and 53,873, 1.27x, its GPU beside a 384k step's lane) after the step's start stopped walking every module
# (Module.train) and making a zeros_like per adapter matrix. Empty caches per part.
#   1 (~2 min): (au)'s small step (SmolLM2 LoRA, 128 rollouts) at the defaults, profiled: the 15.6 ms of Python at
#     its start gone? ((au) 0.101 s a step, (as) 0.095)
#   2 (~1 min): gemm_ceiling.py, Llama-1.2B full and LoRA, each product replayed from a CUDA graph (no launch latency)
#   2c (~5 min): trainer/speed/fusion.py (q/k/v and LoRA A products fused in the compiled layers; new, never run on a GPU):
#     scripts/gpu/layer_graphs_check.py (the compiled layers' gradients against eager; (as) floor 2.6e-2, eager 3.5e-2),
#     then Llama-1.2B LoRA and full weights, vf-rl and vf-rl-unfused interleaved in one process (what it gains:
#     gemm_ceiling's k/v products ran at ~200 TFLOP/s against q's ~480; ~30 ms a full-weight step by that table)
#   3 (~2 min): Llama-1.2B LoRA at the defaults, profiled, with its trace: its idle gaps ((as): 47.5 ms of 405.9)
#   4 (~10 min): Llama-1.2B LoRA, vf-rl's defaults then trl-compile-liger, twice, back to back
#   5 (rest): Unsloth's wheels (.u1, .u2 carried first) and x1-unsloth.sh's four cases
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
fresh_caches
timeout 420 python3 benchmarks/trainer_step.py --mode realistic --model-config smollm2-135m --lora --lora-rank 8 \
  --lora-alpha 32 --batch 128 --micro-batch 128 --group 8 --prompt-min 40 --prompt-max 90 --max-tokens 128 \
  --cap-share 0.2 --steps 6 --warmup 3 --no-grad-check --sides vf-rl --profile \
  --trace /tmp/e2e/trace-small-trainmode.json.gz \
  --json /tmp/e2e/small-step-trainmode-smollm2-vf-rl.json > /tmp/e2e/small-step-trainmode-smollm2-vf-rl.log 2>&1
for kind in full lora; do
  flag=""; [ $kind = lora ] && flag=--lora
  timeout 150 python3 benchmarks/gemm_ceiling.py --model-config llama-1b $flag \
    --json /tmp/e2e/gemm-graphed-llama-1b-$kind.json > /tmp/e2e/gemm-graphed-llama-1b-$kind.log 2>&1
done
fresh_caches
timeout 420 python3 scripts/gpu/layer_graphs_check.py --sides layers,layers-again,eager,graphs \
  > /tmp/e2e/layer-graphs-check-fusion.log 2>&1
for kind in lora full; do
  flag=""; [ $kind = lora ] && flag=--lora
  fresh_caches
  timeout 420 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b $flag --batch 64 --micro-batch 8 \
    --prompt-len 256 --completion-len 256 --steps 8 --warmup 2 --no-grad-check --sides vf-rl,vf-rl-unfused --interleave \
    --json /tmp/e2e/fusion-fixed-llama-1b-$kind.json > /tmp/e2e/fusion-fixed-llama-1b-$kind.log 2>&1
done
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b --lora --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl --profile \
  --trace /tmp/e2e/trace-llama-lora-trainmode.json.gz > /tmp/e2e/profile-fixed-llama-1b-lora-trainmode.log 2>&1
for round in 1 2; do
  for side in vf-rl trl-compile-liger; do
    fresh_caches
    MODE=fixed STEPS=6 LIMIT=330 SIDES=$side BENCH="llama-1b:lora" FG=1 bash $S best
    mv /tmp/e2e/best-fixed-llama-1b-lora-$side.json /tmp/e2e/trainmode-fixed-llama-1b-lora-$side-$round.json
    mv /tmp/e2e/best-fixed-llama-1b-lora-$side.log /tmp/e2e/trainmode-fixed-llama-1b-lora-$side-$round.log
  done
done
if ls /tmp/chunks/.u1 > /dev/null 2>&1; then
  OUT=/tmp/e2e bash $S unsloth > /tmp/e2e/unsloth-setup.log 2>&1
  bash scripts/gpu/plans/x1-unsloth.sh
fi
echo "lane done"
