#!/bin/bash
# 2 GPUs (nvidia-h100-x2 for H100 figures), ~22 minutes: issue 26's open H100 figures.
#   1. the request-path probe with 1 and 2 vf-vllm servers on GPU 0 (session.sh engines; each server 0.3/N of the
#      GPU and 2 API-server processes): whether a second engine on the same GPU cuts the batch's time on this host,
#      where (af) read 5.7 ms per decode step past two API-server processes
#   2. reverse-text, vf-rl against trl-liger at once, one GPU each (session.sh pair), 8 minutes after each side's
#      step 1, both from cold compile caches: rollouts per second, the trainer's wait share, launch to step 1
S=scripts/gpu/session.sh
CUDA_VISIBLE_DEVICES=0 bash $S engines
ENV=reverse-text MINUTES=8 TAG=-h100-pair EXTRA="--shared --vf-arg torch_compile=false" FG=1 bash $S pair
echo "plan done"
