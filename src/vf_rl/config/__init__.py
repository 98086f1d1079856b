"""Configuration: the vf-rl TOML schema (light, no torch) and RLConfig (the trainer's arguments)."""
