#!/bin/bash
# One GPU: checks of a run's behaviour on a real GPU, each a part of PARTS (default "engine-gen engine-push estimate
# oom-split oom-stop recompiles", run in this order; ~35 min in all, ~3-10 min a part). Results: /tmp/e2e/checks.log
# (each part's summary), /tmp/e2e/fault-NAME/ and /tmp/e2e/oom-NAME/ (vf-rl.log, kill.log, the run), the
# pre-flight's JSON /tmp/e2e/faults-estimate.json, the GPU's memory every 2 s (/tmp/e2e/gpumem.log); `poll`
# collects them.
# Faults (issue 77): random weights of SmolLM2-135M's shape with its tokenizer (make_random_model.py: only the
# tokenizer folder .c6/smol must travel, with .c1, .c2, .c5 and .gpu), reverse-text from its offline rows (every
# rollout samples max_tokens = 128), vLLM and the trainer on one GPU (shared = true), weight_sync = "ipc",
# batch 128 = 16 x 8, LoRA.
#   engine-gen: vf-rl --wait, 10 steps; once step 3 is logged, scripts/gpu/kill_engine.py SIGKILLs vLLM's engine
#     process (the API server left alive) while requests are running. Expected: vLLM answers 500 and its API server
#     ends (status 0), the Inference pane's loop restarts vf-vllm, the trainer waits for it, pushes the current
#     weights ("inference server back; current weights pushed"), generates the lost batch again, and the run ends
#     with exit 0, steps 1-10 each once, errors/rate 0 on every step, inference.restarts one line.
#   engine-push: the same, the engine stopped once a batch has drained (the trainer then pushes, over ipc, the weights
#     the next batch is generated with) and killed 3 s later with the push in flight. Expected as engine-gen, and
#     "the weight sync could not reach the inference server", then "[orchestrator] batch N: the weight update it was
#     to be generated with failed": that batch is generated after the retry, not from the weights before it.
#     PARALLEL=1: engine-gen and engine-push at once on the GPU, 40 s apart (to fit a short lease).
#   SYNC=nccl (2 GPUs: vLLM on GPU 0, the trainer on GPU 1, not shared) makes the same kills with the weights
#     broadcast (issue 78 item 3): the engine dies with a worker of the broadcast group.
#   trainer-push: the trainer killed mid-push instead (with SYNC=nccl the vLLM workers wait in the broadcast),
#     save_steps = 1. Expected: vf-rl exits non-zero with the resume command; the Inference log has the worker's
#     one line ("weight update broken off at bucket ..." or the watchdog's, within stall_warning_timeout = 30 s);
#     `vf-rl --resume` then runs the steps after the last checkpoint once each and exits 0.
#   estimate: `vf-rl @ cfg --preflight --json` (its estimate of the wall clock of max_steps = 150), then the run
#     itself timed from `vf-rl` to its exit (issue 75: within 30%).
# Out of memory mid-run (issue 77; trainer/micro_step.py), in the shared layout with vLLM's share fixed at SHARE
# (default 0.8: the trainer has the rest), random Llama-1B weights, LoRA, no gradient checkpointing, LIMIT s a run
# (default 420):
#   oom-split, oom-split-compiled: 16 rollouts of 4096 tokens, micro_batch_size 16, so the whole batch (~66k tokens)
#     is one packed micro batch: it runs out of memory and is split until its parts fit ("[vf-rl] out of memory on a
#     micro batch of N tokens (S samples); split into 2 and retried"), oom/splits > 0, both steps done, exit 0
#     (oom-split: torch_compile = false; oom-split-compiled: the defaults, each part a new padded shape).
#   oom-stop: 4 rollouts of 30000 tokens, micro_batch_size 1: one sample alone cannot fit: exit 4 and one line
#     "vf-train: error: out of memory in the forward of one sample of N tokens ..." naming the keys to change.
# Recompiles (issue 76 item 3; needs SmolLM2's weights: all of .c1-.c6): 1,000 steps of the learning benchmark's
#   vf-rl side (benchmarks/learning.py --env reverse-text --device gpu --shared --no-eval --steps 1000; 16 x 8
#   rollouts of up to 128 tokens, LoRA r8, micro batch 128, compiled layers; MINUTES, default 20, bounds it): the
#   steps at which compile/recompiles grew (none expected after the warm-up), its last value, seconds per step.
S=scripts/gpu/session.sh
parts=" ${PARTS:-engine-gen engine-push estimate oom-split oom-stop recompiles} "
mkdir -p /tmp/e2e /tmp/runs
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 2 > /tmp/e2e/gpumem.log &
mon=$!
if [ ! -f /tmp/smol/tokenizer.json ]; then  # the tokenizer alone, when SmolLM2's weights did not travel
  mkdir -p /tmp/smol && cp "$(find /tmp/chunks -maxdepth 2 -type d -name smol | head -1)"/* /tmp/smol/
fi
MODEL_CONFIG=smollm2-135m FG=1 bash $S model  # /tmp/rand-smollm2-135m
cfg() {  # cfg NAME STEPS PORT: write /tmp/runs/NAME.toml
  cat > /tmp/runs/$1.toml <<TOML
model = "/tmp/rand-smollm2-135m"
[env]
id = "reverse-text"
[env.args]
few_shot = 2
source = "offline"
[inference]
gpus = 1
shared = $([ "${SYNC:-ipc}" = ipc ] && echo true || echo false)
[inference.args]
max_model_len = 1024
[trainer]
gpus = 1
[trainer.args]
run_name = "$1"
output_dir = "/tmp/e2e/fault-$1/vf-rl"
weight_sync = "${SYNC:-ipc}"
$(printf '%b' "${CFG_EXTRA:-}")
max_steps = $2
batch_size = 128
rollouts_per_example = 8
micro_batch_size = 16
max_tokens = 128
max_seq_len = 512
learning_rate = 5e-4
save_steps = ${SAVE_STEPS:-1000}
vllm_server_port = $3
TOML
}
summary() {  # summary NAME CODE: the run's exit, restarts, the trainer's recovery lines, the steps and their errors
  local d=/tmp/e2e/fault-$1/vf-rl
  { echo "== $1: vf-rl exit $2"
    cat /tmp/e2e/fault-$1/kill.log 2>/dev/null
    echo "restarts: $(cat $d/logs/inference.restarts 2>/dev/null | tr '\n' ';')"
    grep -ah "\[vf-rl\] \|vf-train: error" $d/logs/trainer.log | cut -c1-300 | head -n 12
    grep -ah "EngineDead\|engine core\|EngineCore\|died\|broken off\|watchdog" $d/logs/inference.log | cut -c1-300 | head -n 5
    python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if 'reward' in l]; \
print('steps', [x['step'] for x in r]); print('errors/rate', [x.get('errors/rate') for x in r]); \
print('server/reconnects', r[-1].get('server/reconnects') if r else None)" $d/metrics.jsonl 2>/dev/null
  } | tee -a /tmp/e2e/checks.log
}
kill_run() {  # kill_run NAME WHEN PORT [KILL]: KILL engine (default) or trainer (then the run is resumed)
  local name=$1 dir=/tmp/e2e/fault-$1 kill=${4:-engine}
  rm -rf $dir; mkdir -p $dir; cfg $name 10 $3
  python3 scripts/gpu/kill_engine.py --run-dir $dir/vf-rl --port $3 --step 3 --when $2 --kill $kill > $dir/kill.log 2>&1 &
  timeout ${LIMIT:-420} python3 -m vf_rl.launcher.main @ /tmp/runs/$name.toml --wait -s $name > $dir/vf-rl.log 2>&1
  local code=$?
  wait
  tmux kill-session -t $name 2>/dev/null
  if [ $kill = trainer ]; then  # the trainer died: vf-rl --resume goes on from the last checkpoint
    echo "== $name: vf-rl exit $code (the trainer killed); inference log:" >> /tmp/e2e/checks.log
    grep -ah "broken off\|watchdog\|Error" $dir/vf-rl/logs/inference.log | cut -c1-300 | head -n 5 >> /tmp/e2e/checks.log
    sleep 5
    timeout ${LIMIT:-420} python3 -m vf_rl.launcher.main @ /tmp/runs/$name.toml --wait -s $name --resume \
      > $dir/vf-rl-resume.log 2>&1
    code=$?
    tmux kill-session -t $name 2>/dev/null
  fi
  summary $name $code
}
if [ "${PARALLEL:-0}" = 1 ]; then  # both kill runs at once on the GPU (each vLLM takes its own share), 40 s apart
  kill_run engine-gen generating 8211 & sleep 40; kill_run engine-push pushing 8212; wait
else
  [[ $parts == *" engine-gen "* ]] && kill_run engine-gen generating 8211
  [[ $parts == *" engine-push "* ]] && kill_run engine-push pushing 8212
fi
# the trainer killed mid-push (SYNC=nccl on 2 GPUs: the vLLM worker waits in the broadcast), then resumed
[[ $parts == *" trainer-push "* ]] && SAVE_STEPS=1 CFG_EXTRA="stall_warning_timeout = 30\nvllm_server_timeout = 240" \
  kill_run trainer-push pushing 8214 trainer
if [[ $parts == *" estimate "* ]]; then
  rm -rf /tmp/e2e/fault-estimate; mkdir -p /tmp/e2e/fault-estimate; cfg estimate 150 8213
  timeout 400 python3 -m vf_rl.launcher.main @ /tmp/runs/estimate.toml --preflight \
    --json /tmp/e2e/faults-estimate.json > /tmp/e2e/fault-estimate/preflight.log 2>&1
  echo "== estimate: pre-flight exit $?" | tee -a /tmp/e2e/checks.log
  grep -a "estimate\|step \|launch\|verdict\|ready" /tmp/e2e/fault-estimate/preflight.log | head -n 12 | tee -a /tmp/e2e/checks.log
  start=$(date +%s%N)
  timeout ${LIMIT:-420} python3 -m vf_rl.launcher.main @ /tmp/runs/estimate.toml --wait -s estimate \
    > /tmp/e2e/fault-estimate/vf-rl.log 2>&1
  code=$?
  python3 -c "import json,sys,time; e=json.load(open(sys.argv[1])).get('estimate') or {}; m=time.time()-int(sys.argv[2])/1e9; \
print(f\"estimate: {e.get('total_s')} s estimated, {m:.1f} s measured (vf-rl exit {sys.argv[3]}), \
ratio {m / e['total_s'] if e.get('total_s') else float('nan'):.3f}\")" /tmp/e2e/faults-estimate.json \
    $start $code | tee -a /tmp/e2e/checks.log
  tmux kill-session -t estimate 2>/dev/null
fi
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
save_steps = ${SAVE_STEPS:-1000}
preflight = "off"
$(printf '%b' "$6")
TOML
  timeout ${LIMIT:-420} python3 -m vf_rl.launcher.main @ /tmp/runs/$name.toml --wait -s $name > $dir/vf-rl.log 2>&1
  local code=$?
  { echo "== $name: vf-rl exit $code"
    grep -ah "out of memory\|vf-train: error\|saved .*checkpoint" $dir/vf-rl/logs/trainer.log $dir/vf-rl.log | cut -c1-400 | head -n 20
    grep -ah "Step [0-9]" $dir/vf-rl/logs/trainer.log | tail -n 3
    python3 -c "import json,sys; [print('step', r.get('step'), 'oom/splits', r.get('oom/splits'), 'tokens/trained', r.get('tokens/trained'))
      for r in map(json.loads, open(sys.argv[1])) if 'oom/splits' in r]" $dir/vf-rl/metrics.jsonl 2>/dev/null
  } | tee -a /tmp/e2e/checks.log
  tmux kill-session -t $name 2>/dev/null
  return 0
}
if [[ $parts == *" oom-"* ]]; then
  M=/tmp/rand-llama-1b
  MODEL_CONFIG=llama-1b FG=1 bash $S model  # /tmp/rand-llama-1b, max_position_embeddings 32768
  [[ $parts == *" oom-split "* ]] && oom_run split 4096 16 4 16 "torch_compile = false"
  [[ $parts == *" oom-split-compiled "* ]] && oom_run split-compiled 4096 16 4 16 ""
  [[ $parts == *" oom-stop "* ]] && oom_run stop 30000 4 4 1 "torch_compile = false"
fi
if [[ $parts == *" recompiles "* ]]; then
  if [ -f /tmp/smol/model.safetensors ]; then
    ENV=reverse-text TAG=-recompiles MINUTES=${MINUTES:-20} SIDES=vf-rl EXTRA="--shared --no-eval --steps 1000" \
      FG=1 bash $S learning
    metrics=$(find /tmp/e2e/learning-reverse-text-recompiles -name metrics.jsonl | head -1)
    python3 - "$metrics" <<'PY' | tee -a /tmp/e2e/checks.log
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if '"compile/recompiles"' in line]
counts = [(r["step"], r["compile/recompiles"]) for r in rows]
grew = [step for (step, n), (_, before) in zip(counts[1:], counts) if n > before]
first = counts[0][1] if counts else None
print(f"steps {len(rows)} (last {counts[-1][0] if counts else None}); compile/recompiles at step 1 {first}, "
      f"last {counts[-1][1] if counts else None}; steps where it grew: {grew or 'none'}")
times = [r["timing/elapsed_s"] for r in rows if "timing/elapsed_s" in r]
if len(times) > 20:
    print(f"seconds per step over steps 11-{len(times)}: {(times[-1] - times[9]) / (len(times) - 10):.3f}")
PY
  else
    echo "== recompiles: skipped (SmolLM2's weights did not travel: .c3, .c4, .c6)" | tee -a /tmp/e2e/checks.log
  fi
fi
kill $mon
echo "plan done"
