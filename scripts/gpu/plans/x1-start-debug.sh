#!/bin/bash
# One GPU, ~2 minutes: what vLLM 0.26's engine process does in the 14-16 s between vf-vllm's API-server processes
# starting and the engine's first log line (RESULTS aj: it logs with the API servers, as if it had imported vLLM
# afresh, though vLLM forks it by default). vf-vllm with 4 API-server processes and vLLM's DEBUG log (the engine's
# handshake lines carry the time it is up), the machine's VLLM_* and PYTHON* variables, then /health and a stop.
mkdir -p /tmp/e2e
env | grep -E "^(VLLM_|PYTHON|CUDA_)" | sort > /tmp/e2e/start-debug.env
CUDA_VISIBLE_DEVICES=${GPU0:-0} VLLM_LOGGING_LEVEL=DEBUG setsid python3 -m vf_rl.cli.vllm_server --model ${MODEL:-/tmp/smol} \
  --port 18123 --api-server-count 4 ${GPU_ARGS---gpu-memory-utilization 0.3} > /tmp/e2e/start-debug.log 2>&1 &
server=$!
python3 - <<'PY' > /tmp/e2e/start-debug.health 2>&1
import time, urllib.request
t = time.time()
while time.time() - t < 300:
    try:
        urllib.request.urlopen("http://127.0.0.1:18123/health", timeout=2)
        print(f"start-debug: /health answered {time.time() - t:.1f} s after the probe began", flush=True)
        break
    except Exception:
        time.sleep(1)
PY
kill -INT -- -$server 2>/dev/null; sleep 10; kill -KILL -- -$server 2>/dev/null
grep -n "spawn\|Waiting for init message\|Received init message\|Started 4 API\|Initializing a V1\|start-debug" \
  /tmp/e2e/start-debug.log | cut -c1-200 | head -20
cat /tmp/e2e/start-debug.health
echo "plan done"
