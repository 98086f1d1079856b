#!/bin/bash
# 4 GPUs (nvidia-h100-x4 for H100 figures), ~17 minutes: issue 26's start-up and generation figures.
#   1. the request-path probe with one vf-vllm on GPU 0 (session.sh engines, ENGINES=1, 10 rounds): the GPU's busy
#      share during the batches and the ms per token of each batch's longest rollout: whose time is a batch's,
#      the GPU's or the host's (RESULTS (ag): a second engine on the GPU gained 3%)
#   2. two pairs at once, vf-rl against trl-liger from cold caches, 8 minutes after each side's step 1: reverse-text
#      on GPUs 0-1, alphabet-sort on GPUs 2-3: launch to step 1 with vf-vllm's engine initializing beside vLLM's API
#      servers (RESULTS (ag): 145.1 s against TRL's 128.6 s), rollouts/s, wait share and reward on both environments
S=scripts/gpu/session.sh
CUDA_VISIBLE_DEVICES=0 ENGINES=1 ROUNDS=10 bash $S engines
(ENV=reverse-text MINUTES=8 TAG=-pair-start EXTRA="--shared --vf-arg torch_compile=false" GPU0=0 FG=1 bash $S pair) &
(ENV=alphabet-sort MINUTES=8 TAG=-pair-start EXTRA="--shared --vf-arg torch_compile=false" GPU0=2 FG=1 bash $S pair) &
wait
echo "plan done"
