#!/bin/bash
# Rebuild (here, no GPU needed, ~10 min) the git-ignored transfer folders a GPU session needs.
# usage: scripts/gpu/build_bundle.sh [REPO_ROOT]        (default: the repo this script lives in)
# env:   PY312 (a CPython 3.12, default ~/.pyenv/versions/3.12.1), MODEL (SmolLM2-135M-Instruct dir),
#        WORK (the vLLM builder's work dir, default /tmp/vgw), TOOLS (that builder's folder)
# Layout in REPO_ROOT (each folder <= 51 MiB, parts split with `split -b 50m`: a carry takes 64 MiB with the
# checkout's tracked files, ~8 MiB):
#   .c1  site.tar.xz.aa        .c2  site.tar.xz.ab        (vLLM 0.26 bundle, shared/tools/gpu-vllm)
#   .c3  smol.st.xz.aa         .c4  smol.st.xz.ab         (SmolLM2 model.safetensors, xz)
#   .c5  site.tar.xz.ac        .c6  smol.st.xz.ac + smol/ + smol.sha256   (one folder when both fit in 50 MiB)
#   .gpu whl/*.whl (+README.txt), debs/*.deb (tmux)
# One `run` call per transfer, carry: [.c1], ..., [.c6], [.gpu] (the end of this script prints the sum of
# the last folder and .gpu, and says whether they can travel together). Each run moves its folder to
# /tmp/chunks/ at once (`mkdir -p /tmp/chunks; mv .cN /tmp/chunks/`), then `source scripts/gpu/env.sh`
# unpacks everything.
set -euo pipefail
REPO=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
MODEL=${MODEL:-$HOME/.cache/vf-rl/models/SmolLM2-135M-Instruct}
export PY312=${PY312:-$HOME/.pyenv/versions/3.12.1/bin/python3.12} WORK=${WORK:-/tmp/vgw}
TOOLS=${TOOLS:-/work/shared/tools/gpu-vllm}                # the vLLM bundle builder
MiB=1048576
for d in .c1/ .gpu/; do git -C "$REPO" check-ignore -q $d || { echo "$d is not git-ignored" >&2; exit 1; }; done

# 1. vLLM bundle + model parts (its 62 MiB split is too big for us: re-split below)
rm -rf "$REPO"/.c[0-9] "$REPO/.gpu" "$WORK"/site.tar.xz* "$WORK"/smol.st.xz*
"$TOOLS/build_bundle.sh" "$REPO" "$MODEL"
rm -rf "$REPO"/.c[0-9]
cd "$WORK"
split -b 50m -a 2 site.tar.xz site.tar.xz.
split -b 50m -a 2 smol.st.xz smol.st.xz.
n=0; put() { n=$((n+1)); mkdir -p "$REPO/.c$n"; mv "$@" "$REPO/.c$n/"; }
s=(site.tar.xz.??) m=(smol.st.xz.??)
for p in "${s[@]:0:${#s[@]}-1}" "${m[@]:0:${#m[@]}-1}"; do put "$p"; done
if (( $(stat -c %s "${s[-1]}") + $(stat -c %s "${m[-1]}") > 50*MiB )); then
  put "${s[-1]}"; put "${m[-1]}"                           # too big to share a folder
else put "${s[-1]}" "${m[-1]}"; fi                         # the last parts share the final folder
mkdir -p "$REPO/.c$n/smol"
cp "$MODEL"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} "$REPO/.c$n/smol/"
(cd "$MODEL" && sha256sum model.safetensors) > "$REPO/.c$n/smol.sha256"

# 2. extra wheels for what the GPU image lacks (it has torch, transformers, numpy, pandas, pyarrow,
#    sympy, aiohttp, ...; dill and pydantic come with the vLLM bundle); unpinned ones as in .venv
# a package's version in the set-up's venv, else in its classic-API overlay (.venv/verifiers-classic: aiolimiter)
ver() { "$REPO/.venv/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null \
  || PYTHONPATH="$REPO/.venv/verifiers-classic" "$REPO/.venv/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pkgs="trl==1.16.0 datasets==5.0.1 multiprocess==0.70.19 liger_kernel==0.8.5 py-spy==0.4.3"  # py-spy: the request-path probe's profiles
for p in libtmux tomli_w math-verify latex2sympy2_extended antlr4-python3-runtime faker english-words bm25s; do
  pkgs+=" $p==$(ver $p)"
done
# verifiers v1 environments (session.sh v1): verifiers and renderers, and what their import needs beyond the
# image and the vLLM bundle (found with packages_distributions() after loading a v1 environment here)
for p in verifiers renderers prime-pydantic-config prime-sandboxes connectrpc pyqwest protobuf-py protobuf-py-ext \
    tenacity aiofiles rich pygments markdown-it-py mdurl tiktoken aiolimiter msgpack; do
  pkgs+=" $p==$(ver $p)"
done
# DeepSpeed ZeRO-3 (session.sh zero3): deepspeed (a source package, built here into a pure-Python wheel: its ops
# are built on first use, and ZeRO-3 with transformers' torch optimizer uses none) and its imports beyond the image
for p in hjson ninja py-cpuinfo einops; do
  pkgs+=" $p==$(ver $p)"
done
mkdir -p "$REPO/.gpu/whl" "$REPO/.gpu/debs"
"$REPO/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$REPO/.gpu/whl" $pkgs
"$REPO/.venv/bin/python" -m pip wheel -q --no-deps -w "$REPO/.gpu/whl" "deepspeed==$(ver deepspeed)"
{ echo "Extra wheels for the GPU image (Python 3.12), installed by scripts/gpu/env.sh with"
  echo "pip install --no-index --no-deps --target /tmp/site2. Built by scripts/gpu/build_bundle.sh from:"
  echo "$pkgs deepspeed==$(ver deepspeed)" | tr ' ' '\n'; echo; echo "Files:"; (cd "$REPO/.gpu/whl" && ls *.whl); } > "$REPO/.gpu/whl/README.txt"

# 3. tmux (Debian bookworm .debs, unpacked with dpkg -x) and the libraries a minimal image may lack
(cd "$REPO/.gpu/debs" && apt-get download -q tmux libevent-core-2.1-7 libutempter0 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
ls "$REPO"/.gpu/debs/tmux_*.deb >/dev/null

# 4. check the parts reassemble, then sizes
cd "$REPO"
cat $(ls .c[0-9]/site.tar.xz.?? | sort -t/ -k2) | xz -t -T0
cat $(ls .c[0-9]/smol.st.xz.?? | sort -t/ -k2) | xz -dc -T0 | sha256sum | cut -d' ' -f1 | grep -qx "$(cut -d' ' -f1 .c$n/smol.sha256)"
echo "parts OK: site.tar.xz (xz -t), smol model (sha256)"
du -sh .c[0-9] .gpu
last=$(du -sb .c$n .gpu | awk '{t+=$1} END {print int(t/1048576)}')
if (( last <= 52 )); then echo "carry .c$n and .gpu together ($last MiB)"; else echo "carry .gpu alone: .c$n + .gpu = $last MiB > 52"; fi
