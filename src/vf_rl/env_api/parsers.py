"""Parsers: pull structured fields out of model completions.

A completion is either a string or a list of chat messages (``{"role", "content"}``);
``parse_answer`` always looks at the last assistant message.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any, Callable

Messages = list[dict[str, Any]]


def last_assistant_text(completion: str | Messages) -> str:
    """Return the text of the last assistant message of ``completion`` ("" if none)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


class Parser:
    """Identity parser: the answer is the whole last assistant message, stripped."""

    def parse(self, text: str) -> Any:
        return text.strip()

    def parse_answer(self, completion: str | Messages) -> str | None:
        return self.parse(last_assistant_text(completion))

    def format_answer(self, answer: str) -> str:
        """A reply from which ``parse_answer`` reads ``answer`` (supervised warm-up data, ``vf-sft``)."""
        return answer

    def get_format_reward_func(self) -> Callable[..., float]:
        def format_reward(completion, **kwargs) -> float:
            return 1.0 if last_assistant_text(completion).strip() else 0.0

        return format_reward


class XMLParser(Parser):
    """Parse ``<field>...</field>`` blocks, as verifiers' ``XMLParser`` does.

    Args:
        fields: tag names, e.g. ``["think", "answer"]``. An entry may be a tuple of
            alternative names; the first is canonical.
        answer_field: the field ``parse_answer`` returns (default: the last field).

    ``parse(text)`` returns a namespace with one attribute per canonical field, holding the
    content of the *last* occurrence of that tag (stripped), or ``None`` when absent. An
    unclosed final tag (generation cut off) still counts up to the end of the text.
    """

    def __init__(self, fields: list[str | tuple[str, ...]], answer_field: str | None = None):
        if not fields:
            raise ValueError("XMLParser needs at least one field name")
        self.fields: list[tuple[str, ...]] = [(f,) if isinstance(f, str) else tuple(f) for f in fields]
        self.answer_field = answer_field or self.fields[-1][0]

    def parse(self, text: str) -> SimpleNamespace:
        result = {}
        for names in self.fields:
            value = None
            for name in names:
                closed = re.findall(rf"<{name}>\s*(.*?)\s*</{name}>", text, flags=re.DOTALL)
                if closed:
                    value = closed[-1]
                    break
                unclosed = re.search(rf"<{name}>\s*(.*)$", text, flags=re.DOTALL)
                if unclosed:
                    value = unclosed.group(1).strip()
                    break
            result[names[0]] = value
        return SimpleNamespace(**result)

    def parse_answer(self, completion: str | Messages) -> str | None:
        return getattr(self.parse(last_assistant_text(completion)), self.answer_field)

    def format_answer(self, answer: str) -> str:
        """``<answer_field>answer</answer_field>``."""
        return f"<{self.answer_field}>{answer}</{self.answer_field}>"

    def get_format_str(self) -> str:
        """The format description to put in a system prompt."""
        return "\n".join(f"<{names[0]}>\n...\n</{names[0]}>" for names in self.fields)

    def get_format_reward_func(self) -> Callable[..., float]:
        """Reward in [0, 1]: the share of fields present (properly closed) in the last message."""

        def format_reward(completion, **kwargs) -> float:
            text = last_assistant_text(completion)
            present = sum(
                any(re.search(rf"<{n}>.*?</{n}>", text, flags=re.DOTALL) for n in names)
                for names in self.fields
            )
            return present / len(self.fields)

        return format_reward


class ThinkParser(Parser):
    """For reasoning models: the answer is what follows the last ``</think>``.

    Args:
        extract_fn: applied to the text after ``</think>`` (e.g. a boxed-answer extractor).
    A message without ``</think>`` parses to ``None`` when it has a ``<think>`` (cut off while
    thinking), else the whole text.
    """

    def __init__(self, extract_fn: Callable[[str], Any] | None = None):
        self.extract_fn = extract_fn or (lambda text: text.strip())

    def parse(self, text: str) -> Any:
        if "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        elif "<think>" in text:
            return None
        return self.extract_fn(text)

    def get_format_reward_func(self) -> Callable[..., float]:
        def think_format(completion, **kwargs) -> float:
            text = last_assistant_text(completion).strip()
            return 1.0 if re.match(r"^<think>.*?</think>\s*\S", text, flags=re.DOTALL) else 0.0

        return think_format


def extract_boxed_answer(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (nested braces allowed), or ``None``."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            if depth == 0:
                return text[i:j].strip()
            depth -= 1
    return None
