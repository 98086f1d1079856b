#!/bin/bash
# usage (GPU machine, repo root, after the bundle transfers): scripts/gpu/session.sh PART
# Runs one batch of the GPU checks and benchmarks, every output tee'd to $OUT/PART.*.txt.
#   e2e    : vf-rl end to end with weight_sync = auto (-> nccl), the marked GPU tests
#   sync135: weight_sync.py on SmolLM2-135M
#   bench  : trainer_step.py, vf-rl vs TRL cispo, qwen2-0.5b and llama-1b, full weights and LoRA
#   sync1b : weight_sync.py on a random llama-1b
#   shared : vf-rl with inference and trainer on one GPU (shared = true)
#   graphs : the same, 10 steps, vLLM with CUDA graphs (no enforce_eager)
#   scale  : issue 16, two vf-vllm servers (GPU 0 and GPU 1) feeding one vf-train, 3 steps (tests/test_gpu.py)
#   v1     : issue 28, a verifiers v1 environment (tests/verifiers_envs/vfx_reverse_text_v1.py, unchanged) trains 3 steps
#            through vLLM 0.26, which lacks the token route: vf-vllm serves it (needs .gpu's verifiers/renderers wheels)
#   sync   : the GPU tests of every weight-sync transport (ipc included) and of overlapped pushes
#   profile: Llama-1.2B full at fixed length with liger (MFU), and a torch.profiler step per side of Qwen2-0.5B LoRA
#   bench-liger: trainer_step.py at fixed length, eager vf-rl with liger-kernel (wheel in .gpu/liger) vs TRL
#            (STEPS=10 EXTRA="--interleave": more steps, the sides' steps alternated)
#   bench-compile: trainer_step.py, vf-rl (defaults: compiled layers) and vf-rl eager vs TRL, interleaved, no liger
#            (BENCH, MODE=fixed|realistic, SIDES, STEPS, EXTRA; carries only .whl, see benchmarks/README.md)
#   generation: benchmarks/generation.py, the rollout request path alone (idle, a busy thread, the GPU loaded)
#   apiserver: generation.py's group-process path, idle, with vLLM's --api-server-count 1, 2 and 4 (COUNTS), on
#            reverse-text and on alphabet-sort (two turns: the second is one chat completion per rollout)
#   engines: the same probe with 1 and 2 vf-vllm servers on one GPU (ENGINES; each 0.3/N of it, API processes;
#            ROUNDS), with the GPU's busy share and the ms per token of each batch's longest rollout
#   big    : issue 29, an 8B-shaped LoRA run end to end on one shared GPU (vLLM and the trainer; vLLM's share derived
#            by vf-rl), random weights (scripts/gpu/make_random_model.py: every rollout runs to MAXTOK, default 8192,
#            sampled tokens), 2 prompts x 4 rollouts, STEPS (default 3), MODEL_CONFIG (default llama-3.1-8b); background
#   multi  : issue 31, nccl weight updates into vf-vllm on two GPUs as 2 tensor-parallel shards (a random llama-1b)
#            and as 2 data-parallel engines (SmolLM2), the trainer on a third GPU (tests/test_gpu.py, 3 GPUs visible)
#   zero3  : issue 31, full-weight ZeRO-3 training of an 8B shape (random weights, MODEL_CONFIG) on TRAIN_GPUS
#            (default 2) GPUs with nccl sync into vf-vllm on the GPU before them, STEPS (default 3), 16 rollouts of
#            MAXTOK (default 1024) sampled tokens per step; each GPU's memory sampled every 2 s; background;
#            TRAINER_ARGS: more [trainer.args] lines (\n between), TAG: a suffix for the run's name
#   scaling: issue 31, the whole loop's throughput per layout: LAYOUTS (inference:trainer GPUs, default "1:1 2:2 3:1";
#            the 128 rollouts split over the trainer's micro batches of 16) of reverse-text on SmolLM2 (16 x 8
#            rollouts, MAXTOK default 128, STEPS default 30, vLLM with CUDA graphs), then benchmarks/scaling.py;
#            MODEL_CONFIG (a trainer_step.py config, e.g. llama-1b) runs random weights of that shape instead
#   plan   : PLAN=scripts/gpu/plans/NAME.sh, lanes of parts (FG=1) on their own GPUs in one background session, so that
#            one call starts a whole GPU session's work (e.g. plans/x4-dp.sh on a 4-GPU host); `poll` collects.
#            The device tool gives the machine back ~30 s after a call ends, background plan or not: call `poll`
#            again at once (POLL_S near the call's limit), and do local work only after the plan is collected
#   pair   : the learning benchmark's sides at once, one GPU each, optionally after vf-sft (WARM=1), one table of both
#   warmup: vf-sft on ENV (reverse-text, gsm8k), then benchmarks/learning.py from the warmed-up model (MINUTES, SIDES, EVAL_EVERY)
#   best   : trainer_step.py, the small-model cases against every TRL side (BENCH, MODE, SIDES, STEPS), background
#   long   : trainer_step.py at 7-8B shapes with LoRA, 4k-32k tokens per sequence (MODELS, LENGTHS, SIDES), background
#   small-step: trainer_step.py's small step at the defaults (SmolLM2-135M LoRA, 128 rollouts), profiled (TAG), background
#   usersize: issue 76's end-to-end benchmark at user sizes on one shared GPU: benchmarks/learning.py --env fixed-length
#            (every rollout samples MAXTOK tokens, default 512) on random weights of MODEL_CONFIG's real shape and
#            vocabulary (default qwen3-1.7b; make_random_model.py --pad-vocab), ADAPTER full (default) or lora (r16),
#            16 prompts x 16 rollouts, micro batch 16 on both sides, STEPS (default 12: 2 warm-up + 10 timed), no
#            evaluations; each side of SIDES (default vf-rl,trl-liger) in a run of its own (LIMIT s, default 900), then
#            one table and JSON of all (/tmp/e2e/usersize-MODEL-ADAPTER-MAXTOK.json); background (FG=1 in a plan)
#   learning: benchmarks/learning.py (ENV, default reverse-text, or several run in turn; TAG; MINUTES, default 8; SIDES, default
#            vf-rl,trl-compile; EXTRA), one shared GPU and TRL colocate (TRL_VLLM=server and EXTRA without --shared
#            for 2 GPUs), started in the background (setsid) so that it outlives this run; `poll` waits for it
#            (POLL_S seconds) and copies its JSON, PNG and log to $OUT
set -u
source scripts/gpu/env.sh
PART=$1
run() {  # run NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  (timeout "$limit" "$@" 2>&1; echo "RC=$?") > "$OUT/$PART.$name.txt"
  tail -n 14 "$OUT/$PART.$name.txt"
}
sft() {  # sft ENV: the command that warms SmolLM2 up on ENV (configs/vf-sft/ENV.toml with model /tmp/smol, output
  # /tmp/sft-ENV; its config written to /tmp/sft-ENV.toml now), logging to /tmp/e2e/sft-ENV.log
  sed -e 's#^model = .*#model = "/tmp/smol"#' -e "s#^output_dir = .*#output_dir = \"/tmp/sft-$1\"#" \
    configs/vf-sft/$1.toml > /tmp/sft-$1.toml
  echo "python3 -m vf_rl.sft.cli @ /tmp/sft-$1.toml > /tmp/e2e/sft-$1.log 2>&1"
}
random_model() {  # random_model CONFIG: /tmp/rand-CONFIG, random weights of a trainer_step.py config with SmolLM2's
  # vocabulary (scripts/gpu/make_random_model.py), made once per machine
  ls /tmp/rand-$1/model*.safetensors* > /dev/null 2>&1 || run make-$1 400 python3 scripts/gpu/make_random_model.py \
    --config $1 --tokenizer /tmp/smol --out /tmp/rand-$1
}
random_run_head() {  # random_run_head MODEL_DIR INFERENCE_GPUS SHARED TRAINER_GPUS MAX_TOKENS: a reverse-text run config
  # on a random model (few_shot = 0, offline rows; every rollout samples MAX_TOKENS), STEPS (default 3) steps of one
  # sequence per micro batch with gradient checkpointing; a part adds its own [trainer.args] keys after it
  cat <<TOML
model = "$1"
[env]
id = "reverse-text"
[env.args]
few_shot = 0
source = "offline"
[inference]
gpus = $2
shared = $3
[trainer]
gpus = $4
[trainer.args]
max_steps = ${STEPS:-3}
micro_batch_size = 1
max_tokens = $5
max_seq_len = $(($5 + 512))
gradient_checkpointing = true
save_steps = 1000
TOML
}
background() {  # background CMD: runs CMD in its own session that outlives this call, then polls (POLL_S); with
  # FG=1 (a lane of a plan) it runs CMD here and returns when CMD ends
  if [ "${FG:-0}" = 1 ]; then bash -c "$1"; return; fi
  setsid nohup bash -c "$1" > /dev/null 2>&1 &
  sleep 5; PART=poll bash "$0" poll
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
case $PART in
e2e)
  run auto 200 bash scripts/gpu/vf_rl_run.sh gpu-auto auto 1 1 false 3
  echo "trainer processes left: $(pgrep -fc vf_rl.trainer.cli)"; pkill -9 -f "vf_rl.trainer.cli|vf_rl.inference.server" 2>/dev/null; pkill -9 -f "vllm" 2>/dev/null; sleep 2
  VF_RL_GPU_MODEL=/tmp/smol VF_RL_GPU_REPORT=$OUT/gpu_test.jsonl run gputest 170 python3 -m pytest -m gpu tests/test_gpu.py -s -q -p no:cacheprovider
  ;;
