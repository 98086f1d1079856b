#!/bin/bash
# A 4-GPU host (the x4 kinds), ~14 minutes: started by `PLAN=scripts/gpu/plans/x4-next.sh session.sh plan`
# after the bundle transfers, collected with `session.sh poll`.
#   GPUs 0-1: issue 26, the alphabet-sort pair (vf-rl against trl-liger, 8 minutes each) with vLLM's
#             api_server_count = 4 (the second turn is one chat completion per rollout: API-server bound)
#   GPU 2   : issue 28, a verifiers v1 environment for 3 steps through vf-vllm's token route on vLLM 0.26; then
#             issue 26, the request-path probe with 1, 2 and 4 API servers
#   GPU 3   : issue 29, the 8B-shaped LoRA run at 8k sampled tokens on one shared GPU (vLLM's share derived)
S=scripts/gpu/session.sh
(FG=1 GPU0=0 ENV=alphabet-sort TAG=-api4 \
  EXTRA="--shared --vf-arg torch_compile=false --vllm-arg api_server_count=4" bash $S pair) &
(export CUDA_VISIBLE_DEVICES=2; FG=1 bash $S v1; FG=1 bash $S apiserver) &
(CUDA_VISIBLE_DEVICES=3 FG=1 bash $S big) &
wait
echo "plan done"
