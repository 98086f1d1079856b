#!/bin/bash
# 2 GPUs, ~22 minutes: issue 31 item 1, x2-async.sh (TRL's asynchronous GRPO trainer with runtime-LoRA adapter syncs
# against vf-rl); if the trl-async side fails (its adapter syncs have not run on a GPU; learning.py stops at a failed
# side), x2-server.sh's pair (trl-liger in server mode against vf-rl) in the time left.
S=scripts/gpu/session.sh
TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-async,vf-rl MINUTES=8 TAG=-2gpu-async FG=1 bash $S learning \
  || TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-liger,vf-rl MINUTES=8 TAG=-2gpu-server FG=1 bash $S learning
echo "plan done"