sync135)
  run sync135 170 python3 benchmarks/weight_sync.py --model /tmp/smol --json $OUT/sync.jsonl
  ;;
bench)  # BENCH="qwen2-0.5b:full llama-1b:lora" picks a subset
  for case in ${BENCH:-qwen2-0.5b:full qwen2-0.5b:lora llama-1b:full llama-1b:lora}; do
    m=${case%%:*}; kind=${case##*:}; flag=""; [ $kind = lora ] && flag=--lora
    run $m-$kind 140 python3 benchmarks/trainer_step.py --model-config $m $flag --batch 64 --micro-batch 8 --prompt-len 256 --completion-len 256 --steps 5 --warmup 2 --json $OUT/ts-$m-$kind.json
  done
  ;;
sync)
  VF_RL_GPU_MODEL=/tmp/smol VF_RL_GPU_REPORT=$OUT/gpu_test.jsonl run sync 400 python3 -m pytest -m gpu tests/test_gpu.py -k "not two_servers" -s -q -p no:cacheprovider
  ;;
bench-liger)  # BENCH as in bench
  [ -f /tmp/site3/.done ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/site3 /tmp/chunks/.gpu/liger/*.whl && touch /tmp/site3/.done; }
  for case in ${BENCH:-llama-1b:full qwen2-0.5b:full llama-1b:lora qwen2-0.5b:lora}; do
    m=${case%%:*}; kind=${case##*:}; flag=""; [ $kind = lora ] && flag=--lora
    PYTHONPATH=$PYTHONPATH:/tmp/site3 run liger-$m-$kind 150 python3 benchmarks/trainer_step.py --mode fixed --model-config $m $flag --vf-liger --sides vf-rl-eager,trl --batch 64 --micro-batch 8 --prompt-len 256 --completion-len 256 --steps ${STEPS:-5} --warmup 2 ${EXTRA:-} --json $OUT/liger-$m-$kind.json
  done
  ;;
profile)  # the fixed-length Llama-1.2B full step with liger (MFU), then one profiled Qwen2-0.5B LoRA step per side
  [ -f /tmp/site3/.done ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/site3 /tmp/chunks/.gpu/liger/*.whl && touch /tmp/site3/.done; }
  PYTHONPATH=$PYTHONPATH:/tmp/site3 run liger-llama-1b-full 120 python3 benchmarks/trainer_step.py --mode fixed --model-config llama-1b --vf-liger --sides vf-rl-eager,trl --batch 64 --micro-batch 8 --prompt-len 256 --completion-len 256 --steps 5 --warmup 2 --no-grad-check --json $OUT/liger-llama-1b-full.json
  PYTHONPATH=$PYTHONPATH:/tmp/site3 run profile-qwen-lora 150 python3 benchmarks/trainer_step.py --mode fixed --model-config qwen2-0.5b --lora --vf-liger --sides vf-rl-eager,trl --batch 64 --micro-batch 8 --prompt-len 256 --completion-len 256 --steps 3 --warmup 1 --no-grad-check --profile --json $OUT/profile-qwen2-0.5b-lora.json
  grep -A30 "profiled step" $OUT/$PART.profile-qwen-lora.txt | cut -c1-200
  ;;
bench-compile)  # vf-rl (defaults: compiled on a GPU) vs TRL, interleaved, no liger anywhere; needs only the .whl carry
  # BENCH as in bench; MODE=fixed|realistic; SIDES (default vf-rl,vf-rl-eager,trl); STEPS; EXTRA
  [ -f /tmp/site4/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site4 .whl/*.whl && touch /tmp/site4/.done; }
  R="--prompt-min 64 --prompt-max 1024 --max-tokens 1024 --cap-share 0.25 --group 8"
  F="--prompt-len 256 --completion-len 256"
  for case in ${BENCH:-qwen2-0.5b:lora llama-1b:lora qwen2-0.5b:full llama-1b:full}; do
    m=${case%%:*}; kind=${case##*:}; flag=""; [ $kind = lora ] && flag=--lora
    [ ${MODE:-fixed} = realistic ] && shape=$R || shape=$F
    PYTHONPATH=/tmp/site4:$REPO/src run ${MODE:-fixed}-$m-$kind ${LIMIT:-280} python3 benchmarks/trainer_step.py --mode ${MODE:-fixed} \
      --model-config $m $flag --batch 64 --micro-batch 8 $shape --steps ${STEPS:-10} --warmup 2 --interleave \
      --sides ${SIDES:-vf-rl,vf-rl-eager,trl} ${EXTRA:-} --json $OUT/${MODE:-fixed}-$m-$kind.json
  done
  ;;
sync1b)
  run sync1b 300 python3 benchmarks/weight_sync.py --random llama-1b --tokenizer /tmp/smol --json $OUT/sync.jsonl
  ;;
v1)
  PYTHONPATH=$PYTHONPATH:$REPO/tests/verifiers_envs ENV_ID=someone/vfx-reverse-text-v1 ENV_ARGS="taskset = { few_shot = 2 }" \
    run v1 300 bash scripts/gpu/vf_rl_run.sh gpu-v1 auto 1 1 true 3
  grep -ah "reward/lcs_reward\|importance_ratio" /tmp/runs/gpu-v1/metrics.jsonl | head -3 | cut -c1-400
  ;;
shared)
  run shared 250 bash scripts/gpu/vf_rl_run.sh gpu-shared auto 1 1 true 3
  ;;
graphs)
  run shared-graphs 250 bash scripts/gpu/vf_rl_run.sh gpu-shared-graphs auto 1 1 true 10 false
  ;;
scale)
  VF_RL_GPU_MODEL=/tmp/smol VF_RL_GPU_REPORT=$OUT/gpu_test.jsonl run scale 450 python3 -m pytest -m gpu tests/test_gpu.py -k two_servers -s -q -p no:cacheprovider
  ;;
generation)
  run generation 540 python3 benchmarks/generation.py --serve --model /tmp/smol --vllm-args "--gpu-memory-utilization 0.3" --rounds ${ROUNDS:-3} \
    --json $OUT/generation.json
  ;;
apiserver)
  AS='{"source": "offline", "min_turns": 2, "max_turns": 2, "min_names_per_turn": 1, "max_names_per_turn": 2, "few_shot": 1}'
  for n in ${COUNTS:-1 2 4}; do
    run rt-api$n 200 python3 benchmarks/generation.py --serve --model /tmp/smol --paths group-process --modes idle \
      --rounds ${ROUNDS:-3} --vllm-args "--gpu-memory-utilization 0.3 --api-server-count $n" --json $OUT/api-rt-$n.json
    run as-api$n 200 python3 benchmarks/generation.py --serve --model /tmp/smol --paths group-process --modes idle \
      --env alphabet-sort --env-args "$AS" --rounds ${ROUNDS:-3} \
      --vllm-args "--gpu-memory-utilization 0.3 --api-server-count $n" --json $OUT/api-as-$n.json
  done
  ;;
engines)  # issue 26: the request-path probe with several vf-vllm servers on one GPU (ENGINES, default "1 2": each
  # with 0.3/N of the GPU and API API-server processes, default 2), reverse-text and alphabet-sort
  AS='{"source": "offline", "min_turns": 2, "max_turns": 2, "min_names_per_turn": 1, "max_names_per_turn": 2, "few_shot": 1}'
  for n in ${ENGINES:-1 2}; do
    mem=$(python3 -c "print(round(0.3 / $n, 3))")
    run rt-eng$n 300 python3 benchmarks/generation.py --serve --servers $n --model /tmp/smol --paths group-process \
      --modes idle --rounds ${ROUNDS:-3} --vllm-args "--gpu-memory-utilization $mem --api-server-count ${API:-2}" \
      --json $OUT/eng-rt-$n.json
    run as-eng$n 300 python3 benchmarks/generation.py --serve --servers $n --model /tmp/smol --paths group-process \
      --modes idle --env alphabet-sort --env-args "$AS" --rounds ${ROUNDS:-3} \
      --vllm-args "--gpu-memory-utilization $mem --api-server-count ${API:-2}" --json $OUT/eng-as-$n.json
  done
  ;;
learning)  # ENV may list several environments: they run one after another (TAG is added to each name)
  mkdir -p /tmp/e2e
  cmd=""
  for env in ${ENV:-reverse-text}; do
    name=learning-$env${TAG:-}; rm -rf /tmp/e2e/$name
    cmd+="python3 benchmarks/learning.py --env $env --device gpu --model /tmp/smol --minutes ${MINUTES:-8} \
      --trl-vllm ${TRL_VLLM:-colocate} --sides ${SIDES:-vf-rl,trl-compile} ${EXTRA:---shared} \
      --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png --out /tmp/e2e/$name > /tmp/e2e/$name.log 2>&1; "
  done
  background "$cmd"
  ;;
usersize)
  m=${MODEL_CONFIG:-qwen3-1.7b}; kind=${ADAPTER:-full}; tok=${MAXTOK:-512}; name=usersize-$m-$kind-$tok${TAG:-}
  mkdir -p /tmp/e2e; rm -rf /tmp/e2e/$name /tmp/e2e/$name-*
  src=/tmp/smol; [ -f $src/tokenizer.json ] || src=$(dirname "$(find /tmp/chunks -name tokenizer.json | head -1)")
  [ -f /tmp/real-$m/config.json ] || run make-$m 400 python3 scripts/gpu/make_random_model.py --config $m \
    --tokenizer $src --pad-vocab --out /tmp/real-$m
  [ $kind = full ] && flags="--full-weights --lr 1e-6" || flags="--lora-rank 16 --lora-alpha 16 --lr 1e-5"
  cmd=""
  for side in ${SIDES//,/ }; do  # a side that fails or runs out of time leaves the others' results
    cmd+="nvidia-smi --query-gpu=memory.used --format=csv,noheader > /tmp/e2e/$name-$side.log; \
      timeout ${LIMIT:-900} python3 benchmarks/learning.py --env fixed-length --device gpu --shared --trl-vllm colocate \
      --model /tmp/real-$m --max-tokens $tok --prompts 16 --rollouts 16 --micro-batch 16 --trl-micro-batch 16 \
      --steps ${STEPS:-12} --warmup 1 --minutes 60 --no-eval $flags --sides $side ${EXTRA:-} \
      --json /tmp/e2e/$name-$side.json --out /tmp/e2e/$name-$side >> /tmp/e2e/$name-$side.log 2>&1 \
      || tmux kill-server 2>/dev/null; sleep 5; "  # a timed-out vf-rl side leaves its tmux panes: end them
  done
  cmd+="python3 benchmarks/learning.py \$(for s in ${SIDES//,/ }; do f=/tmp/e2e/$name-\$s.json; [ -f \$f ] && \
    echo --from-json \$f; done) --json /tmp/e2e/$name.json > /tmp/e2e/$name.table.txt 2>&1"
  background "$cmd"
  ;;
warmup)  # vf-sft (configs/vf-sft/$ENV.toml, ENV default reverse-text, model /tmp/smol), then the learning benchmark on
  # that environment from the warmed-up model with few_shot = 0 (SIDES default vf-rl, e.g. vf-rl,trl-liger: every side
  # starts from the same warmed-up model; MINUTES default 15; EVAL_EVERY steps between held-out evals of vf-rl)
  mkdir -p /tmp/e2e; env=${ENV:-reverse-text}; name=learning-$env${TAG:--warmup}; rm -rf /tmp/e2e/$name /tmp/sft-$env
  cmd="$(sft $env) && python3 benchmarks/learning.py --env $env \
    --env-arg few_shot=0 --device gpu --model /tmp/sft-$env --minutes ${MINUTES:-15} --sides ${SIDES:-vf-rl} \
    --trl-vllm ${TRL_VLLM:-colocate} --eval-every ${EVAL_EVERY:-50} ${EXTRA:---shared} --json /tmp/e2e/$name.json \
    --plot /tmp/e2e/$name.png --out /tmp/e2e/$name > /tmp/e2e/$name.log 2>&1"
  background "$cmd"
  ;;
pair)  # the learning benchmark's sides at once, one GPU each (a host with a GPU per side: SIDES, default
  # vf-rl,trl-liger; each GPU shared by its side's vLLM and trainer, EXTRA default --shared), then one table, JSON and
  # PNG of both (learning.py --from-json per side). WARM=1: vf-sft first (configs/vf-sft/$ENV.toml on GPU 0) and every
  # side starts from the warmed-up model with few_shot = 0. ENV (default reverse-text), TAG, MINUTES (default 8),
  # EVAL_EVERY (vf-rl's held-out evals, default none between), GPU0 (the first GPU, default 0: two pairs run at once
  # on a 4-GPU host as GPU0=0 and GPU0=2). `poll` collects.
  mkdir -p /tmp/e2e; env=${ENV:-reverse-text}; name=learning-$env${TAG:-}; rm -rf /tmp/e2e/$name /tmp/e2e/$name.*
  model=/tmp/smol; pre=""; args=""
  if [ "${WARM:-0}" = 1 ]; then
    pre="CUDA_VISIBLE_DEVICES=${GPU0:-0} $(sft $env) && "
    model=/tmp/sft-$env; args="--env-arg few_shot=0"
  fi
  gpu=${GPU0:-0}; runs=""; jsons=""
  for side in $(echo ${SIDES:-vf-rl,trl-liger} | tr , ' '); do
    runs+="CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/learning.py --env $env $args --device gpu --model $model \
      --minutes ${MINUTES:-8} --sides $side --eval-every ${EVAL_EVERY:-1000000} ${EXTRA:---shared} \
      --json /tmp/e2e/$name.$side.json --out /tmp/e2e/$name.$side > /tmp/e2e/$name.$side.log 2>&1 & "
    jsons+=" --from-json /tmp/e2e/$name.$side.json"; gpu=$((gpu + 1))
  done
  cmd="$pre { $runs wait; }; python3 benchmarks/learning.py $jsons --json /tmp/e2e/$name.json --plot /tmp/e2e/$name.png \
    > /tmp/e2e/$name.log 2>&1"
  background "$cmd"
  ;;
long)  # issue 29: 7-8B shapes with LoRA at long sequences, each side its own trainer_step.py process (one after the
  # other, an out-of-memory side is a result); MODELS (default llama-3.1-8b), LENGTHS (tokens per sequence: 512-token
  # prompt + the rest completion), SIDES (default vf-rl,trl,trl-liger), STEPS, B (batch), TAG (name suffix), EXTRA
  # (e.g. --offload-activations), FULL=1 (full weights, not LoRA); JSON and logs in /tmp/e2e, `poll` collects
  mkdir -p /tmp/e2e; cmd=""; kind=lora; flag=--lora; [ "${FULL:-0}" = 1 ] && kind=full && flag=""
  for m in ${MODELS:-llama-3.1-8b}; do for L in ${LENGTHS:-4096 8192 16384 32768}; do for side in ${SIDES:-vf-rl trl trl-liger}; do
    b=8; [ $L -gt 8192 ] && b=4; b=${B:-$b}
    name=long-$m-$kind-$L-$side${TAG:-}
    cmd+="timeout ${LIMIT:-900} python3 benchmarks/trainer_step.py --mode fixed --model-config $m $flag --gradient-checkpointing \
      --no-grad-check --batch $b --micro-batch 1 --prompt-len 512 --completion-len $((L - 512)) --steps ${STEPS:-2} --warmup 1 \
      --sides $side ${EXTRA:-} --json /tmp/e2e/$name.json > /tmp/e2e/$name.log 2>&1; "
  done; done; done
  background "$cmd"
  ;;
best)  # issue 29: the small-model cases against every TRL side, each side its own trainer_step.py process, one after
  # the other (liger patches modeling modules process-wide); BENCH as in bench; MODE=fixed|realistic; SIDES (default
  # vf-rl trl-compile trl-liger trl-compile-liger trl); STEPS; JSON and logs in /tmp/e2e, `poll` collects
  mkdir -p /tmp/e2e; cmd=""
  R="--prompt-min 64 --prompt-max 1024 --max-tokens 1024 --cap-share 0.25 --group 8"
  F="--prompt-len 256 --completion-len 256"
  for case in ${BENCH:-qwen2-0.5b:lora llama-1b:lora qwen2-0.5b:full llama-1b:full}; do
    for side in ${SIDES:-vf-rl trl-compile trl-liger trl-compile-liger trl}; do
      m=${case%%:*}; kind=${case##*:}; flag=""; [ $kind = lora ] && flag=--lora
      [ ${MODE:-fixed} = realistic ] && shape=$R || shape=$F
      name=best-${MODE:-fixed}-$m-$kind-$side
      cmd+="timeout ${LIMIT:-400} python3 benchmarks/trainer_step.py --mode ${MODE:-fixed} --model-config $m $flag \
        --batch 64 --micro-batch 8 $shape --steps ${STEPS:-8} --warmup 2 --no-grad-check --sides $side ${EXTRA:-} \
        --json /tmp/e2e/$name.json > /tmp/e2e/$name.log 2>&1; "
    done
  done
  background "$cmd"
  ;;
small-step)  # the small step at the defaults (SmolLM2-135M LoRA r8, 128 rollouts of 40-90 + up to 128 tokens, no vLLM),
  # profiled with its trace: small-step-$TAG-smollm2-vf-rl.{json,log} and trace-small-$TAG.json.gz in /tmp/e2e
  mkdir -p /tmp/e2e; name=small-step-${TAG:-run}-smollm2-vf-rl
  background "timeout ${LIMIT:-420} python3 benchmarks/trainer_step.py --mode realistic --model-config smollm2-135m --lora \
    --lora-rank 8 --lora-alpha 32 --batch 128 --micro-batch 128 --group 8 --prompt-min 40 --prompt-max 90 --max-tokens 128 \
    --cap-share 0.2 --steps 6 --warmup 3 --no-grad-check --sides vf-rl --profile --trace /tmp/e2e/trace-small-${TAG:-run}.json.gz \
    --json /tmp/e2e/$name.json > /tmp/e2e/$name.log 2>&1"
  ;;
big)
  m=${MODEL_CONFIG:-llama-3.1-8b}; dir=/tmp/rand-$m; tok=${MAXTOK:-8192}; mkdir -p /tmp/e2e /tmp/runs; rm -rf /tmp/e2e/big*
  random_model $m
  { random_run_head $dir 1 true 1 $tok; cat <<TOML; } > /tmp/runs/big.toml
run_name = "big-$m"
output_dir = "/tmp/e2e/big/vf-rl"
batch_size = 8
rollouts_per_example = 4
lora_rank = 16
learning_rate = 1e-5
torch_compile = false
${BIG_EXTRA:-}
TOML
  python3 -m vf_rl.launcher.main @ /tmp/runs/big.toml --dry-run 2>&1 | grep -a "gpu_memory_utilization\|trainer memory" | tee $OUT/big-dry-run.txt
  background "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 2 > /tmp/e2e/big.gpumem.log & \
    mon=\$!; timeout ${LIMIT:-1500} python3 -m vf_rl.launcher.main @ /tmp/runs/big.toml --wait -s big > /tmp/e2e/big.log 2>&1; \
    kill \$mon"
  ;;
model)  # makes the random-weight model MODEL_CONFIG (default llama-3.1-8b) once, before lanes that share it start
  random_model ${MODEL_CONFIG:-llama-3.1-8b}
  ;;
multi)
  random_model llama-1b
  VF_RL_GPU_MODEL=/tmp/smol VF_RL_GPU_TP_MODEL=/tmp/rand-llama-1b VF_RL_GPU_REPORT=$OUT/multi.jsonl run multi 500 \
    python3 -m pytest -m gpu tests/test_gpu.py -k "${MULTI_K:-every_worker}" -s -q -p no:cacheprovider
  ;;
zero3)
  m=${MODEL_CONFIG:-llama-3.1-8b}; dir=/tmp/rand-$m; tok=${MAXTOK:-1024}; n=${TRAIN_GPUS:-2}; name=zero3-$m-$n${TAG:+-$TAG}
  mkdir -p /tmp/e2e /tmp/runs; rm -rf /tmp/e2e/$name*
  random_model $m
  { random_run_head $dir 1 false $n $tok; cat <<TOML; } > /tmp/runs/$name.toml
run_name = "$name"
output_dir = "/tmp/e2e/$name/vf-rl"
use_lora = false
deepspeed = "configs/deepspeed/zero3.json"
weight_sync = "nccl"
batch_size = 16
rollouts_per_example = 4
learning_rate = 1e-6
$(printf '%b' "${TRAINER_ARGS:-}")
TOML
  python3 -m vf_rl.launcher.main @ /tmp/runs/$name.toml --dry-run > $OUT/$name-dry-run.txt 2>&1; tail -n 5 $OUT/$name-dry-run.txt
  background "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -l 2 > /tmp/e2e/$name.gpumem.log & \
    mon=\$!; timeout ${LIMIT:-1200} python3 -m vf_rl.launcher.main @ /tmp/runs/$name.toml --wait -s ${name//./-} > /tmp/e2e/$name.log 2>&1; \
    kill \$mon"
  ;;
scaling)
  [ -n "${MODEL_CONFIG:-}" ] && { random_model $MODEL_CONFIG; export MODEL=/tmp/rand-$MODEL_CONFIG; }
  for layout in ${LAYOUTS:-1:1 2:2 3:1}; do
    ni=${layout%%:*}; nt=${layout##*:}
    MAXTOK=${MAXTOK:-128} LIMIT=560 run scale-$ni-$nt 580 bash scripts/gpu/vf_rl_run.sh scale-$ni-$nt auto $ni $nt false \
      ${STEPS:-30} false
  done
  run table 60 python3 benchmarks/scaling.py $OUT/runs/scale-*.metrics.jsonl --json $OUT/scaling.json --plot $OUT/scaling.png
  ;;
unsloth)  # issue 29's Unsloth peer: the wheels of .u1, .u2 (scripts/gpu/build_unsloth.sh, carried as /tmp/chunks/.uN)
  # into /tmp/site-unsloth (its own trl 1.15.0 and datasets 4.3.0), then scripts/gpu/unsloth_smoke.py with that site
  # first on the path; its log in $OUT
  mkdir -p /tmp/unsloth-whl; cat /tmp/chunks/.u*/unsloth-whl.tar.* | tar xf - -C /tmp/unsloth-whl
  python3 -m pip install -q --no-index --no-deps --target /tmp/site-unsloth /tmp/unsloth-whl/whl/*.whl \
    > $OUT/unsloth-install.log 2>&1; echo "install rc=$?"; tail -n 5 $OUT/unsloth-install.log
  PYTHONPATH=/tmp/site-unsloth:$PYTHONPATH timeout 400 python3 scripts/gpu/unsloth_smoke.py --model /tmp/smol \
    > $OUT/unsloth-smoke.log 2>&1; echo "smoke rc=$?"; grep -v "^\s*$" $OUT/unsloth-smoke.log | tail -n 30
  ;;
plan)  # PLAN=scripts/gpu/plans/NAME.sh: a bash file of lanes (subshells in the background, each running parts with
  # FG=1 one after the other on its own GPUs), started in its own session after the bundle is unpacked (this call);
  # its log is /tmp/e2e/plan.log, what its parts write to $OUT goes to /tmp/e2e/out; `poll` waits for it and collects
  # The plan runs in a copy of the tree (/tmp/plan-tree), its PYTHONPATH too (env.sh sourced there): each later
  # `run` call replaces the working tree, and a process importing vf_rl at that moment fails (ModuleNotFoundError)
  mkdir -p /tmp/e2e/out; rm -rf /tmp/plan-tree; mkdir -p /tmp/plan-tree
  tar --exclude=./.git --exclude=./.venv --exclude=./.gpu --exclude='./.c[0-9]' -cf - . | tar -xf - -C /tmp/plan-tree
  (cd /tmp/plan-tree && source scripts/gpu/env.sh && OUT=/tmp/e2e/out setsid nohup bash "$PLAN" > /tmp/e2e/plan.log 2>&1 &)
  sleep 5; PART=poll bash "$0" poll
  ;;
poll)  # waits for the background runs (POLL_S seconds at most), then packs what they wrote so far into
  # $OUT/e2e.tgz (one file: $OUT brings back 8 at most) and prints the logs' tails
  # a plan runs as `bash scripts/gpu/plans/NAME.sh`: the pattern leaves out the `PLAN=scripts/gpu/plans/...` of the
  # call that started it (its shell would otherwise keep the poll waiting its whole POLL_S)
  busy="benchmarks/learning.py|vf_rl.sft.cli|trainer_step.py|vf_rl.launcher.launch|bash scripts/gpu/plans/"
  for i in $(seq 1 ${POLL_S:-560}); do pgrep -f "$busy" > /dev/null || break; sleep 1; done
  pgrep -f "$busy" > /dev/null && echo "still running"
  P=/tmp/poll; rm -rf $P; mkdir -p $P
  cp /tmp/e2e/*.log /tmp/e2e/*.json /tmp/e2e/*.png $P/ 2>/dev/null
  find /tmp/e2e -maxdepth 1 -name '*.json.gz' -size -20M -exec cp {} $P/ \;  # trainer_step.py --trace files
  [ -d /tmp/e2e/out ] && cp -r /tmp/e2e/out $P/out  # a plan's lanes' $OUT
  # the trainer's tail, after the start-up lines: the trainer's own start and wait, vLLM's timed phases
  for d in /tmp/e2e/*/; do [ "$d" = /tmp/e2e/out/ ] && continue; { grep -ah "vf-vllm ready\|after vf-rl did\|vLLM starts\|torch_compile\|took\|Capturing\|compil" \
      $d/vf-rl.log $d/vf-rl/logs/trainer.log $d/vf-rl/logs/inference.log | cut -c1-300 | head -n 40; \
      tail -n 30 $d/vf-rl/logs/trainer.log; } > $P/$(basename $d).trainer-tail.txt 2>/dev/null; \
    tail -n 40 $d/trl*/trl.log > $P/$(basename $d).trl-tail.txt 2>/dev/null; \
    cp $d/vf-rl/metrics.jsonl $P/$(basename $d).vf-rl-metrics.jsonl 2>/dev/null; \
    { head -n 300 $d/vf-rl/logs/inference.log; echo ...; tail -c 1500000 $d/vf-rl/logs/inference.log; } > $P/$(basename $d).inference.log 2>/dev/null; \
    for t in $d/trl*/; do grep -h "^learning-" $t/trl.log > $P/$(basename $d).$(basename $t)-records.txt 2>/dev/null; done; done  # progress so far
  find $P -mindepth 1 -empty -delete; tar czf $OUT/e2e.tgz -C $P .
  tail -n 25 /tmp/e2e/*.log
  ;;
esac
