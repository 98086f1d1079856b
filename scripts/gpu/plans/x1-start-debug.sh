#!/bin/bash
# One GPU, ~4 minutes: vf-vllm's start with vLLM's engine process spawned (vLLM's CLI default: it imports vLLM
# afresh, 14-16 s in RESULTS aj) against forked from vf-vllm's process (VLLM_WORKER_MULTIPROC_METHOD=fork, which
# vf-vllm's NVML-based GPU check leaves possible), each a cold start with caches of its own: launch to /health, and
# vLLM's DEBUG log (the engine's handshake lines carry the time its process is up). The machine's VLLM_* and
# PYTHON* variables first. MODEL (default /tmp/smol) and GPU_ARGS (default: 0.3 of the GPU) let it run on the CPU.
mkdir -p /tmp/e2e
env | grep -E "^(VLLM_|PYTHON|CUDA_)" | sort > /tmp/e2e/start-debug.env
start_once() {  # start_once NAME [VAR=VALUE ...]: one vf-vllm start, its log in /tmp/e2e/start-debug-NAME.log
  local name=$1; shift
  local c=/tmp/start-debug-caches-$name; rm -rf $c
  env "$@" CUDA_VISIBLE_DEVICES=${GPU0:-0} VLLM_LOGGING_LEVEL=DEBUG VLLM_CACHE_ROOT=$c/vllm TRITON_CACHE_DIR=$c/triton \
    TORCHINDUCTOR_CACHE_DIR=$c/inductor setsid python3 -m vf_rl.inference.server --model ${MODEL:-/tmp/smol} \
    --port 18123 --api-server-count 4 ${GPU_ARGS---gpu-memory-utilization 0.3} > /tmp/e2e/start-debug-$name.log 2>&1 &
  local server=$!
  python3 - <<'PY' > /tmp/e2e/start-debug-$name.health 2>&1
import time, urllib.request
t = time.time()
while time.time() - t < 300:
    try:
        urllib.request.urlopen("http://127.0.0.1:18123/health", timeout=2)
        print(f"/health answered {time.time() - t:.1f} s after the launch", flush=True)
        break
    except Exception:
        time.sleep(0.5)
else:
    print("no answer in 300 s", flush=True)
PY
  kill -INT -- -$server 2>/dev/null; sleep 10; kill -KILL -- -$server 2>/dev/null; sleep 2
  echo "== $name ($*): $(cat /tmp/e2e/start-debug-$name.health)"
  grep -n "We must use\|Waiting for init message\|Started 4 API\|Initializing a V1\|init engine\|Error" \
    /tmp/e2e/start-debug-$name.log | cut -c1-160 | head -8
}
start_once spawn
start_once fork VLLM_WORKER_MULTIPROC_METHOD=fork
echo "plan done"
