#!/bin/bash
# A 4-GPU host, ~25 minutes: issue 31 item 1's three sides on one host, each on its own pair of GPUs (vLLM on the
# first, the trainer on the second), reverse-text, 16 x 8 rollouts of 128 tokens, 8 minutes each after step 1;
# then issue 26's alphabet-sort pair again with the TRL side's turn client fixed (RESULTS (ad)).
#   GPUs 0-1: trl-async (its server serving runtime LoRA adapters: adapter-only syncs), then trl-liger (server mode)
#   GPUs 2-3: vf-rl, then the alphabet-sort pair (vf-rl and trl-liger at once, one shared GPU each)
# The reverse-text table: learning.py --from-json of the three sides' JSONs (the last step of this plan).
S=scripts/gpu/session.sh
(export CUDA_VISIBLE_DEVICES=0,1
 TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-async MINUTES=8 TAG=-2gpu-trl-async FG=1 bash $S learning
 TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-liger MINUTES=8 TAG=-2gpu-trl-liger FG=1 bash $S learning) &
(CUDA_VISIBLE_DEVICES=2,3 TRL_VLLM=server EXTRA="--eval-every 200" SIDES=vf-rl MINUTES=8 TAG=-2gpu-vf-rl FG=1 \
   bash $S learning
 FG=1 GPU0=2 ENV=alphabet-sort TAG=-pair EXTRA="--shared --vf-arg torch_compile=false" bash $S pair) &
wait
r=/tmp/e2e/learning-reverse-text-2gpu
python3 benchmarks/learning.py --from-json $r-vf-rl.json --from-json $r-trl-async.json --from-json $r-trl-liger.json \
  --json $r-3sides.json --plot $r-3sides.png > $r-3sides.log 2>&1
echo "plan done"
