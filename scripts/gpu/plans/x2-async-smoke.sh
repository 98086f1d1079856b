#!/bin/bash
# 2 GPUs, ~6 minutes: a smoke run of the trl-async side alone (2 minutes after its step 1) past the adapter
# version at which TRL 1.16's deleted-adapter race killed its server in RESULTS (ai) (step ~25)
S=scripts/gpu/session.sh
TRL_VLLM=server EXTRA="--eval-every 200" SIDES=trl-async MINUTES=2 TAG=-2gpu-async-smoke FG=1 bash $S learning
echo "plan done"
