#!/bin/bash
# A 4-GPU host, ~26 minutes: issue 31's ZeRO-3 past the first update and the scaling table, and on an H100
# host issue 29's shared 8B run with its peak memory measured.
#   GPUs 0-2: ZeRO-3 full weights of the Llama-3.1-8B shape on GPUs 1-2 with vf-vllm on GPU 0, 5 steps;
#             then the same without liger-kernel, 3 steps (is (ab)'s 0.85-nat step-1 sampler gap liger's?)
#   GPU 3   : (H100 only) the 8B-shaped LoRA run at 8k sampled tokens on one shared GPU, nvidia-smi sampled
#   then GPUs 0-3: the whole loop's throughput per layout (1+1, 2+2, 3+1 GPUs: session.sh scaling)
S=scripts/gpu/session.sh
bash $S model
(export CUDA_VISIBLE_DEVICES=0,1,2
 FG=1 TRAIN_GPUS=2 LIMIT=540 STEPS=5 bash $S zero3
 FG=1 TRAIN_GPUS=2 LIMIT=360 STEPS=3 TAG=noliger TRAINER_ARGS="use_liger = false" bash $S zero3) &
if nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | grep -q H100; then
  (CUDA_VISIBLE_DEVICES=3 FG=1 LIMIT=840 bash $S big) &
fi
wait
CUDA_VISIBLE_DEVICES=0,1,2,3 STEPS=10 FG=1 bash $S scaling
echo "plan done"
