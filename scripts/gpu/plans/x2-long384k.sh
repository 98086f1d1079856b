#!/bin/bash
# Two H200s of one host for its 256 GiB of host memory (one GPU used), ~22 minutes: issue 29's longest sequence,
# Llama-3.1-8B-shaped LoRA at 393,216 tokens per sequence (384k) with activation offload and tiled_mlp, the GPU capped
# at 79 GiB (trainer_step.py --gpu-gib: an 80 GB H100's usable memory). TRL ran out of memory at 192k on an H100 in
# (r) (plain, offloaded, offloaded with liger; it trains 128k), so a 384k step under the cap shows vf-rl's limit at
# >= 2x TRL's. The estimate (vf_rl.memory, as in (r)): 61.7 GiB on the GPU; the offloaded layer inputs take ~96 GiB
# of pinned host memory, the harness's master weights 15 GiB more. One step of 2 sequences (batch must be even), no
# warm-up step: (r)'s 256k step took 403 s on an H100; attention grows with the square of the length (~900 s here),
# plus the harness's sampling log-prob pass. JSON: /tmp/e2e/long-llama-3.1-8b-lora-393216-vf-rl-offload-tiled-cap79.json
S=scripts/gpu/session.sh
B=2 STEPS=1 LENGTHS=393216 SIDES=vf-rl TAG=-offload-tiled-cap79 LIMIT=1650 \
  EXTRA="--offload-activations --tiled-mlp --warmup 0 --gpu-gib 79" FG=1 bash $S long
free -g | head -2
echo "plan done"
