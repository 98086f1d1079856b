#!/bin/bash
# One H100 (nvidia-h100-x1 gets only H100s), ~28 minutes: the H100-only figures of issues 29 and 26.
#   1. (BIG=1, default) issue 29's 8B-shaped LoRA run at 8k sampled tokens on the shared GPU, nvidia-smi sampled
#      every 2 s (session.sh big: the random model is made first, ~6 minutes in all)
#   2. issue 26 on one shared H100: ENV (default alphabet-sort) with vf-rl and trl-liger back to back, 16 x 8
#      rollouts, 8 minutes each after step 1 (session.sh learning: TRL colocate, --shared)
S=scripts/gpu/session.sh
[ "${BIG:-1}" = 1 ] && FG=1 LIMIT=600 bash $S big
ENV=${ENV:-alphabet-sort} SIDES=vf-rl,trl-liger MINUTES=8 TAG=-h100 EXTRA="--shared --vf-arg torch_compile=false" \
  FG=1 bash $S learning
echo "plan done"
