#!/bin/bash
# Two H200s of one host, the whole session's device time (~23 minutes after the transfers): both waiting plans at
# once, one per GPU. GPU 0: plans/x2-long384k.sh (issue 29's 384k step under a 79 GiB cap; the host's 256 GiB for
# its ~111 GiB of pinned layer inputs and master weights). GPU 1: plans/x1-defaults.sh in its order of need (the
# defaults end to end on a shared GPU, the small step, Llama-1.2B LoRA and full against TRL), cut where the time
# ends. The lanes share the host's 32 cores and memory bandwidth: lane 1's host-bound steps may read a few percent
# slower while lane 0 copies layer inputs to and from the host; each side of a comparison runs under the same lane.
mkdir -p /tmp/e2e
(CUDA_VISIBLE_DEVICES=0 bash scripts/gpu/plans/x2-long384k.sh > /tmp/e2e/lane0.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 bash scripts/gpu/plans/x1-defaults.sh > /tmp/e2e/lane1.log 2>&1) &
wait
echo "plan done"
