#!/usr/bin/env bash
# Set up (as scripts/demo.sh does), then lint (ruff), build the docs site (mkdocs --strict: a broken
# link or a missing page fails) and run the whole test suite on the CPU.
#   scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check src tests benchmarks scripts examples
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -q -d "$(mktemp -d)"
exec .venv/bin/python -m pytest -q "$@"
