"""Every rollout scores ``value``: no group has reward spread, so no advantage and nothing to
learn (the health rule ``no_signal``). The prompts are reverse-text's offline phrases."""

from vf_rl.env_api import Rubric
from vf_rl.environments.reverse_text import load_environment as reverse_text


def load_environment(value: float = 0.5, **kwargs):
    env = reverse_text(few_shot=2, source="offline", **kwargs)

    def constant(completion, **kw) -> float:
        return value

    env.rubric = Rubric(funcs=[constant], parser=env.parser)
    return env
