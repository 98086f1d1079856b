#!/bin/bash
# Issue 26's two environments whose trainer still waits on generation, vf-rl against trl-liger at the issue's sizes
# (16 x 8 rollouts, 8 minutes per side after its step 1), with today's defaults (vf-vllm's API servers derived from
# the host's cores, TRL's alphabet-sort step in micro batches of 32): alphabet-sort cold, gsm8k after vf-sft.
# 4 GPUs: both pairs at once (GPUs 0-1 and 2-3), ~14 minutes; 2 GPUs (the H100 kinds): ENVS, one after the other,
# ~13 minutes each.
# Started by `PLAN=scripts/gpu/plans/pairs.sh session.sh plan` after the bundle transfers; `session.sh poll` collects.
S=scripts/gpu/session.sh
X="--shared --vf-arg torch_compile=false"
if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
  (FG=1 GPU0=0 ENV=alphabet-sort TAG=-pair EXTRA="$X" bash $S pair) &
  (FG=1 GPU0=2 WARM=1 ENV=gsm8k TAG=-pair EXTRA="$X" bash $S pair) &
  wait
else  # one pair fits a session's device time: ENVS picks (default alphabet-sort; gsm8k runs after vf-sft)
  for env in ${ENVS:-alphabet-sort}; do
    warm=0; [ $env = gsm8k ] && warm=1
    FG=1 GPU0=0 WARM=$warm ENV=$env TAG=-pair EXTRA="$X" bash $S pair
  done
fi
echo "plan done"
