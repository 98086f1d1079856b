#!/bin/bash
# One GPU, ~20 min (PARTS picks parts, default all, in this order): vLLM engine death on a GPU, the pre-flight's time
# estimate against a measured run, then a real CUDA out of memory mid-run (plans/x1-oom.sh, OOM_RUNS).
# Every run: random weights of SmolLM2-135M's shape with its tokenizer (make_random_model.py: only the tokenizer
# folder .c6/smol travels, not the weights' parts, so the transfers are .c1, .c2, .c5 with .c6/smol, and .gpu),
# reverse-text from its offline rows (every rollout samples max_tokens = 128), vLLM and the trainer on one GPU
# (shared = true), weight_sync = "ipc", batch 128 = 16 x 8, LoRA.
#   engine-gen: vf-rl --wait, 10 steps; once step 3 is logged, scripts/gpu/kill_engine.py SIGKILLs vLLM's engine
#     process (the API server left alive) while requests are running. Expected: vLLM answers 500 and its API server
#     ends (status 0), the Inference pane's loop restarts vf-vllm, the trainer waits for it, pushes the current
#     weights ("inference server back; current weights pushed"), generates the lost batch again, and the run ends
#     with exit 0, steps 1-10 each once, errors/rate 0 on every step, inference.restarts one line.
#   engine-push: the same, the engine stopped once a batch has drained (the trainer then pushes, over ipc, the weights
#     the next batch is generated with) and killed 3 s later with the push in flight. Expected as engine-gen, and
#     "the weight sync could not reach the inference server" then "generating batch N with the current weights":
#     the batch that waited for the lost push is generated after the retry, not from the weights before it.
#   estimate: `vf-rl @ cfg --preflight --json` (its estimate of the wall clock of max_steps = 150), then the run
#     itself timed from `vf-rl` to its exit (issue 75: within 30%).
#   oom: plans/x1-oom.sh with RUNS=$OOM_RUNS (default "split stop"), LIMIT (default 420) per run.
#   PARALLEL=1: engine-gen and engine-push at once on the GPU, 40 s apart (to fit a short lease).
# Results: /tmp/e2e/faults.log (each part's summary), /tmp/e2e/fault-NAME/ (vf-rl.log, kill.log, the run), the
# pre-flight's JSON /tmp/e2e/faults-estimate.json; `poll` collects them.
S=scripts/gpu/session.sh
mkdir -p /tmp/e2e /tmp/runs
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
shared = true
[inference.args]
max_model_len = 1024
[trainer]
gpus = 1
[trainer.args]
run_name = "$1"
output_dir = "/tmp/e2e/fault-$1/vf-rl"
weight_sync = "ipc"
max_steps = $2
batch_size = 128
rollouts_per_example = 8
micro_batch_size = 16
max_tokens = 128
max_seq_len = 512
learning_rate = 5e-4
save_steps = 1000
vllm_server_port = $3
TOML
}
summary() {  # summary NAME CODE: the run's exit, restarts, the trainer's recovery lines, the steps and their errors
  local d=/tmp/e2e/fault-$1/vf-rl
  { echo "== $1: vf-rl exit $2"
    cat /tmp/e2e/fault-$1/kill.log 2>/dev/null
    echo "restarts: $(cat $d/logs/inference.restarts 2>/dev/null | tr '\n' ';')"
    grep -ah "\[vf-rl\] \|vf-train: error" $d/logs/trainer.log | cut -c1-300 | head -n 12
    grep -ah "EngineDead\|engine core\|EngineCore\|died" $d/logs/inference.log | cut -c1-200 | head -n 5
    python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if 'reward' in l]; \
print('steps', [x['step'] for x in r]); print('errors/rate', [x.get('errors/rate') for x in r]); \
print('server/reconnects', r[-1].get('server/reconnects') if r else None)" $d/metrics.jsonl 2>/dev/null
  } | tee -a /tmp/e2e/faults.log
}
kill_run() {  # kill_run NAME WHEN PORT
  local name=$1 dir=/tmp/e2e/fault-$1
  rm -rf $dir; mkdir -p $dir; cfg $name 10 $3
  python3 scripts/gpu/kill_engine.py --run-dir $dir/vf-rl --port $3 --step 3 --when $2 > $dir/kill.log 2>&1 &
  timeout ${LIMIT:-420} python3 -m vf_rl.launcher.main @ /tmp/runs/$name.toml --wait -s $name > $dir/vf-rl.log 2>&1
  local code=$?
  wait
  summary $name $code
  tmux kill-session -t $name 2>/dev/null
}
parts=" ${PARTS:-engine-gen engine-push estimate oom} "
if [ "${PARALLEL:-0}" = 1 ]; then  # both kill runs at once on the GPU (each vLLM takes its own share), 40 s apart
  kill_run engine-gen generating 8211 & sleep 40; kill_run engine-push pushing 8212; wait
else
  [[ $parts == *" engine-gen "* ]] && kill_run engine-gen generating 8211
  [[ $parts == *" engine-push "* ]] && kill_run engine-push pushing 8212
fi
if [[ $parts == *" estimate "* ]]; then
  rm -rf /tmp/e2e/fault-estimate; mkdir -p /tmp/e2e/fault-estimate; cfg estimate 150 8213
  timeout 400 python3 -m vf_rl.launcher.main @ /tmp/runs/estimate.toml --preflight \
    --json /tmp/e2e/faults-estimate.json > /tmp/e2e/fault-estimate/preflight.log 2>&1
  echo "== estimate: pre-flight exit $?" | tee -a /tmp/e2e/faults.log
  grep -a "estimate\|step \|launch\|verdict\|ready" /tmp/e2e/fault-estimate/preflight.log | head -n 12 | tee -a /tmp/e2e/faults.log
  start=$(date +%s%N)
  timeout ${LIMIT:-420} python3 -m vf_rl.launcher.main @ /tmp/runs/estimate.toml --wait -s estimate \
    > /tmp/e2e/fault-estimate/vf-rl.log 2>&1
  code=$?
  python3 -c "import json,sys,time; e=json.load(open(sys.argv[1])).get('estimate') or {}; m=time.time()-int(sys.argv[2])/1e9; \
print(f\"estimate: {e.get('total_s')} s estimated, {m:.1f} s measured (vf-rl exit {sys.argv[3]}), \
ratio {m / e['total_s'] if e.get('total_s') else float('nan'):.3f}\")" /tmp/e2e/faults-estimate.json \
    $start $code | tee -a /tmp/e2e/faults.log
  tmux kill-session -t estimate 2>/dev/null
fi
[[ $parts == *" oom "* ]] && RUNS="${OOM_RUNS:-split stop}" LIMIT=${LIMIT:-420} bash scripts/gpu/plans/x1-oom.sh
echo "plan done"
