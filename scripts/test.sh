#!/usr/bin/env bash
# Set up (as scripts/demo.sh does), then run the whole test suite on the CPU.
#   scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
