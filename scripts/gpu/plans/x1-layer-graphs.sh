#!/bin/bash
# One GPU, ~30 minutes and more (the last parts are cut where device time ends): per-layer CUDA graphs recorded by
# hand (vf_rl/trainer/layer_graphs.py), first as the check script runs them, then through the trainer
# (trainer_step.py's vf-rl-layer-graphs side) against TRL compile and the stack's graphs back to back on the realistic
# batch, then the four fixed cases, then issue 29's longest sequence (x1-long320k.sh) in what device time is left.
# Empty inductor and Triton caches for each part.
#   1 (~4 min): scripts/gpu/layer_graphs_check.py, fixed Qwen2-0.5B LoRA (64 x (256 + 256), and a second row length),
#     sides layers / graphs / eager-graphs: gradients against the compiled layers (rc 1 over 2e-2), tokens/s, first
#     step, recording seconds (ao, compiled layers alone: 41,284 tokens/s, first step 17.7 s; the stack as inductor's
#     CUDA graphs 97,803, first step 152 s)
#   2 (~4 min): the same on three realistic batches (ao: compiled layers 69,402 tokens/s; first try crashed)
#   3 (~3 min): trainer_step.py realistic Qwen2-0.5B LoRA, side vf-rl-layer-graphs (ao: per-layer 106,679 tokens/s,
#     first step 19.6 s; stack CUDA graphs 161,986, 150.3 s)
#   4 (~9 min): TRL compile on the same realistic batch, back to back ((ah), another session: 30,775 tokens/s, steady
#     45,862, first step 386 s)
#   5 (~4 min): the stack's CUDA graphs on it (ao: 161,986 tokens/s, first step 150.3 s)
#   5b (~2 min): fixed Qwen2-0.5B LoRA, per-layer compile, one step under torch.profiler and one under cProfile: where
#     its host time goes (0.88 s a step, 37,275 tokens/s in (ao), against 0.335 s as the stack's graphs; realistic
#     batches lose far less: 0.49 against 0.32 s)
#   6 (~8 min): trainer_step.py fixed, the four cases (Qwen2-0.5B and Llama-1B, LoRA and full), vf-rl-layer-graphs
#     (TRL's best per case and the stack's graphs: (ak))
#   7: x1-long320k.sh (vf-rl at 327,680 tokens on a GPU capped at 79 GiB, then TRL offloaded at 163,840)
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e
fresh_caches() { rm -rf /tmp/cc; export TORCHINDUCTOR_CACHE_DIR=/tmp/cc/inductor TRITON_CACHE_DIR=/tmp/cc/triton; }
fresh_caches
timeout 360 python3 scripts/gpu/layer_graphs_check.py > /tmp/e2e/layer-graphs-check.log 2>&1
echo "rc=$?" >> /tmp/e2e/layer-graphs-check.log
fresh_caches
timeout 360 python3 scripts/gpu/layer_graphs_check.py --mode realistic --warmup 3 \
  > /tmp/e2e/layer-graphs-check-realistic.log 2>&1
echo "rc=$?" >> /tmp/e2e/layer-graphs-check-realistic.log
for side in vf-rl-layer-graphs trl-compile vf-rl-stack-cudagraphs; do
  fresh_caches
  MODE=realistic STEPS=6 LIMIT=600 SIDES=$side BENCH="qwen2-0.5b:lora" FG=1 bash $S best
done
fresh_caches
timeout 300 python3 benchmarks/trainer_step.py --mode fixed --model-config qwen2-0.5b --lora --batch 64 --micro-batch 8 \
  --prompt-len 256 --completion-len 256 --steps 3 --warmup 2 --no-grad-check --sides vf-rl --profile --pyprofile \
  > /tmp/e2e/profile-fixed-qwen2-0.5b-lora-layers.log 2>&1
fresh_caches
MODE=fixed STEPS=6 LIMIT=300 SIDES=vf-rl-layer-graphs FG=1 bash $S best
bash scripts/gpu/plans/x1-long320k.sh
echo "plan done"
