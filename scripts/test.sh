#!/usr/bin/env bash
# Set up (as scripts/demo.sh does), then lint (ruff) and run the whole test suite on the CPU.
#   scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check src tests benchmarks scripts examples
exec .venv/bin/python -m pytest -q "$@"
