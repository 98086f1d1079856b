"""The launcher, ``vf-rl``: reads the TOML file, checks it, and starts the inference server and the trainer in tmux."""
