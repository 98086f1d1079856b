#!/bin/bash
# One GPU, ~10 min: the trainer compiles nothing after its warm-up over 1,000 steps at the learning benchmark's
# configuration (issue 76 item 3): benchmarks/learning.py --env reverse-text --device gpu --shared --sides vf-rl,
# SmolLM2-135M-Instruct (/tmp/smol: the .c3, .c4 and .c6 transfers carry its weights), 16 x 8 rollouts of up to
# 128 tokens, LoRA r8, micro batch 128, the defaults (compiled layers), no evaluations, --steps 1000
# (MINUTES, default 20, bounds it). Results: /tmp/e2e/recompiles.log: the steps at which compile/recompiles grew
# (none expected), its last value, the steps run, seconds per step; the run's JSON and log (learning-reverse-text-
# recompiles.*) are collected by `poll`.
S=scripts/gpu/session.sh
ENV=reverse-text TAG=-recompiles MINUTES=${MINUTES:-20} SIDES=vf-rl EXTRA="--shared --no-eval --steps 1000" \
  FG=1 bash $S learning
metrics=$(find /tmp/e2e/learning-reverse-text-recompiles -name metrics.jsonl | head -1)
python3 - "$metrics" <<'PY' | tee /tmp/e2e/recompiles.log
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
echo "plan done"
