#!/bin/bash
# One GPU (~8 minutes after the transfers): where the request-path probe's decode step goes on the host (issue 26).
# A decode step of ~128 sequences takes 4-7 ms on the lent hosts with the GPU ~20% busy (benchmarks/RESULTS.md,
# Generation request path). This samples the processes' Python stacks with
# py-spy (carried in .gpu/whl) while the probe runs: vLLM's engine-core process, its API-server processes and the
# orchestrator's process, SPY_S seconds each, all at once, `--threads --idle` (one root frame per thread, waiting stacks
# kept, so a frame's share of a thread's samples is its share of wall time); scripts/gpu/spy_summary.py reads them.
#   1 (~3 min): reverse-text, 16 x 8 rollouts, max_tokens 128, 2 API-server processes, 12 rounds
#   2 (~3 min): alphabet-sort, two turns (the second one chat completion per rollout), the same
set -u
mkdir -p /tmp/e2e "$OUT"
SPY=$(command -v py-spy || echo /tmp/site2/bin/py-spy)
RATE=${RATE:-200} SPY_S=${SPY_S:-6}
descendants() { local c; for c in $(pgrep -P $1); do echo $c; descendants $c; done; }
spy_probe() {  # spy_probe NAME ARGS...: generation.py with --serve and ARGS; py-spy once its warm-up rounds are done
  local name=$1; shift
  python3 benchmarks/generation.py --serve --model ${MODEL:-/tmp/smol} --paths group-process --modes idle --rounds ${ROUNDS:-12} \
    --warmup 2 --vllm-args "${VLLM_ARGS:---gpu-memory-utilization 0.3 --api-server-count 2}" \
    --max-tokens ${MAXTOK:-128} --json /tmp/e2e/probe-$name.json "$@" \
    > /tmp/e2e/probe-$name.log 2>&1 &
  local gen=$!
  for _ in $(seq 1 400); do grep -q "answered /health" /tmp/e2e/probe-$name.log && break; sleep 1; done
  sleep ${SETTLE_S:-12}  # the orchestrator's start and the warm-up rounds
  # every process under generation.py: the server's root, its API servers and engine core (titled VLLM::... when
  # setproctitle is there), the orchestrator's process; the pids file names each by its command line
  for p in $(descendants $gen); do
    echo "$name: pid $p $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-160)" >> $OUT/probe-$name.pids
    timeout $((SPY_S + 30)) $SPY record --pid $p --duration $SPY_S --rate $RATE --threads --idle --format raw \
      --output $OUT/spy-$name-$p.txt > $OUT/spy-$name-$p.log 2>&1 &
  done
  wait  # generation.py reads the GPU's busy share itself (its JSON's gpu_busy)
}
spy_probe reverse-text
AS='{"source": "offline", "min_turns": 2, "max_turns": 2, "min_names_per_turn": 1, "max_names_per_turn": 2, "few_shot": 1}'
spy_probe alphabet-sort --env alphabet-sort --env-args "$AS"
echo "plan done"
