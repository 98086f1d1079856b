#!/bin/bash
# One H200 (128 GiB of host memory), ~25 minutes: issue 29's longest sequence with the GPU capped at 79 GiB
# (trainer_step.py --gpu-gib: an 80 GB H100's usable memory). (r) on an H100: vf-rl trained 256k tokens per sequence
# (47.6 GiB), TRL 128k (192k ran out of memory plain, offloaded, offloaded with liger), a grid too coarse to say 2x:
# TRL's limit lies in [128k, 192k). Here vf-rl at 320k, then TRL's two offloaded sides at 160k: TRL out of memory at
# 160k and vf-rl through 320k puts vf-rl's limit at >= 2x TRL's. vf-rl at 320k (Llama-3.1-8B-shaped LoRA, offload +
# tiled_mlp): 54.2 GiB on the GPU by vf_rl.config.memory (its (r) error: -2% to -1%; 39.5 GiB at 192k, 47.6 at 256k); the
# offloaded layer inputs take 32 x 327,680 x 4,096 x 2 bytes = 80 GiB of pinned host memory, the harness's master
# weights 15 GiB more. One step of 2 sequences, no warm-up step: (r)'s 256k step took 403 s on an H100, attention
# grows with the square of the length (~630 s here), plus the harness's sampling log-prob pass. JSON: /tmp/e2e/long-
# llama-3.1-8b-lora-{163840-trl-offload-cap79,163840-trl-liger-offload-cap79, 327680-vf-rl-offload-tiled-cap79}.json
S=scripts/gpu/session.sh
free -g | head -2
B=2 STEPS=1 LENGTHS=327680 SIDES=vf-rl TAG=-offload-tiled-cap79 LIMIT=1300 \
  EXTRA="--offload-activations --tiled-mlp --warmup 0 --gpu-gib 79" FG=1 bash $S long
B=2 STEPS=1 LENGTHS=163840 SIDES="trl-liger trl" TAG=-offload-cap79 LIMIT=600 \
  EXTRA="--offload-activations --warmup 0 --gpu-gib 79" FG=1 bash $S long
# what device time is left (~4 min): x1-fixed.sh's first part, Qwen2-0.5B LoRA at fixed length per-layer and as
# CUDA graphs without the identity key gather ((an): 33,313 and 97,857 tokens/s with it)
PART1_ONLY=1 bash scripts/gpu/plans/x1-fixed.sh
echo "plan done"
