# Source on a lent GPU machine (no network) from the repo root, after the transfers put the
# vLLM 0.26 bundle parts (.c1 .c2 .c3, built by shared/tools/gpu-vllm/build_bundle.sh) and the
# SmolLM2 parts (.c3 .c4 .c5) in /tmp/chunks/ and our extra wheels/debs in /tmp/chunks/.gpu/.
# Unpacks once: vLLM + deps -> /tmp/site, our wheels (datasets, libtmux, trl...) -> /tmp/site2,
# tmux (Debian .debs) -> /tmp/tmuxroot, SmolLM2-135M-Instruct (bf16) -> /tmp/smol.
set -u
C=/tmp/chunks
if [ ! -f /tmp/site/.done ]; then
  mkdir -p /tmp/site && cat $C/.c1/site.tar.xz.* $C/.c2/site.tar.xz.* $C/.c3/site.tar.xz.* | xz -dc -T0 | tar x -C /tmp/site \
    && touch /tmp/site/.done
fi
if [ ! -f /tmp/site2/.done ] && ls $C/.gpu/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 $C/.gpu/whl/*.whl && touch /tmp/site2/.done
fi
if [ ! -x /tmp/tmuxroot/usr/bin/tmux ] && ls $C/.gpu/debs/*.deb >/dev/null 2>&1; then
  for f in $C/.gpu/debs/*.deb; do dpkg -x $f /tmp/tmuxroot; done
fi
if [ ! -f /tmp/smol/model.safetensors ] && [ -f $C/.c5/smol.st.xz.bab ]; then
  mkdir -p /tmp/smol && cp $C/.c3/smol/* /tmp/smol/ \
    && cat $C/.c3/smol.st.xz.aa $C/.c4/smol.st.xz.b* $C/.c5/smol.st.xz.b* | xz -dc > /tmp/smol/model.safetensors \
    && (cd /tmp/smol && sha256sum -c $C/.c3/smol.sha256)
fi
REPO=$(pwd)
export PYTHONPATH=/tmp/site:/tmp/site2:$REPO/src
export PATH=/tmp/tmuxroot/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT=/tmp/vcache VLLM_USE_FLASHINFER_SAMPLER=0
# never use NVLink multicast on the shared hosts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
