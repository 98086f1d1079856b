"""The orchestrator: batches of scored rollouts generated through the environment, one step ahead
of the trainer, in a process of its own."""
