#!/bin/bash
# Seconds from `vf-rl @ cfg --wait` to the run's first metrics.jsonl record (step 1), with
# [trainer.args] preflight = "off" and "warn", ROUNDS times alternating, on the CPU demo config
# (or $1); each run is the config with max_steps = 2, its own output_dir and tmux session under $OUT.
#   bash benchmarks/preflight_start.sh [config.toml]      (OUT=/tmp/preflight-start ROUNDS=2)
set -u
cd "$(dirname "$0")/.."
config=${1:-configs/vf-rl/reverse-text-cpu.toml}
OUT=${OUT:-/tmp/preflight-start}
mkdir -p "$OUT"
for round in $(seq 1 "${ROUNDS:-2}"); do for mode in off warn; do
  name=pf-$mode-$round; out=$OUT/$name; rm -rf "$out"
  sed -e "s#^max_steps = .*#max_steps = 2#" \
      -e "s#^\[trainer.args\]#[trainer.args]\noutput_dir = \"$out\"\npreflight = \"$mode\"#" "$config" > "$OUT/$name.toml"
  t0=$(date +%s.%N)
  .venv/bin/vf-rl @ "$OUT/$name.toml" -s "$name" --wait > "$OUT/$name.log" 2>&1 &
  pid=$!
  while [ ! -s "$out/metrics.jsonl" ]; do sleep 0.5; kill -0 $pid 2>/dev/null || break; done
  t1=$(date +%s.%N)
  wait $pid; rc=$?
  echo "preflight = $mode, round $round: first step record after $(echo "$t1 - $t0" | bc) s (exit $rc)" | tee -a "$OUT/result.txt"
done; done
