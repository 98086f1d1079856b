#!/bin/bash
# 2 GPUs (nvidia-h100-x2 for H100 figures), ~22 minutes: issue 31's server-mode pair again ((o): vf-rl 0.529 against
# TRL's 0.541 at 8 minutes): TRL's GRPOTrainer with liger against `trl vllm-serve` on GPU 0 (trl-liger), then vf-rl
# with vLLM on GPU 0 and the trainer on GPU 1, reverse-text, 16 x 8 rollouts of 128 tokens, 8 minutes each after
# step 1, held-out reward every 200 steps.
S=scripts/gpu/session.sh
TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-liger,vf-rl MINUTES=8 TAG=-2gpu-server FG=1 bash $S learning
echo "plan done"
