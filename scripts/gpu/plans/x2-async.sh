#!/bin/bash
# 2 GPUs (nvidia-h100-x2 for H100 figures), ~22 minutes: issue 31 item 1's TRL asynchronous GRPO trainer
# (trl-async: trl vllm-serve on GPU 0 serving runtime LoRA adapters, so each sync loads the adapter alone;
# AsyncGRPOTrainer on GPU 1) against vf-rl, back to back, reverse-text, 16 x 8 rollouts of 128 tokens, 8 minutes each
# after step 1. vf-rl runs first: its vf-vllm start with several API-server processes (the engine initializing while
# they start, src/vf_rl/inference/api_servers.py) has not run on vLLM 0.26 yet, and learning.py stops at a failed
# side; trl-async's adapter syncs ran 116 steps in RESULTS (ai) once TRL's deleted-adapter race was worked around.
# Each side compiles into caches of its own (learning.py --caches cold).
S=scripts/gpu/session.sh
TRL_VLLM=server EXTRA="--eval-every 200" SIDES=vf-rl,trl-async MINUTES=8 TAG=-2gpu-async FG=1 bash $S learning
echo "plan done"
