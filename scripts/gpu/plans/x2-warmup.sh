#!/bin/bash
# 2 GPUs, ~6 minutes: reverse-text with vLLM on GPU 0 and the trainer on GPU 1 (the per-layer compile, the default),
# 3 minutes after step 1. The trainer compiles on two synthetic batches while vf-vllm starts (trainer/speed/warmup.py): step
# 1's training time should be a normal step's, and launch to step 1 shorter by the compile ((al): 21 + 19 s in steps
# 1 and 2 on one H200).
# Against results/learning-reverse-text-2gpu-async-h200.json's vf-rl side (launch to step 1 150.1 s, before vLLM's
# engine was forked and before the warm-up).
S=scripts/gpu/session.sh
SIDES=vf-rl MINUTES=3 EXTRA="--eval-every 200" TAG=-2gpu-warmup FG=1 bash $S learning
echo "plan done"
