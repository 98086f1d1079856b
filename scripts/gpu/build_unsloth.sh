#!/bin/bash
# Issue 29's Unsloth peer: the wheels Unsloth needs on the GPU image (Python 3.12, torch 2.11.0+cu130,
# transformers 5.17.0, accelerate, peft already there) beside vf-rl's bundle, downloaded here (no GPU needed,
# ~1 min) into git-ignored transfer folders .u1, .u2 (<= 50 MiB each: parts of one tar, `split -b 50m`).
# Unsloth 2026.10.9 pins trl <= 1.15.0 and datasets < 5 (the image's TRL peer runs trl 1.16.0 and datasets 5.0.1):
# `session.sh unsloth` installs these into a site of their own (/tmp/site-unsloth), first on the PYTHONPATH of the
# Unsloth process only. One `run` call per folder (carry [.u1], then [.u2]: `mkdir -p /tmp/chunks; mv .uN /tmp/chunks/`).
# usage: scripts/gpu/build_unsloth.sh [REPO_ROOT]
set -euo pipefail
REPO=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
WORK=${WORK:-/tmp/unsloth-build}
PY=${PY:-$REPO/.venv/bin/python}
git -C "$REPO" check-ignore -q .u1/ || { echo ".u1/ is not git-ignored" >&2; exit 1; }
rm -rf "$WORK" "$REPO"/.u[0-9]; mkdir -p "$WORK/whl"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any"
# Unsloth's and unsloth_zoo's requirements that the image lacks (or pins otherwise), each without its own deps:
# the set is closed by hand (their METADATA), since a resolver would also fetch torch
for pkg in unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0 datasets==4.3.0 torchao==0.18.0 \
    cut_cross_entropy==25.1.1 xformers==0.0.35 bitsandbytes==0.50.2 torchvision==0.26.0 tyro==1.0.17 \
    docstring-parser shtab typeguard hf_transfer==0.1.9 msgspec diffusers==0.42.1 json5 structlog nest-asyncio \
    sentencepiece; do
  "$PY" -m pip download "$pkg" $PLATFORMS --python-version 3.12 --only-binary=:all: --no-deps -d "$WORK/whl" -q \
    2>&1 | grep -v "^WARNING: Location" || true
done
(cd "$WORK" && tar cf unsloth-whl.tar whl && split -b 50m -a 2 unsloth-whl.tar unsloth-whl.tar.)
n=0
for part in "$WORK"/unsloth-whl.tar.??; do n=$((n+1)); mkdir -p "$REPO/.u$n"; mv "$part" "$REPO/.u$n/"; done
echo "$(ls "$WORK/whl" | wc -l) wheels, $(du -sh "$WORK/whl" | cut -f1), in .u1-.u$n"
