"""Whether Unsloth imports and trains offline on a lent GPU machine (issue 29's Unsloth peer): run by
``session.sh unsloth`` with /tmp/site-unsloth (scripts/gpu/build_unsloth.sh's wheels) first on the path.

Loads ``--model`` (a local model directory) with ``unsloth.FastLanguageModel`` in bf16, adds its LoRA
adapter (rank 16, the seven projections), runs ``--steps`` forward/backward passes of ``--batch`` x
``--length`` random tokens, and prints the versions, whether TRL's ``GRPOTrainer`` is Unsloth's patched
class, the seconds of each phase and the tokens/s of the last pass. Exit code 1 on any failure (its
traceback printed): the note of issue 29 then says exactly why Unsloth cannot be the peer.

    PYTHONPATH=/tmp/site-unsloth:$PYTHONPATH python3 scripts/gpu/unsloth_smoke.py --model /tmp/smol
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="/tmp/smol")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the lent machines
    t0 = time.time()
    try:
        import unsloth  # before transformers, trl and peft: it patches them
        from unsloth import FastLanguageModel

        t_import = time.time() - t0
        import peft
        import torch
        import transformers
        import trl

        print(f"unsloth {unsloth.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
              f"trl {trl.__version__} ({trl.__file__}), peft {peft.__version__}; import {t_import:.1f} s", flush=True)
        t = time.time()
        model, _ = FastLanguageModel.from_pretrained(model_name=a.model, max_seq_length=a.length, dtype=torch.bfloat16,
                                                     load_in_4bit=False)
        model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0, bias="none",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"],
                                                 use_gradient_checkpointing=False)
        print(f"model and adapter: {time.time() - t:.1f} s, {type(model).__name__}", flush=True)
        vocab = model.config.vocab_size
        for step in range(a.steps):
            ids = torch.randint(3, vocab, (a.batch, a.length), device="cuda")
            torch.cuda.synchronize()
            t = time.time()
            model(input_ids=ids, labels=ids).loss.backward()
            torch.cuda.synchronize()
            dt = time.time() - t
            print(f"pass {step}: {dt:.3f} s, {a.batch * a.length / dt:,.0f} tokens/s", flush=True)
        from trl import GRPOTrainer

        print(f"trl.GRPOTrainer: {GRPOTrainer.__module__}.{GRPOTrainer.__name__}", flush=True)
    except Exception:
        traceback.print_exc()
        print(f"unsloth smoke: FAILED after {time.time() - t0:.1f} s", flush=True)
        return 1
    print(f"unsloth smoke: ok in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
