"""MathRubric: is the model's final answer mathematically equal to the reference?"""

from __future__ import annotations

from typing import Any

from .parsers import Parser, extract_boxed_answer, last_assistant_text
from .rubric import Rubric


def math_equal(predicted: str | None, reference: str) -> bool:
    """Symbolic equality with HuggingFace's ``math-verify`` (LaTeX and plain expressions;
    ``1/2 == 0.5``, ``\\frac{1}{2} == 0.5``). ``False`` for a missing prediction or an error."""
    if predicted is None or not str(predicted).strip():
        return False
    from math_verify import parse, verify

    try:
        gold = parse(f"${reference}$") or parse(reference)
        answer = parse(f"${predicted}$") or parse(str(predicted))
        return bool(gold and answer and verify(gold, answer))
    except Exception:
        return False


class MathRubric(Rubric):
    """Reward 1 when the parsed answer (default: the last ``\\boxed{}``) equals ``answer``.

    Args:
        parser: extracts the answer; default takes the last ``\\boxed{...}`` of the last
            assistant message.
    """

    def __init__(self, funcs=None, weights=None, parser: Parser | None = None):
        super().__init__(funcs=funcs, weights=weights, parser=parser or BoxedParser())
        self.add_reward_func(self.correct_answer_reward_func)

    def correct_answer_reward_func(self, completion, answer, **kwargs: Any) -> float:
        """1.0 if the parsed answer equals the reference answer (math-verify), else 0.0."""
        return 1.0 if math_equal(self.parser.parse_answer(completion), str(answer)) else 0.0


class BoxedParser(Parser):
    """The answer is the last ``\\boxed{...}`` of the last assistant message."""

    def parse(self, text: str) -> str | None:
        return extract_boxed_answer(text)

    def parse_answer(self, completion) -> str | None:
        return self.parse(last_assistant_text(completion))

    def format_answer(self, answer: str) -> str:
        """``\\boxed{answer}``."""
        return f"\\boxed{{{answer}}}"
