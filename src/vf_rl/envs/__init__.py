"""Environment core: environments, rubrics, parsers and the environment registry."""

from .environment import Environment, Rollout, SingleTurnEnv, Turn, format_prompt
from .parsers import Parser, XMLParser
from .registry import builtin_environments, load_environment
from .rubric import Rubric

__all__ = ["Environment", "SingleTurnEnv", "Rollout", "Turn", "format_prompt", "Parser", "XMLParser",
           "Rubric", "load_environment", "builtin_environments"]
