#!/bin/bash
# One GPU (~12 min a case after the transfers, in order of need; cut where device time ends): issue 76 item 1, the
# end-to-end benchmark at user sizes on one shared H200 (vLLM and the trainer on the one GPU, both sides): vf-rl
# (`vf-rl @ config --wait`) against TRL's GRPOTrainer colocated with vLLM, random weights of the real shapes and
# vocabularies, 16 prompts x 16 rollouts, every completion sampled to its length (benchmarks/RESULTS.md, End to end
# at user sizes). CASES: MODEL:ADAPTER:TOKENS:SIDES, one after the other (session.sh usersize each):
#   1 (~12 min): Qwen3-1.7B full weights, 512 tokens: vf-rl, trl-liger, trl-compile-liger
#   2 (~10 min): Qwen3-4B LoRA r16, 512 tokens: vf-rl, trl-liger
#   3, 4: the same at 2,048 tokens (vLLM's KV cache then holds part of the step's rollouts at once)
S=scripts/gpu/session.sh
CASES=${CASES:-"qwen3-1.7b:full:512:vf-rl,trl-liger,trl-compile-liger qwen3-4b:lora:512:vf-rl,trl-liger
  qwen3-1.7b:full:2048:vf-rl,trl-liger qwen3-4b:lora:2048:vf-rl,trl-liger"}
for case in $CASES; do
  IFS=: read -r m kind tok sides <<< "$case"
  echo "=== $(date -u +%H:%M:%S) usersize $m $kind $tok $sides"
  MODEL_CONFIG=$m ADAPTER=$kind MAXTOK=$tok SIDES=$sides FG=1 bash $S usersize
done
echo "=== $(date -u +%H:%M:%S) plan done"
