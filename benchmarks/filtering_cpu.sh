#!/usr/bin/env bash
# Online difficulty filtering on vs off on the CPU demo (configs/vf-rl/reverse-text-cpu.toml), at
# equal wall time: a fresh vf-vllm per run (base weights), vf-train stopped after $WALL seconds.
#   benchmarks/filtering_cpu.sh [WALL_SECONDS=270] [OUT=/tmp/vf-filtering]
# Prints per run: steps, rollouts generated, reward per step (batch reward without filtering; the
# unbiased filter/generated_reward with it).
set -uo pipefail
cd "$(dirname "$0")/.."
WALL=${1:-270}; OUT=${2:-/tmp/vf-filtering}; PY=${PYTHON:-python}; PORT=${PORT:-8765}
mkdir -p "$OUT"
for mode in off on; do
  cfg="$OUT/$mode.toml"; rm -rf "$OUT/$mode"
  flag=false; [ "$mode" = on ] && flag=true
  sed -e "s|^run_name = .*|run_name = \"filter-$mode\"\noutput_dir = \"$OUT/$mode\"\nvllm_server_port = $PORT\nuse_difficulty_filtering = $flag|" \
      -e "s|^save_steps = .*|save_steps = 1000|" configs/vf-rl/reverse-text-cpu.toml > "$cfg"
  setsid $PY -m vf_rl.inference.server @ "$cfg" > "$OUT/$mode-server.log" 2>&1 &
  server=$!
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 2; kill -0 $server || exit 1; done
  timeout "$WALL" $PY -m vf_rl.trainer.cli @ "$cfg" > "$OUT/$mode-train.log" 2>&1
  kill -- -$server; wait $server
done
$PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path
for mode in ("off", "on"):
    steps = [json.loads(l) for l in (Path(sys.argv[1]) / mode / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "tokens/loss" in s]
    key = "filter/generated_reward" if mode == "on" else "reward"
    rewards = [round(s[key], 3) for s in steps]
    rollouts = sum(32 + s.get("filter/extra_rollouts", 0) for s in steps)
    filtered = [round(s.get("filter/filtered_fraction", 0), 2) for s in steps]
    print(f"filtering {mode}: {len(steps)} steps, {rollouts:.0f} rollouts generated, reward per step {rewards}, "
          f"last-3 mean {sum(rewards[-3:]) / max(len(rewards[-3:]), 1):.3f}, filtered fraction {filtered}")
PY
