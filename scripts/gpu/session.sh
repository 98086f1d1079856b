#!/bin/bash
# usage (GPU machine, repo root, after the bundle transfers): scripts/gpu/session.sh PART
# Runs one batch of the GPU checks and benchmarks, every output tee'd to $OUT/PART.*.txt.
#   e2e    : vf-rl end to end with weight_sync = auto (-> nccl), the marked GPU tests
#   sync135: weight_sync.py on SmolLM2-135M
#   bench  : trainer_step.py, vf-rl vs TRL cispo, qwen2-0.5b and llama-1b, full weights and LoRA
#   sync1b : weight_sync.py on a random llama-1b
#   shared : vf-rl with inference and trainer on one GPU (shared = true)
#   graphs : the same, 10 steps, vLLM with CUDA graphs (no enforce_eager)
set -u
source scripts/gpu/env.sh
PART=$1
run() {  # run NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  (timeout "$limit" "$@" 2>&1; echo "RC=$?") > "$OUT/$PART.$name.txt"
  tail -n 14 "$OUT/$PART.$name.txt"
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
case $PART in
e2e)
  run auto 200 bash scripts/gpu/vf_rl_run.sh gpu-auto auto 1 1 false 3
  echo "trainer processes left: $(pgrep -fc vf_rl.cli.train)"; pkill -9 -f vf_rl.cli 2>/dev/null; pkill -9 -f "vllm" 2>/dev/null; sleep 2
  VF_RL_GPU_MODEL=/tmp/smol VF_RL_GPU_REPORT=$OUT/gpu_test.jsonl run gputest 170 python3 -m pytest -m gpu tests/test_gpu.py -s -q -p no:cacheprovider
  ;;
sync135)
  run sync135 170 python3 benchmarks/weight_sync.py --model /tmp/smol --json $OUT/sync.jsonl
  ;;
bench)  # BENCH="qwen2-0.5b:full llama-1b:lora" picks a subset
  for case in ${BENCH:-qwen2-0.5b:full qwen2-0.5b:lora llama-1b:full llama-1b:lora}; do
    m=${case%%:*}; kind=${case##*:}; flag=""; [ $kind = lora ] && flag=--lora
    run $m-$kind 140 python3 benchmarks/trainer_step.py --model-config $m $flag --batch 64 --micro-batch 8 --prompt-len 256 --completion-len 256 --steps 5 --warmup 2 --json $OUT/ts-$m-$kind.json
  done
  ;;
sync1b)
  run sync1b 300 python3 benchmarks/weight_sync.py --random llama-1b --tokenizer /tmp/smol --json $OUT/sync.jsonl
  ;;
shared)
  run shared 250 bash scripts/gpu/vf_rl_run.sh gpu-shared auto 1 1 true 3
  ;;
graphs)
  run shared-graphs 250 bash scripts/gpu/vf_rl_run.sh gpu-shared-graphs auto 1 1 true 10 false
  ;;
esac
