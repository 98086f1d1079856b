"""Trainer side: RLTrainer, the orchestrator, the loss and micro-batching."""
