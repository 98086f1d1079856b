#!/bin/bash
# One GPU, ~40 minutes of parts in order of need (the last ones are cut where device time ends): the varlen kernel's
# segment bound under compile (packed layouts carry max_seq_len, PackedLayout.bound; before, the row's length:
# FlashAttention 57% of the per-layer compile's GPU time on a SmolLM2-135M step and 78% in layer graphs, RESULTS ar).
# Empty inductor and Triton caches per part.
#   1 (~5 min): scripts/gpu/layer_graphs_check.py fixed (its rows carry the bound), sides layers, layers-again (the
#     run-to-run floor), eager (exact longest segments, not compiled: the bounded kernel's check), graphs: the
#     gradients still agree ((aq): graphs 2.64e-2, floor 2.66e-2, eager 3.56e-2)
#   2 (~2 min): (ar)'s small step, per-layer compile and layer graphs ((ar): 0.149 s and 0.248 s; the first
#     optimizer step's summed loss -0.0614952 on both, which the bound must not change)
#   3 (~4 min): fixed Llama-1.2B LoRA and full in layer graphs ((aq): 77,883 / 69,822 tokens/s)
#   4 (~10 min): TRL's fastest fixed side on the same two cases, back to back with 3 ((aq): 65,165 / 60,647): issue
#     29's 1.3x asks 84,715 / 78,841
#   5 (~2 min): fixed Llama-1.2B LoRA in layer graphs, profiled, with its trace: where the GPU waits ((ar): 49.6 ms
#     idle of a 413 ms step; the profile now names the kernels the gaps end at)
#   6 (~4 min): fixed Qwen2-0.5B LoRA and full in layer graphs ((aq): 105,015 / 122,735)
#   7 (~5 min): reverse-text at vf-rl's defaults, as (ar) (120.1 s to step 1; 0.428 s steps)
#   8 (~5 min): reverse-text in reduce-overhead, its one pass no longer padded to the token budget's bucket ((ar):
#     0.479 s steps, whole-GPU peak 84.9 GiB)
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
fresh_caches
timeout 420 python3 scripts/gpu/layer_graphs_check.py --sides layers,layers-again,eager,graphs > /tmp/e2e/layer-graphs-check-bound.log 2>&1
echo "rc=$?" >> /tmp/e2e/layer-graphs-check-bound.log
small() {  # side
  fresh_caches
  timeout 420 python3 benchmarks/trainer_step.py --mode realistic --model-config smollm2-135m --lora --lora-rank 8 \
    --lora-alpha 32 --batch 128 --micro-batch 128 --group 8 --prompt-min 40 --prompt-max 90 --max-tokens 128 \
    --cap-share 0.2 --steps 6 --warmup 3 --no-grad-check --sides $1 --profile --trace /tmp/e2e/trace-small-bound.json.gz \
    --json /tmp/e2e/small-step-bound-smollm2-$1.json > /tmp/e2e/small-step-bound-smollm2-$1.log 2>&1
}
small vf-rl
small vf-rl-layer-graphs
fresh_caches
MODE=fixed STEPS=6 LIMIT=300 SIDES=vf-rl-layer-graphs BENCH="llama-1b:lora llama-1b:full" FG=1 bash $S best
CASES="llama-1b:lora llama-1b:full" bash scripts/gpu/plans/x1-trl-fixed.sh
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b --lora --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl-layer-graphs --profile \
  --trace /tmp/e2e/trace-llama-lora-bound.json.gz > /tmp/e2e/profile-fixed-llama-1b-lora-bound.log 2>&1
fresh_caches
MODE=fixed STEPS=6 LIMIT=300 SIDES=vf-rl-layer-graphs BENCH="qwen2-0.5b:lora qwen2-0.5b:full" FG=1 bash $S best
fresh_caches
name=learning-reverse-text-bound
timeout 600 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 2 \
  --sides vf-rl --shared --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name > /tmp/e2e/$name.log 2>&1
fresh_caches
name=learning-reverse-text-bound-layergraphs
timeout 600 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 2 \
  --sides vf-rl --shared --vf-arg torch_compile=true --vf-arg 'torch_compile_mode="reduce-overhead"' \
  --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name > /tmp/e2e/$name.log 2>&1
echo "plan done"
