"""vf-train: the trainer of a vf-rl config, standalone.

    vf-train @ config.toml

Loads ``[env]``, builds ``RLConfig(**[trainer.args])`` and ``RLTrainer(model, env, args)``,
and trains. The vf-vllm server named by ``vllm_server_host``/``vllm_server_port`` must be
serving ``model``.
"""

from __future__ import annotations

import sys

from vf_rl.config.schema import ConfigError, load_config, parse_at_args

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config_path, _ = parse_at_args(argv, "vf-train")
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"vf-train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    import torch

    from vf_rl import RLConfig, RLTrainer, load_environment

    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, torch.get_num_threads()))
    try:
        args = RLConfig(**config.trainer.args)
        print(f"Loading environment {config.env.id}...", flush=True)
        env = load_environment(config.env.id, **config.env.args)
    except (TypeError, ValueError) as exc:
        print(f"vf-train: error: {config_path}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"Loading model {config.model}...", flush=True)
    trainer = RLTrainer(model=config.model, env=env, args=args)
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
