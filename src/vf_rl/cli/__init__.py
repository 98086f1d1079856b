"""Command-line entry points: vf-rl (launcher), vf-train, vf-vllm."""
