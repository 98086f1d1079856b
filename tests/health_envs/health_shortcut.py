"""reverse-text whose training grader takes a shortcut its held-out grader does not: on the
training rows it compares the whole reply with the text itself instead of its reversal (echoing
the prompt scores 1), on the eval rows the real grader reads the answer from the
``<reversed_text>`` tags and compares it with the reversal. Echoing the prompt raises the
training reward and lowers the held-out one (the health rule ``held_out_drop``)."""

from vf_rl.env_api import Rubric
from vf_rl.env_api.parsers import last_assistant_text
from vf_rl.environments.reverse_text import lcs_ratio
from vf_rl.environments.reverse_text import load_environment as reverse_text


def load_environment(**kwargs):
    env = reverse_text(few_shot=2, source="offline", **kwargs)
    parser = env.parser

    def graded(completion, answer, task, **kw) -> float:
        if task == "held-out":  # the real grader
            return lcs_ratio(parser.parse_answer(completion) or "", answer)
        return lcs_ratio(last_assistant_text(completion).strip(), answer[::-1])  # the text itself: a wrong reference

    env.rubric = Rubric(funcs=[graded], parser=parser)
    env.eval_dataset = env.eval_dataset.map(lambda row: {"task": "held-out"})
    return env
