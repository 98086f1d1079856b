#!/bin/bash
# A 4-GPU host, ~12 minutes: issue 31's scaling table on a model whose step is GPU-bound: random weights of the
# Llama-1B shape (LoRA, reverse-text, 128 rollouts of 256 tokens per step: every rollout runs to the cap), per
# layout 1+1, 2+2 and 3+1 GPUs (session.sh scaling). On SmolLM2 a step is overhead-bound (benchmarks/RESULTS.md, Scaling over GPUs).
S=scripts/gpu/session.sh
CUDA_VISIBLE_DEVICES=0,1,2,3 MODEL_CONFIG=llama-1b MAXTOK=256 STEPS=10 FG=1 bash $S scaling
echo "plan done"
