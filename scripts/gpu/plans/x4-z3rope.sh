#!/bin/bash
# A 4-GPU host, ~5 minutes: ZeRO-3 full weights of the Llama-3.1-8B shape on GPUs 1-2 with vf-vllm on GPU 0,
# 2 steps, with RoPE's inverse frequencies recomputed in float32 (model.float32_rotary_buffers): is the
# 0.85-nat step-1 sampler gap of (ab)/(ac) gone?
S=scripts/gpu/session.sh
bash $S model
CUDA_VISIBLE_DEVICES=0,1,2 FG=1 TRAIN_GPUS=2 LIMIT=300 STEPS=2 TAG=rope bash $S zero3
echo "plan done"
