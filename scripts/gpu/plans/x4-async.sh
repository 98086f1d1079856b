#!/bin/bash
# A 4-GPU host (nvidia-h100-x4 for H100 figures), ~24 minutes: three lanes at once.
#   GPUs 0-1: issue 31 item 1's last side, TRL's asynchronous GRPO trainer (trl vllm-serve on GPU 0, AsyncGRPOTrainer
#             on GPU 1), then vf-rl on the same two GPUs, reverse-text, 16 x 8 rollouts of 128 tokens, 8 minutes each
#             after step 1 (plans/x2-async.sh on two of the four GPUs)
#   GPUs 2-3: issue 26's alphabet-sort pair (vf-rl and trl-liger at once, one shared GPU each, plans/pairs.sh)
#   then GPU 2: (H100 only) issue 29's 8B-shaped LoRA run at 8k sampled tokens on one shared GPU, nvidia-smi sampled
#             every 2 s (its random model is made at the start, beside the other lanes;
#             the tokenizer, saved after the weights, marks it complete)
S=scripts/gpu/session.sh
(CUDA_VISIBLE_DEVICES=0,1 TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-async,vf-rl MINUTES=8 TAG=-2gpu-async \
  FG=1 bash $S learning) &
h100=0; nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | grep -q H100 && h100=1
[ $h100 = 1 ] && (bash $S model) &
(FG=1 GPU0=2 ENV=alphabet-sort TAG=-pair EXTRA="--shared --vf-arg torch_compile=false" bash $S pair
 wait_model() { for i in $(seq 1 300); do [ -f /tmp/rand-llama-3.1-8b/tokenizer_config.json ] && return; sleep 2; done; }
 [ $h100 = 1 ] && { wait_model; CUDA_VISIBLE_DEVICES=2 FG=1 LIMIT=600 bash $S big; }) &
wait
echo "plan done"
