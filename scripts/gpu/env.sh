# Source on a lent GPU machine (no network) from the repo root, after the transfers put the
# vLLM 0.26 bundle parts (site.tar.xz.aa, .ab, ..., built by shared/tools/gpu-vllm/build_bundle.sh), the
# SmolLM2 parts (smol.st.xz.aa, ..., its smol/ folder and smol.sha256) in /tmp/chunks/.cN/ folders (any
# split, each transfer under 64 MiB with the checkout) and our extra wheels/debs in /tmp/chunks/.gpu/.
# Unpacks once: vLLM + deps -> /tmp/site, our wheels (datasets, libtmux, trl...) -> /tmp/site2,
# tmux (Debian .debs) -> /tmp/tmuxroot, SmolLM2-135M-Instruct (bf16) -> /tmp/smol.
set -u
C=/tmp/chunks
parts() {  # parts() NAME: the split parts NAME.aa NAME.ab ... found in any $C/.cN folder, in name order
  find $C -name "$1.??" | awk -F/ '{print $NF"\t"$0}' | sort | cut -f2
}
if [ ! -f /tmp/site/.done ] && [ -n "$(parts site.tar.xz)" ]; then
  mkdir -p /tmp/site && cat $(parts site.tar.xz) | xz -dc -T0 | tar x -C /tmp/site && touch /tmp/site/.done
fi
if [ ! -f /tmp/site2/.done ] && ls $C/.gpu/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 $C/.gpu/whl/*.whl && touch /tmp/site2/.done
fi
if [ ! -x /tmp/tmuxroot/usr/bin/tmux ] && ls $C/.gpu/debs/*.deb >/dev/null 2>&1; then
  for f in $C/.gpu/debs/*.deb; do dpkg -x $f /tmp/tmuxroot; done
fi
smol=$(find $C -maxdepth 2 -type d -name smol | head -1)
if [ ! -f /tmp/smol/model.safetensors ] && [ -n "$smol" ] && [ -n "$(parts smol.st.xz)" ]; then
  mkdir -p /tmp/smol && cp $smol/* /tmp/smol/ && cat $(parts smol.st.xz) | xz -dc > /tmp/smol/model.safetensors \
    && (cd /tmp/smol && sha256sum -c $(dirname $smol)/smol.sha256)
fi
# pip's --no-compile above leaves the bundle without bytecode: with PYTHONDONTWRITEBYTECODE set every process would
# compile each module it imports from source (vLLM's imports took 30 s instead of 12 s on a 2-core machine), and
# without it the first processes pay that, several at once. A user's pip install compiles at install time; so does
# this, once per machine, for both sides of every benchmark.
if [ ! -f /tmp/site/.pyc-done ] && [ -f /tmp/site/.done ]; then
  t0=$(date +%s); python3 -m compileall -q -j 0 /tmp/site /tmp/site2 > /dev/null 2>&1; touch /tmp/site/.pyc-done
  echo "env.sh: byte-compiled /tmp/site and /tmp/site2 in $(( $(date +%s) - t0 )) s" \
    "(PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset} on this machine)"
fi
REPO=$(pwd)
export PYTHONPATH=/tmp/site:/tmp/site2:$REPO/src
export PATH=/tmp/tmuxroot/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT=/tmp/vcache VLLM_USE_FLASHINFER_SAMPLER=0
# why a compiled layer compiles again (a step's train_s of ~20 s after step 1) goes to the trainer's log
export TORCH_LOGS=recompiles
# never use NVLink multicast on the shared hosts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
