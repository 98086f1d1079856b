#!/bin/bash
# Diagnose the nccl transport against a real vf-vllm: server on GPU 0 (NCCL_DEBUG=INFO), one
# BroadcastSync push of SmolLM2 from cuda:1 with a 45 s limit, Python stacks dumped on a hang.
PORT=8555
CUDA_VISIBLE_DEVICES=0 NCCL_DEBUG=INFO setsid python3 -m vf_rl.inference.server --model /tmp/smol --port $PORT \
  --enforce-eager --max-model-len 1024 --gpu-memory-utilization 0.3 > /tmp/probe-srv.log 2>&1 &
SP=$!
NCCL_DEBUG=INFO timeout 150 python3 - <<PY
import faulthandler, sys, time, torch
faulthandler.dump_traceback_later(100, exit=True)
from transformers import AutoModelForCausalLM
from vf_rl.inference.client import InferenceClient
from vf_rl.trainer.weight_sync import BroadcastSync
c = InferenceClient(port=$PORT); c.wait_until_ready(120, poll=1)
print("info", c.weight_sync_info(), flush=True)
m = AutoModelForCausalLM.from_pretrained("/tmp/smol", dtype=torch.bfloat16).to("cuda:1")
s = BroadcastSync(c, torch.device("cuda:1"), "nccl", timeout_s=45)
for i in range(3):
    t = time.perf_counter(); s.push(m); print("push", i, round(time.perf_counter() - t, 4), "s, buckets", s.buckets_sent, flush=True)
PY
echo "probe rc $?"
grep -i "nccl\|error\|Traceback\|vf_\|Exception" /tmp/probe-srv.log | grep -v "NCCL INFO cudaDriverVersion\|NCCL INFO Bootstrap\|Channel" | tail -25
kill -- -$SP 2>/dev/null; sleep 3; kill -9 -- -$SP 2>/dev/null
