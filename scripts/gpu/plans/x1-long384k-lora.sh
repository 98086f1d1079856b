#!/bin/bash
# One GPU, the whole session's device time: plans/x2-long384k-lora.sh's two lanes one after the other (the 384k
# step under a 900 s limit first, then what time is left of the Llama-1.2B LoRA repeat).
mkdir -p /tmp/e2e
LIMIT=900 bash scripts/gpu/plans/x1-long384k-short.sh > /tmp/e2e/lane0.log 2>&1
bash scripts/gpu/plans/x1-lora-repeat.sh > /tmp/e2e/lane1.log 2>&1
echo "plan done"
