#!/bin/bash
# One H100 (nvidia-h100-x1), ~24 minutes: the H100 figures issues 29 and 26 still lack.
#   1. issue 29's 8B-shaped LoRA run at 8k sampled tokens on the shared GPU, nvidia-smi sampled every 2 s, with the
#      weight push that packs one merged weight at a time (it ran out of memory at its first push in (ae))
#   2. issue 26's request-path probe on an H100 with 1, 2 and 4 vLLM API-server processes (session.sh apiserver)
#   3. reverse-text, vf-rl alone on the shared H100 for 8 minutes (wait share, launch to step 1 with today's code)
S=scripts/gpu/session.sh
FG=1 LIMIT=600 bash $S big
bash $S apiserver
ENV=reverse-text SIDES=vf-rl MINUTES=8 TAG=-h100-vf EXTRA="--shared --vf-arg torch_compile=false" FG=1 bash $S learning
echo "plan done"
