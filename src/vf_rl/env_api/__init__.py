"""Environment core: environments, rubrics, parsers and the environment registry."""

from vf_rl.env_api.environment import Environment, Rollout, SingleTurnEnv, Turn, format_prompt
from vf_rl.env_api.math_rubric import BoxedParser, MathRubric, math_equal
from vf_rl.env_api.multiturn import MultiTurnEnv
from vf_rl.env_api.parsers import Parser, ThinkParser, XMLParser, extract_boxed_answer
from vf_rl.env_api.registry import builtin_environments, load_environment
from vf_rl.env_api.rubric import Rubric
from vf_rl.env_api.tool_env import ToolEnv, num_tool_calls, tool_schema

__all__ = ["Environment", "SingleTurnEnv", "MultiTurnEnv", "ToolEnv", "Rollout", "Turn", "format_prompt", "Parser",
           "XMLParser", "ThinkParser", "BoxedParser", "extract_boxed_answer", "Rubric", "MathRubric", "math_equal",
           "tool_schema", "num_tool_calls", "load_environment", "builtin_environments"]
