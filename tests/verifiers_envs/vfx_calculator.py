"""A classic verifiers tool environment (vf.ToolEnv) written for vf-rl's tests: the model may
call ``add`` to sum two integers."""

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def load_environment(max_turns: int = 3) -> vf.Environment:
    pairs = [(2, 3), (10, 7), (41, 1), (5, 5), (8, 13), (6, 9)]
    dataset = Dataset.from_list([{"question": f"What is {a} + {b}? Use the add tool, then give the number.",
                                  "answer": str(a + b)} for a, b in pairs])

    def correct(completion, answer, **kwargs) -> float:
        text = str(completion[-1].get("content") or "") if completion else ""
        return 1.0 if answer in text else 0.0

    rubric = vf.Rubric(funcs=[correct])
    return vf.ToolEnv(dataset=dataset, tools=[add], rubric=rubric, max_turns=max_turns)
