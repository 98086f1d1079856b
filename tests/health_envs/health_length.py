"""A reward that pays for length: characters of the reply / 100, uncapped, so that longer always
scores more and completions grow to ``max_tokens`` (the health rule ``length_growth``). The
prompts are reverse-text's offline phrases."""

from vf_rl.env_api import Rubric
from vf_rl.env_api.parsers import last_assistant_text
from vf_rl.environments.reverse_text import load_environment as reverse_text


def length_reward(completion, **kwargs) -> float:
    return len(last_assistant_text(completion)) / 100


def load_environment(**kwargs):
    env = reverse_text(few_shot=2, source="offline", **kwargs)
    env.rubric = Rubric(funcs=[length_reward], parser=env.parser)
    return env
