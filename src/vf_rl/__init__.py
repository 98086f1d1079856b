"""vf-rl: asynchronous RL for language models on one machine.

    from vf_rl import RLTrainer, RLConfig, load_environment

``RLTrainer`` and ``RLConfig`` import torch and transformers; they are loaded on first use
so that the launcher (``vf-rl``) starts instantly.
"""

from vf_rl.config.packages import hide_mismatched_companions

hide_mismatched_companions()  # before anything imports transformers: a CUDA torchvision beside CPU torch breaks it

from vf_rl.env_api import (  # noqa: E402  (after the guard above)
    BoxedParser,
    Environment,
    MathRubric,
    MultiTurnEnv,
    Parser,
    Rollout,
    Rubric,
    SingleTurnEnv,
    ThinkParser,
    ToolEnv,
    Turn,
    XMLParser,
    builtin_environments,
    extract_boxed_answer,
    load_environment,
    tool_schema,
)

__version__ = "0.1.0"
__all__ = ["RLTrainer", "RLConfig", "load_environment", "builtin_environments", "Environment", "SingleTurnEnv",
           "MultiTurnEnv", "ToolEnv", "Rollout", "Turn", "Rubric", "MathRubric", "Parser", "XMLParser", "ThinkParser",
           "BoxedParser", "extract_boxed_answer", "tool_schema"]


def __getattr__(name: str):
    if name == "RLTrainer":
        from vf_rl.trainer.trainer import RLTrainer

        return RLTrainer
    if name == "RLConfig":
        from vf_rl.config.rl_config import RLConfig

        return RLConfig
    raise AttributeError(f"module 'vf_rl' has no attribute {name!r}")
