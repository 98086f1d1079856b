#!/bin/bash
# A 4-GPU host, ~20 minutes: issue 31 (several GPUs) and issue 29's full weights at 8B. Started by
# `PLAN=scripts/gpu/plans/x4-multi.sh session.sh plan` after the bundle transfers (.gpu with the deepspeed wheel),
# collected with `session.sh poll`.
#   GPUs 0-2: nccl into vf-vllm as 2 tensor-parallel shards and as 2 data-parallel engines (the trainer on GPU 2),
#             then ZeRO-3 full-weight training of the Llama-3.1-8B shape on GPUs 1-2 with vf-vllm on GPU 0
#   GPU 3   : the Llama-3.1-8B shape with full weights at 4k tokens per sequence, vf-rl and trl-liger (an OOM is a result)
#   then GPUs 0-3: the whole loop's throughput per layout (1+1, 2+2, 3+1 GPUs: session.sh scaling)
# (ZeRO-3 on 4 trainer GPUs beside vLLM needs 5 GPUs: an x8 host)
S=scripts/gpu/session.sh
(export CUDA_VISIBLE_DEVICES=0,1,2; FG=1 bash $S multi; FG=1 TRAIN_GPUS=2 bash $S zero3) &
(export CUDA_VISIBLE_DEVICES=3; FG=1 FULL=1 LENGTHS=4096 B=8 STEPS=1 LIMIT=500 SIDES="vf-rl trl-liger" bash $S long) &
wait
CUDA_VISIBLE_DEVICES=0,1,2,3 FG=1 bash $S scaling
echo "plan done"
