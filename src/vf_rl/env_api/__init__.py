"""Environment core: environments, rubrics, parsers and the environment registry."""

from .environment import Environment, Rollout, SingleTurnEnv, Turn, format_prompt
from .math_rubric import BoxedParser, MathRubric, math_equal
from .multiturn import MultiTurnEnv
from .parsers import Parser, ThinkParser, XMLParser, extract_boxed_answer
from .registry import builtin_environments, load_environment
from .rubric import Rubric
from .tool_env import ToolEnv, num_tool_calls, tool_schema

__all__ = ["Environment", "SingleTurnEnv", "MultiTurnEnv", "ToolEnv", "Rollout", "Turn", "format_prompt", "Parser",
           "XMLParser", "ThinkParser", "BoxedParser", "extract_boxed_answer", "Rubric", "MathRubric", "math_equal",
           "tool_schema", "num_tool_calls", "load_environment", "builtin_environments"]
