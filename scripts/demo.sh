#!/usr/bin/env bash
# The offline CPU demo: set up, then train SmolLM2-135M-Instruct on reverse-text with real
# vLLM (CPU build) in a tmux session, print the run's summary (reward first / last / best,
# steps, time, the last checkpoint) and export the trained policy as a model directory.
#   scripts/demo.sh [path/to/config.toml]      (default configs/vf-rl/reverse-text-cpu.toml)
# On a terminal it attaches to the session (detach: Ctrl-b d; the run goes on); either way it
# waits for the trainer to finish, then stops the inference server.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/vf-rl/reverse-text-cpu.toml}
scripts/setup.sh
# the run's output_dir (a config vf-rl refuses: vf-rl reports it in one line, exit status 2)
out=$(.venv/bin/python -c 'import sys; from vf_rl.config.schema import load_config; print(load_config(sys.argv[1]).output_dir)' \
  "$config" 2>/dev/null) || exec .venv/bin/vf-rl @ "$config" -s vf-rl-demo --wait
rm -f "$out/summary.txt"  # the summary of an earlier run in this directory
status=0
.venv/bin/vf-rl @ "$config" -s vf-rl-demo --wait || status=$?
# the summary the trainer printed at the end of the run (its last lines in the Trainer pane)
if [ -f "$out/summary.txt" ]; then
  cat "$out/summary.txt"
else
  echo "demo: the run wrote no summary (exit status $status; its log: $out/logs/trainer.log)"
fi
if [ "$status" -eq 0 ]; then
  rm -rf "$out/model"  # this demo's export of an earlier run
  .venv/bin/vf-rl export "$out" "$out/model" >/dev/null
  echo "Exported model: $out/model"
  echo "  evaluate it: .venv/bin/vf-rl eval reverse-text -m $out/model --serve -a '{\"source\": \"offline\", \"few_shot\": 2}'"
fi
exit $status
