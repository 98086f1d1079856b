"""The trainer process, ``vf-train``: RLTrainer on transformers' Trainer, the training step, weight
pushes and checkpoints; what makes the step fast lives under ``speed/``."""
