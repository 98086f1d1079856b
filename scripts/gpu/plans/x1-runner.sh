#!/bin/bash
# One GPU (GPU0, default 0; an H100 for issue 26's figures), ~8 minutes: vLLM 0.26's model runners against each other
# for vf-rl's first step and its generation. (z)/(ae) read ~18 s of Triton JIT for the V2 model runner's kernels in
# vf-vllm's cold start, on the path to the first step. Per runner (VLLM_USE_V2_MODEL_RUNNER=1, the default there, then
# 0), a cold start (empty vLLM, inductor and Triton caches of its own) and a warm one (the caches it filled):
# benchmarks/generation.py --serve reports the launch to /health (server_start_s) and the request-path probe
# (reverse-text, 16 x 8 rollouts, 128 tokens, 4 API-server processes, 0.3 of the GPU, 5 rounds).
for runner in 1 0; do
  for start in cold warm; do
    c=/tmp/runner-caches-$runner; [ $start = cold ] && rm -rf $c
    CUDA_VISIBLE_DEVICES=${GPU0:-0} VLLM_USE_V2_MODEL_RUNNER=$runner VLLM_CACHE_ROOT=$c/vllm TRITON_CACHE_DIR=$c/triton \
      TORCHINDUCTOR_CACHE_DIR=$c/inductor timeout 400 python3 benchmarks/generation.py --serve --model /tmp/smol \
      --paths group-process --modes idle --rounds 5 --vllm-args "--gpu-memory-utilization 0.3 --api-server-count 4" \
      --json $OUT/runner-v$((runner + 1))-$start.json > $OUT/runner-v$((runner + 1))-$start.log 2>&1
    tail -n 3 $OUT/runner-v$((runner + 1))-$start.log
  done
done
echo "plan done"
