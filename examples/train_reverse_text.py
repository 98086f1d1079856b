"""Train from Python against an already running vf-vllm server (docs/python.md, the README).

    vf-vllm --model ~/.cache/vf-rl/models/SmolLM2-135M-Instruct --enforce-eager --max-model-len 512 &
    python examples/train_reverse_text.py

``~/.cache/vf-rl/models/SmolLM2-135M-Instruct`` is the model the CPU demo prepares
(``vf-rl prepare-model``); a hub id works the same where the hub can be reached.
"""

from pathlib import Path

from vf_rl import RLConfig, RLTrainer, load_environment

model = str(Path("~/.cache/vf-rl/models/SmolLM2-135M-Instruct").expanduser())   # or a hub id
env = load_environment("reverse-text", few_shot=2)
args = RLConfig(run_name="rt", batch_size=32, rollouts_per_example=8, micro_batch_size=8,
                max_tokens=24, max_seq_len=256, learning_rate=5e-4, max_steps=30)
RLTrainer(model=model, env=env, args=args).train()   # a vf-vllm server must be up
