"""The inference server, ``vf-vllm``: vLLM's OpenAI server with vf-rl's weight-update routes and
worker extension, and the clients that talk to it."""
