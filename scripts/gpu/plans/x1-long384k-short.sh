#!/bin/bash
# One GPU (a one-GPU host's 125 GiB of host memory is enough): issue 29's longest sequence, Llama-3.1-8B-shaped LoRA at
# 393,216 tokens per sequence (384k) with activation offload and tiled_mlp, the GPU capped at 79 GiB (an 80 GB H100's
# usable memory). TRL trains 160k and runs out of memory at 192k (benchmarks/RESULTS.md, Longest sequence): one step at 384k puts vf-rl's
# limit at >= 2x TRL's. The step's group is one 384k sequence and one of 512 + 512 tokens (trainer_step.py
# --last-completion-len: groups need two rollouts; with micro batch 1 the peak is the long sequence's, and the step
# takes about half the time of two long ones, which ran past a whole session's device time).
# Pinned host memory: 32 x 393,216 x 4,096 x 2 bytes = 96 GiB of offloaded layer inputs for the long sequence.
# Time: steps of two sequences at 192k and 256k on an H100 (264 s, 403 s) fit a + b L^2 at ~800 s for two
# 384k sequences, ~450 s for one, compile included. --heartbeat 60: the step's seconds and GPU memory every minute.
# JSON: /tmp/e2e/long-llama-3.1-8b-lora-393216-vf-rl-short-offload-tiled-cap79.json
S=scripts/gpu/session.sh
free -g | head -2
B=2 STEPS=1 LENGTHS=393216 SIDES=vf-rl TAG=-short-offload-tiled-cap79 LIMIT=${LIMIT:-1150} \
  EXTRA="--offload-activations --tiled-mlp --warmup 0 --gpu-gib 79 --uniform-sampling-logprobs --last-completion-len 512 --heartbeat 60" \
  FG=1 bash $S long
free -g | head -2
echo "lane done"
