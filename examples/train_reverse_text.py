"""Train from Python against an already running vf-vllm server.

    vf-vllm --model ~/.cache/vf-rl/models/SmolLM2-135M-Instruct --enforce-eager --max-model-len 512 &
    python examples/train_reverse_text.py
"""

from pathlib import Path

from vf_rl import RLConfig, RLTrainer, load_environment

MODEL = str(Path("~/.cache/vf-rl/models/SmolLM2-135M-Instruct").expanduser())

env = load_environment("reverse-text", few_shot=2)
args = RLConfig(run_name="reverse-text-python", batch_size=32, rollouts_per_example=8, micro_batch_size=8,
                max_tokens=24, max_seq_len=256, learning_rate=5e-4, max_steps=10)
RLTrainer(model=MODEL, env=env, args=args).train()
