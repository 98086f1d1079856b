#!/usr/bin/env bash
# Set up (as scripts/demo.sh does), then lint (ruff), build the docs site (mkdocs --strict: a broken
# link or a missing page fails) and run the test suite on the CPU, two test modules at a time: the
# default tier with verifiers 0.4, the tests of verifiers' classic API with its 0.3.1 overlay, then
# the package as a user installs it (scripts/test_wheel.sh). With pytest arguments, one pytest run
# with them instead.
#   scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check src tests benchmarks scripts examples
# every warning counts (-q would hide what --strict counts)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d "$(mktemp -d)"
# two workers (pytest-xdist), one test module per worker at a time: a test mostly waits on one process
# (a server starting, a trainer step) and so used one of the two cores; VF_RL_TEST_WORKERS=0 runs serially
# (two workers peaked at 20 GiB used; below 22 GiB of memory the default is serial)
mem_gib=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
workers=${VF_RL_TEST_WORKERS:-$([ "$mem_gib" -ge 22 ] && echo 2 || echo 0)}
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -n "$workers" --dist loadfile "$@"
fi
.venv/bin/python -m pytest -q -n "$workers" --dist loadfile -m "not slow and not classic"
PYTHONPATH="$PWD/.venv/verifiers-classic" .venv/bin/python -m pytest -q -n "$workers" --dist loadfile -m "classic and not slow"
scripts/test_wheel.sh
