#!/usr/bin/env bash
# The offline CPU demo: set up, then train SmolLM2-135M-Instruct on reverse-text with real
# vLLM (CPU build) in a tmux session, and print the reward at the start and at the end.
#   scripts/demo.sh [path/to/config.toml]      (default configs/vf-rl/reverse-text-cpu.toml)
# On a terminal it attaches to the session (detach: Ctrl-b d; the run goes on); either way it
# waits for the trainer to finish, then stops the inference server.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/vf-rl/reverse-text-cpu.toml}
scripts/setup.sh
status=0
.venv/bin/vf-rl @ "$config" -s vf-rl-demo --wait || status=$?
.venv/bin/python scripts/summarize_run.py "$config" || true
exit $status
