#!/bin/bash
# A 4-GPU host, ~28 minutes: vf-rl over several GPUs (benchmarks/RESULTS.md, Scaling over GPUs and Weight sync).
#   GPUs 0-2: nccl into vLLM as 2 tensor-parallel shards and as 2 data-parallel engines (the trainer on GPU 2),
#             then ZeRO-3 full weights of the Llama-3.1-8B shape on GPUs 1-2 with vf-vllm on GPU 0, 5 steps
#   then GPUs 0-3: the whole loop's throughput per layout (1+1, 2+2, 3+1 GPUs: session.sh scaling)
#   last, GPUs 0-2: ZeRO-3 again without liger-kernel (the sampler-trainer gap with and without it)
S=scripts/gpu/session.sh
export CUDA_VISIBLE_DEVICES=0,1,2
FG=1 bash $S multi
FG=1 TRAIN_GPUS=2 LIMIT=600 STEPS=5 bash $S zero3
CUDA_VISIBLE_DEVICES=0,1,2,3 STEPS=12 FG=1 bash $S scaling
FG=1 TRAIN_GPUS=2 LIMIT=400 STEPS=3 TAG=noliger TRAINER_ARGS="use_liger = false" bash $S zero3
echo "plan done"
