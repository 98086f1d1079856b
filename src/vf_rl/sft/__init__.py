"""Supervised warm-up, ``vf-sft``: fine-tuning on an environment's answers before RL."""
