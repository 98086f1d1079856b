#!/bin/bash
# 2 GPUs (nvidia-h100-x2 for H100 figures), ~22 minutes: issue 31 item 1's TRL asynchronous GRPO trainer
# (trl-async: trl vllm-serve on GPU 0 serving runtime LoRA adapters, so each sync loads the adapter alone;
# AsyncGRPOTrainer on GPU 1), then vf-rl, back to back, reverse-text, 16 x 8 rollouts of 128 tokens, 8 minutes each
# after step 1. trl-async runs first: its adapter syncs have not run on a GPU, and a failure shows within minutes
# (learning.py stops at a failed side). Each side compiles into caches of its own (learning.py --caches cold).
S=scripts/gpu/session.sh
TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-async,vf-rl MINUTES=8 TAG=-2gpu-async FG=1 bash $S learning
echo "plan done"
