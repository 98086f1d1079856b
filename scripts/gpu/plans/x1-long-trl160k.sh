#!/bin/bash
# One H200, ~8 minutes: x1-long320k.sh's TRL half alone (TRL's two offloaded sides at 160k tokens per sequence,
# the GPU capped at 79 GiB); vf-rl's 320k half is the rest of x1-long320k.sh.
S=scripts/gpu/session.sh
free -g | head -2
B=2 STEPS=1 LENGTHS=163840 SIDES="trl-liger trl" TAG=-offload-cap79 LIMIT=400 \
  EXTRA="--offload-activations --warmup 0 --gpu-gib 79" FG=1 bash $S long
echo "plan done"
