#!/bin/bash
# usage (GPU machine, after `source scripts/gpu/env.sh`):
#   scripts/gpu/vf_rl_run.sh NAME WEIGHT_SYNC INFERENCE_GPUS TRAINER_GPUS SHARED(true|false) STEPS [EAGER(true|false)]
# Writes /tmp/runs/NAME.toml (reverse-text, or ENV_ID with ENV_ARGS (lines of its [env.args] table); SmolLM2 in
# MODEL (default /tmp/smol: SmolLM2), LoRA (USE_LORA=false: full weights; LORA_R: its rank, default 16), batch BATCH (default
# 128) = BATCH/GROUP prompts x GROUP (default 8) rollouts, MICRO (default 16) per micro batch, MAXTOK (default 32)
# sampled tokens at most, MAXLEN (default 512) tokens a sequence), runs
# `vf-rl @ NAME.toml --wait` (real tmux) with a limit of LIMIT seconds (default 360), and prints the step lines.
set -u
NAME=$1; SYNC=$2; NI=$3; NT=$4; SHARED=$5; STEPS=$6; EAGER=${7:-true}
mkdir -p /tmp/runs
PORT=$((8100 + RANDOM % 800))
cat > /tmp/runs/$NAME.toml <<TOML
model = "${MODEL:-/tmp/smol}"
[env]
id = "${ENV_ID:-reverse-text}"
[env.args]
${ENV_ARGS:-few_shot = 2
source = \"offline\"}
[inference]
gpus = $NI
shared = $SHARED
[inference.args]
enforce_eager = $EAGER
max_model_len = 1024
[trainer]
gpus = $NT
[trainer.args]
run_name = "$NAME"
output_dir = "/tmp/runs/$NAME"
weight_sync = "$SYNC"
max_steps = $STEPS
use_lora = ${USE_LORA:-true}
${LORA_R:+lora_rank = $LORA_R}
batch_size = ${BATCH:-128}
rollouts_per_example = ${GROUP:-8}
micro_batch_size = ${MICRO:-16}
max_tokens = ${MAXTOK:-32}
max_seq_len = ${MAXLEN:-512}
learning_rate = 5e-4
save_steps = 1000
vllm_server_port = $PORT
TOML
start=$(date +%s)
timeout ${LIMIT:-360} python3 -m vf_rl.launcher.main @ /tmp/runs/$NAME.toml --wait -s $NAME
code=$?
echo "[$NAME] vf-rl exit $code after $(( $(date +%s) - start )) s"
grep -ah "Weight sync\|Step [0-9]\|Error\|error" /tmp/runs/$NAME/logs/trainer.log | tail -15
[ $code = 0 ] || tail -n 40 /tmp/runs/$NAME/logs/trainer.log /tmp/runs/$NAME/logs/inference.log
tmux kill-session -t $NAME 2>/dev/null
mkdir -p $OUT/runs && cp /tmp/runs/$NAME/metrics.jsonl $OUT/runs/$NAME.metrics.jsonl 2>/dev/null
exit $code
