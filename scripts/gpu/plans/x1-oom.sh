#!/bin/bash
# One GPU, ~15 min (each run LIMIT s at most, default 540; RUNS picks runs, default all three): a real CUDA out of memory mid-run costs a micro batch, not
# the run (trainer/micro_step.py), in the shared layout (vLLM and the trainer on one GPU, vLLM's share fixed at SHARE,
# default 0.8: the trainer has the rest, ~28 GiB of an H200). Random Llama-1B weights (session.sh model: every rollout
# samples about max_tokens tokens, SmolLM2's vocabulary), LoRA, no gradient checkpointing (vf-rl's estimate: 1.2 MB of
# activations per token eager, 1.7 MB compiled; `vf-rl @ cfg --dry-run` prints it).
#   split, split-compiled: 16 rollouts of 4096 tokens, micro_batch_size 16, so the whole batch (~74k tokens, ~90 GiB
#     of activations) is one packed micro batch: it runs out of memory, its halves too, quarters or eighths fit.
#     Expected: "[vf-rl] out of memory on a micro batch of N tokens (S samples); split into 2 and retried" lines in
#     step 1, oom/splits > 0 in metrics.jsonl, both steps done, exit 0. split: torch_compile = false; split-compiled:
#     the defaults (compiled layers, CUDA graphs per padded shape: each part is a new shape, recorded once).
#   stop: 4 rollouts of 30000 tokens, micro_batch_size 1: one sample alone (~51 GiB of activations) cannot fit.
#     Expected: exit 4 and one line "vf-train: error: out of memory in the forward of one sample of N tokens ..."
#     naming max_seq_len, max_tokens and inference.args.gpu_memory_utilization (no checkpoint: step 1 is the first;
#     the last complete step's checkpoint is tests/test_oom.py's).
# That a split step's gradient equals the unsplit one is tests/test_oom.py's (on the CPU, to float32 rounding).
# Results: /tmp/e2e/oom.log (each run's exit, its out-of-memory lines, oom/splits per step), /tmp/e2e/oom-NAME/vf-rl.log,
# the trainer's tail and metrics.jsonl (collected by `poll`), the GPU's memory every 2 s (/tmp/e2e/oom.gpumem.log).
S=scripts/gpu/session.sh
M=/tmp/rand-llama-1b
MODEL_CONFIG=llama-1b FG=1 bash $S model  # /tmp/rand-llama-1b, max_position_embeddings 32768
oom_run() {  # oom_run NAME MAX_TOKENS BATCH ROLLOUTS MICRO EXTRA: write the config, run vf-rl --wait, summarise
  local name=oom-$1 dir=/tmp/e2e/oom-$1
  mkdir -p /tmp/runs $dir; rm -rf $dir/vf-rl
  cat > /tmp/runs/$name.toml <<TOML
model = "$M"
[env]
id = "reverse-text"
[env.args]
few_shot = 0
source = "offline"
[inference]
gpus = 1
shared = true
[inference.args]
gpu_memory_utilization = ${SHARE:-0.8}
[trainer]
gpus = 1
[trainer.args]
run_name = "$name"
output_dir = "$dir/vf-rl"
max_steps = 2
batch_size = $3
rollouts_per_example = $4
micro_batch_size = $5
max_tokens = $2
max_seq_len = $(($2 + 512))
learning_rate = 1e-5
save_steps = 1000
preflight = "off"
$(printf '%b' "$6")
TOML
  timeout ${LIMIT:-540} python3 -m vf_rl.launcher.main @ /tmp/runs/$name.toml --wait -s $name > $dir/vf-rl.log 2>&1
  local code=$?
  { echo "== $name: vf-rl exit $code"
    grep -ah "out of memory\|vf-train: error\|saved .*checkpoint" $dir/vf-rl/logs/trainer.log $dir/vf-rl.log | cut -c1-400 | head -n 20
    grep -ah "Step [0-9]" $dir/vf-rl/logs/trainer.log | tail -n 3
    python3 -c "import json,sys; [print('step', r.get('step'), 'oom/splits', r.get('oom/splits'), 'tokens/trained', r.get('tokens/trained'))
      for r in map(json.loads, open(sys.argv[1])) if 'oom/splits' in r]" $dir/vf-rl/metrics.jsonl 2>/dev/null
  } | tee -a /tmp/e2e/oom.log
  tmux kill-session -t $name 2>/dev/null
  return 0
}
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 2 > /tmp/e2e/oom.gpumem.log &
mon=$!
runs=" ${RUNS:-split split-compiled stop} "  # RUNS: which of the three to run, in this order
[[ $runs == *" split "* ]] && oom_run split 4096 16 4 16 "torch_compile = false"
[[ $runs == *" split-compiled "* ]] && oom_run split-compiled 4096 16 4 16 ""
[[ $runs == *" stop "* ]] && oom_run stop 30000 4 4 1 "torch_compile = false"
kill $mon
echo "plan done"
