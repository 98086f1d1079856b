#!/usr/bin/env bash
# The package as a user installs it (CI runs this after the test suite; scripts/test.sh calls it):
# build the wheel, install it with the README's install command into a new virtual environment
# (not editable, not the checkout's .venv), pip-install a verifiers v1 environment package next to
# it, and from that environment run what a user runs first: the dry run, the evaluation command and
# a 2-step CPU training of that environment through `vf-rl @ config.toml --wait`.
#   scripts/test_wheel.sh [WORKDIR]      (default: a new temporary directory, removed afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-$(mktemp -d)}
mkdir -p "$WORK"
[ -n "${1:-}" ] || trap 'rm -rf "$WORK"' EXIT
PYTHON=${PYTHON:-python3}
TORCH_INDEX=${VF_RL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
say() { echo "test_wheel: $*"; }

say "building the wheel"
[ -e build ] && had_build=1 || had_build=0
.venv/bin/python -m build -q --wheel --outdir "$WORK/dist" . > "$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; exit 1; }
[ "$had_build" = 1 ] || rm -rf build  # setuptools' intermediate files, not the checkout's
wheel=$(ls "$WORK"/dist/vf_rl-*.whl)

say "installing $(basename "$wheel")[cpu,verifiers] into a new venv"
"$PYTHON" -m venv "$WORK/venv"
V=$WORK/venv/bin
# the README's command, `pip install "vf-rl[cpu,verifiers]" --extra-index-url <PyTorch's CPU index>`,
# with the built wheel for the name; PyTorch's index only where it answers (a machine whose package
# registry mirrors the CPU build of torch has no need of it)
index=()
if curl -sfI --max-time 10 "$TORCH_INDEX/" > /dev/null 2>&1; then index=(--extra-index-url "$TORCH_INDEX"); fi
"$V/pip" install -q "$wheel[cpu,verifiers]" "${index[@]}" 2>&1 | { grep -v "^WARNING: Location" || true; }
"$V/python" -c "import verifiers; assert verifiers.__version__.startswith('0.4'), verifiers.__version__; print('test_wheel: verifiers', verifiers.__version__)"

say "installing a verifiers v1 environment package with pip"
pkg=$WORK/vfx-reverse-text-v1
mkdir -p "$pkg"
cp tests/data/vfx_reverse_text_v1_pkg/pyproject.toml "$pkg/"
cp tests/verifiers_envs/vfx_reverse_text_v1.py "$pkg/"
"$V/pip" install -q "$pkg" 2>&1 | { grep -v "^WARNING: Location" || true; }

# no console script of ours shadows one of verifiers'
theirs=$("$V/python" -c "from importlib.metadata import distribution as d; print(' '.join(e.name for e in d('verifiers').entry_points if e.group == 'console_scripts'))")
ours=$("$V/python" -c "from importlib.metadata import distribution as d; print(' '.join(e.name for e in d('vf-rl').entry_points if e.group == 'console_scripts'))")
for name in $ours; do
  case " $theirs " in *" $name "*) say "error: vf-rl and verifiers both install the console script $name"; exit 1;; esac
done
say "console scripts: vf-rl's ($ours) and verifiers' ($theirs) share no name"

cd "$WORK"  # nothing of the checkout on the path from here on
"$V/vf-rl" prepare-model
model=$("$V/python" -c "from vf_rl.launcher.prepare_model import default_model_dir; print(default_model_dir())")
port=$("$V/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
cat > config.toml <<TOML
model = "$model"

[env]
id = "someone/vfx-reverse-text-v1"

[env.args.taskset]
few_shot = 2

[inference]
gpus = 0

[inference.args]
enforce_eager = true
max_model_len = 512

[trainer]
gpus = 0

[trainer.args]
output_dir = "$WORK/run"
vllm_server_port = $port
batch_size = 8
rollouts_per_example = 4
micro_batch_size = 8
max_steps = 2
max_tokens = 16
max_seq_len = 256
save_steps = 50
TOML

say "vf-rl @ config.toml --dry-run"
"$V/vf-rl" @ config.toml --dry-run > dry-run.txt || { cat dry-run.txt; exit 1; }

say "vf-rl eval (its own server)"
"$V/vf-rl" eval someone/vfx-reverse-text-v1 -m "$model" -n 2 -r 2 -t 16 -a '{"taskset": {"few_shot": 2}}' --serve \
  -o eval.jsonl > eval.txt 2>&1 || { tail -30 eval.txt; exit 1; }
grep -q "lcs_reward" eval.txt || { say "error: the evaluation printed no lcs_reward"; tail -30 eval.txt; exit 1; }

say "vf-rl @ config.toml --wait (2 CPU steps)"
"$V/vf-rl" @ config.toml -s "vf-rl-wheel-$port" --wait > train.txt 2>&1 || {
  tail -30 train.txt; tail -40 "$WORK/run/logs/trainer.log" 2>/dev/null; tail -20 "$WORK/run/logs/inference.log" 2>/dev/null; exit 1; }
"$V/python" - "$WORK/run/metrics.jsonl" <<'PY'
import json
import sys

steps = [r for r in map(json.loads, open(sys.argv[1])) if "reward/lcs_reward" in r]
assert [r["step"] for r in steps] == [1, 2], steps
print(f"test_wheel: 2 steps trained, the environment's own reward logged: {[round(r['reward/lcs_reward'], 3) for r in steps]}")
PY
say "ok"
