#!/bin/bash
# Two GPUs of one host, the whole session's device time (~23 minutes after the transfers: .c1-.c6, .u1, .u2, .gpu):
# GPU 0 plans/x1-long384k-short.sh (issue 29's 384k step, one long sequence and a short one), GPU 1
# plans/x1-lora-repeat.sh (the small step and Llama-1.2B LoRA after the step-start fixes, Unsloth). The lanes share
# the host's cores: lane 1's host-bound steps may read a few percent slower while lane 0 copies layer inputs to the
# host; each side of a comparison runs under the same lane. On one GPU: run x1-long384k-short.sh with LIMIT=900,
# then x1-lora-repeat.sh, one after the other.
mkdir -p /tmp/e2e
(CUDA_VISIBLE_DEVICES=0 bash scripts/gpu/plans/x1-long384k-short.sh > /tmp/e2e/lane0.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 bash scripts/gpu/plans/x1-lora-repeat.sh > /tmp/e2e/lane1.log 2>&1) &
wait
echo "plan done"
