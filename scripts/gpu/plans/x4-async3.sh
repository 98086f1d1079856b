#!/bin/bash
# A 4-GPU host, ~13 minutes: issue 31 item 1's pair against TRL's asynchronous GRPO trainer, both sides at once on
# one host, each on its own pair of GPUs (vLLM on the first, the trainer on the second), reverse-text, 16 x 8 rollouts
# of 128 tokens, 8 minutes each after step 1. TRL's server mode was met in RESULTS (o); this is the async side.
#   GPUs 0-1: trl-async (trl vllm-serve serving runtime LoRA adapters: adapter-only syncs)
#   GPUs 2-3: vf-rl, then issue 26's alphabet-sort pair (vf-rl and trl-liger at once, one shared GPU each)
# The reverse-text table: learning.py --from-json of both sides' JSONs.
S=scripts/gpu/session.sh
(CUDA_VISIBLE_DEVICES=0,1 TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-async MINUTES=8 TAG=-2gpu-trl-async \
   FG=1 bash $S learning) &
(CUDA_VISIBLE_DEVICES=2,3 TRL_VLLM=server EXTRA="--eval-every 200" SIDES=vf-rl MINUTES=8 TAG=-2gpu-vf-rl FG=1 \
   bash $S learning
 r=/tmp/e2e/learning-reverse-text-2gpu
 while [ ! -s $r-trl-async.json ] && pgrep -f "sides trl-async" > /dev/null; do sleep 5; done
 python3 benchmarks/learning.py --from-json $r-vf-rl.json --from-json $r-trl-async.json \
   --json $r-async-pair.json --plot $r-async-pair.png > $r-async-pair.log 2>&1
 FG=1 GPU0=2 ENV=alphabet-sort TAG=-pair EXTRA="--shared --vf-arg torch_compile=false" bash $S pair) &
wait
echo "plan done"
