#!/bin/bash
# Issue 78 on a host of 4 or 8 GPUs (not run yet: the several-GPU kinds were withheld). Random weights of the real
# shapes and vocabularies (make_random_model.py --pad-vocab), reverse-text from its offline rows, every rollout
# sampled to 512 tokens, 16 prompts x 16 rollouts a step. PARTS picks parts (default all that fit the host):
#   scale-4b (~25 min on 4 GPUs): Qwen3-4B LoRA r16, the whole loop's throughput per layout (session.sh scaling:
#     12 steps each; 1+1, 2+2, 3+1 GPUs, and 4+4, 6+2 on 8): rollouts/s, tokens trained/s, per GPU, the wait share
#     (benchmarks/scaling.py's table and JSON; expected: 2+2 >= 1.6x 1+1);
#   scale-1.7b (~20 min): the same with Qwen3-1.7B full weights;
#   zero3 (8 GPUs, ~15 min): full weights of the Llama-3.1-8B shape, ZeRO-3 on 4 trainer GPUs (1-4), nccl into
#     vf-vllm on GPU 0, 10 steps: memory per GPU (nvidia-smi every 2 s), sync time (session.sh zero3);
#   nccl-kills (2 GPUs, ~15 min): plans/x1-checks.sh with SYNC=nccl: vLLM's engine killed mid-generation and
#     mid-broadcast, then the trainer killed mid-broadcast and the run resumed (/tmp/e2e/checks.log).
# Started by `PLAN=scripts/gpu/plans/x8-issue78.sh session.sh plan` after the bundle transfers; `session.sh poll`
# collects. Not scripted: TRL's server mode and async trainer on 1+1 at these sizes.
S=scripts/gpu/session.sh
gpus=$(nvidia-smi -L | wc -l)
layouts="1:1 2:2 3:1"; [ "$gpus" -ge 8 ] && layouts="$layouts 4:4 6:2"
parts=" ${PARTS:-scale-4b scale-1.7b $([ "$gpus" -ge 8 ] && echo zero3) nccl-kills} "
scale() {  # scale CONFIG USE_LORA: the layouts on random weights of CONFIG with its own vocabulary
  local dir=/tmp/rand-$1-vocab
  ls $dir/model*.safetensors* > /dev/null 2>&1 || python3 scripts/gpu/make_random_model.py --config $1 \
    --tokenizer /tmp/smol --pad-vocab --out $dir > /tmp/e2e/make-$1.log 2>&1
  MODEL=$dir USE_LORA=$2 LORA_R=16 BATCH=256 GROUP=16 MICRO=16 MAXTOK=512 MAXLEN=1024 STEPS=12 \
    LAYOUTS="$layouts" FG=1 bash $S scaling
  mkdir -p /tmp/e2e/scale-$1 && cp $OUT/scaling.* $OUT/runs/scale-*.metrics.jsonl /tmp/e2e/scale-$1/ 2>/dev/null
}
mkdir -p /tmp/e2e
[[ $parts == *" scale-4b "* ]] && scale qwen3-4b true
[[ $parts == *" scale-1.7b "* ]] && scale qwen3-1.7b false
[[ $parts == *" zero3 "* ]] && CUDA_VISIBLE_DEVICES=0,1,2,3,4 TRAIN_GPUS=4 STEPS=10 LIMIT=900 FG=1 bash $S zero3
[[ $parts == *" nccl-kills "* ]] && CUDA_VISIBLE_DEVICES=0,1 SYNC=nccl PARTS="engine-gen engine-push trainer-push" \
  bash scripts/gpu/plans/x1-checks.sh
echo "plan done"
