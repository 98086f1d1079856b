"""Inference side: the vf-vllm server's weight-update routes, its vLLM worker extension,
and the trainer's client for them."""
