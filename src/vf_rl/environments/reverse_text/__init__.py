"""reverse-text: reverse a short text character by character.

Reward: LCS ratio (``difflib.SequenceMatcher.ratio``) between the text inside the last
``<reversed_text>`` tags and the true reversal, as in verifiers' ``reverse-text``.

Data: the hub dataset ``PrimeIntellect/Reverse-Text-RL`` (through ``datasets``) when it can
be reached; otherwise the offline phrases shipped in ``data/`` (made by
``scripts/make_reverse_text_data.py``).
"""

from __future__ import annotations

import json
from difflib import SequenceMatcher
from pathlib import Path

from datasets import Dataset, load_dataset

from vf_rl.env_api import Rubric, SingleTurnEnv, XMLParser
from vf_rl.env_api.hub import hub_or_offline

DATA_DIR = Path(__file__).parent / "data"
SYSTEM_PROMPT = "Reverse the text character-by-character. Put your answer in <reversed_text> tags."
# Example turns for ``few_shot=N``: not drawn from the data, so they never leak answers.
EXAMPLES = [("green apple", "elppa neerg"), ("happy little cloud", "duolc elttil yppah"),
            ("open window", "wodniw nepo")]


def lcs_ratio(x: str, y: str) -> float:
    """Longest-common-subsequence similarity of two strings, in [0, 1] (difflib's ratio)."""
    return SequenceMatcher(None, x, y).ratio()


def few_shot_messages(n: int) -> list[dict]:
    """``n`` example user/assistant turns (0 <= n <= 3)."""
    if not 0 <= n <= len(EXAMPLES):
        raise ValueError(f"reverse-text: few_shot must be between 0 and {len(EXAMPLES)} or a list of messages, got {n}")
    messages = []
    for text, reversed_text in EXAMPLES[:n]:
        messages += [{"role": "user", "content": text},
                     {"role": "assistant", "content": f"<reversed_text>{reversed_text}</reversed_text>"}]
    return messages


def _offline(split: str) -> Dataset:
    rows = [json.loads(line) for line in (DATA_DIR / f"{split}.jsonl").read_text().splitlines()]
    return Dataset.from_list(rows)


def _load_rows(dataset_name: str, split: str, source: str) -> Dataset:
    return hub_or_offline("reverse-text", source, lambda: load_dataset(dataset_name, split=split),
                          lambda: _offline("train" if split == "train" else "eval"))


def load_environment(dataset_name: str = "PrimeIntellect/Reverse-Text-RL", dataset_split: str = "train",
                     system_prompt: str | None = SYSTEM_PROMPT, few_shot: int | list[dict] = 0,
                     source: str = "auto", num_train_examples: int = -1, num_eval_examples: int = 200,
                     max_text_len: int | None = None) -> SingleTurnEnv:
    """Build the reverse-text environment.

    Args:
        dataset_name, dataset_split: the hub dataset (column ``prompt``: the text).
        system_prompt: the original's instruction.
        few_shot: number of built-in example turns (0-3) or a list of chat messages placed
            after the system prompt. SmolLM2-135M needs 2 to score above zero.
        source: ``"auto"`` (hub, else offline), ``"hub"`` or ``"offline"``.
        num_train_examples, num_eval_examples: limits (-1: all).
        max_text_len: drop texts longer than this many characters.
    """
    def to_rows(ds: Dataset, n: int) -> Dataset:
        if max_text_len:
            ds = ds.filter(lambda x: len(x["prompt"]) <= max_text_len)
        if n > 0:
            ds = ds.select(range(min(n, len(ds))))
        return ds.map(lambda x: {"question": x["prompt"], "answer": x["prompt"][::-1], "info": {},
                                 "task": "reverse-text"}, remove_columns=["prompt"])

    train = to_rows(_load_rows(dataset_name, dataset_split, source), num_train_examples)
    try:
        eval_ds = to_rows(_load_rows(dataset_name, "test", source), num_eval_examples)
    except Exception:  # the hub dataset has no eval split: hold out the tail of train
        eval_ds = None
    parser = XMLParser(["reversed_text"], answer_field="reversed_text")

    def lcs_reward_func(completion, answer, **kwargs) -> float:
        """LCS ratio of the parsed answer and the true reversal."""
        return lcs_ratio(parser.parse_answer(completion) or "", answer)

    examples = few_shot_messages(few_shot) if isinstance(few_shot, int) else few_shot
    return SingleTurnEnv(dataset=train, eval_dataset=eval_ds, system_prompt=system_prompt,
                         few_shot=examples, parser=parser,
                         rubric=Rubric(funcs=[lcs_reward_func], weights=[1.0], parser=parser))
