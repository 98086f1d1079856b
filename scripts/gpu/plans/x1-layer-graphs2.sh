#!/bin/bash
# One GPU, ~30 minutes (the last parts are cut where device time ends): torch_compile_mode = "reduce-overhead" as it
# runs since (ap), the compiled layers recorded as CUDA graphs, all layers in one recording per shape
# (vf_rl/trainer/layer_graphs.py; in (ap) each layer had graphs of its own: realistic Qwen2-0.5B LoRA 166,971
# tokens/s, first step 24.4 s, peak 12.7 GiB against the stack's 8.8; fixed 97,659 / 111,377 / 67,992 / 63,737 on
# the four cases). Empty inductor and Triton caches for each part.
#   1 (~5 min): scripts/gpu/layer_graphs_check.py fixed, sides layers, layers-again (run-to-run floor), eager (the
#     bf16 floor), graphs, eager-graphs (ap: graphs 2.6e-02 from the compiled layers, eager layers recorded 3.5e-02;
#     rc 1 now only over 2e-2 and both floors)
#   2 (~5 min): reverse-text on SmolLM2-135M, vLLM and the trainer on one GPU, 2 minutes after step 1, in the mode
#     (ao, per-layer: compiled in 14.3 s, launch to step 1 115.5 s, 282 steps, median 0.17 s, held-out 0.090 ->
#     0.441; the stack's graphs: 195.8 s, 283.1 s, 236 steps, 0.34 s, 0.104 -> 0.460)
#   3 (~3 min): trainer_step.py realistic Qwen2-0.5B LoRA, vf-rl-layer-graphs (the mode; TRL compile in (ap), back
#     to back: 45,218 tokens/s)
#   4 (~8 min): the four fixed cases, vf-rl-layer-graphs
#   5 (~2 min): fixed Qwen2-0.5B LoRA in the mode under torch.profiler: GPU time against the step's wall time (the
#     trainer's step 0.336 s in (ap) against the check's replay of 0.245 s)
#   6 (~5 min): the check on three realistic batches
#   7 (~4 min): fixed Llama-1.2B LoRA, the stack's CUDA graphs on this code ((ak): 81,720 tokens/s on older code)
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
fresh_caches
timeout 420 python3 scripts/gpu/layer_graphs_check.py > /tmp/e2e/layer-graphs-check.log 2>&1
echo "rc=$?" >> /tmp/e2e/layer-graphs-check.log
fresh_caches
name=learning-reverse-text-layergraphs
timeout 600 python3 benchmarks/learning.py --env reverse-text --device gpu --model /tmp/smol --minutes 2 \
  --sides vf-rl --shared --vf-arg torch_compile=true --vf-arg 'torch_compile_mode="reduce-overhead"' \
  --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name > /tmp/e2e/$name.log 2>&1
fresh_caches
MODE=realistic STEPS=6 LIMIT=400 SIDES=vf-rl-layer-graphs BENCH="qwen2-0.5b:lora" FG=1 bash $S best
fresh_caches
MODE=fixed STEPS=6 LIMIT=300 SIDES=vf-rl-layer-graphs FG=1 bash $S best
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config qwen2-0.5b --lora --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl-layer-graphs --profile \
  > /tmp/e2e/profile-fixed-qwen2-0.5b-lora-layer-graphs.log 2>&1
fresh_caches
timeout 420 python3 scripts/gpu/layer_graphs_check.py --mode realistic --warmup 3 \
  > /tmp/e2e/layer-graphs-check-realistic.log 2>&1
echo "rc=$?" >> /tmp/e2e/layer-graphs-check-realistic.log
fresh_caches
MODE=fixed STEPS=6 LIMIT=300 SIDES=vf-rl-stack-cudagraphs BENCH="llama-1b:lora" FG=1 bash $S best
echo "plan done"
