#!/bin/bash
# Two H200s of one host for its 256 GiB of host memory (one GPU used): issue 29's longest sequence, Llama-3.1-8B-shaped
# LoRA at 393,216 tokens per sequence (384k) with activation offload and tiled_mlp, the GPU capped at 79 GiB
# (trainer_step.py --gpu-gib: an 80 GB H100's usable memory; the cap applies from the sides' build on). TRL ran out of
# memory at 192k on an H100 in (r) and trains 160k (RESULTS ar): vf-rl at 384k under the cap puts its limit at >= 2x
# TRL's. The estimate (vf_rl.config.memory, as in (r)): 61.7 GiB on the GPU; the offloaded layer inputs take ~96 GiB of pinned
# host memory, the harness's master weights 15 GiB more. One step of 2 sequences (batch must be even), no warm-up step.
# Time: (r)'s steps at 192k and 256k on an H100 (264 s, 403 s) fit a + b L^2 growth to ~760 s at 384k, compile
# included. The harness's sampling log-probs come from -log(vocab) (--uniform-sampling-logprobs: no no-grad forward of
# 2 x 384k tokens, which ran past the plan's 1,150 s with the step in RESULTS at). Needs the whole session's device
# time: transfers and unpacking ~7 minutes, then this ~15-20. Each step's seconds and each side's start go to the log.
# JSON: /tmp/e2e/long-llama-3.1-8b-lora-393216-vf-rl-offload-tiled-cap79.json
S=scripts/gpu/session.sh
B=2 STEPS=1 LENGTHS=393216 SIDES=vf-rl TAG=-offload-tiled-cap79 LIMIT=1320 \
  EXTRA="--offload-activations --tiled-mlp --warmup 0 --gpu-gib 79 --uniform-sampling-logprobs" FG=1 bash $S long
free -g | head -2
echo "plan done"
