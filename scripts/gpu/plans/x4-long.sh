#!/bin/bash
# A 4-GPU host, ~10 minutes (issue 29, 7-8B LoRA beyond 32k tokens per sequence): trainer_step.py at 64k and 128k tokens,
# a group of two sequences per step, vf-rl and TRL (liger) on Llama-3.1-8B and Qwen2.5-7B shapes, a GPU per model and side
S=scripts/gpu/session.sh
export LENGTHS="65536 131072" B=2 STEPS=1 LIMIT=400 FG=1
(CUDA_VISIBLE_DEVICES=0 MODELS=llama-3.1-8b SIDES=vf-rl bash $S long) &
(CUDA_VISIBLE_DEVICES=1 MODELS=llama-3.1-8b SIDES=trl-liger bash $S long) &
(CUDA_VISIBLE_DEVICES=2 MODELS=qwen2.5-7b SIDES=vf-rl bash $S long) &
(CUDA_VISIBLE_DEVICES=3 MODELS=qwen2.5-7b SIDES=trl-liger bash $S long) &
wait
echo "plan done"
