"""gsm8k: grade-school math word problems, answered in ``\\boxed{}``.

Reward: ``MathRubric``: 1.0 when the last ``\\boxed{...}`` of the reply equals the
reference answer (math-verify, so ``72``, ``72.0`` and ``\\$72`` all match), as in
verifiers' ``gsm8k``. A format metric ``boxed_format_reward`` (1.0 when the reply has a
``\\boxed{}`` answer at all) is always reported; it counts toward the reward only with
``format_weight > 0`` (then the reward can reach ``1 + format_weight``).

Data: the hub dataset ``openai/gsm8k`` (config ``main``; splits ``train`` and ``test``)
through ``datasets`` when it can be reached; the reference answer is the text after
``####`` with thousands separators removed, and the worked solution, in the format the
rubric reads, is kept as the ``completion`` column (what ``vf-sft`` with ``[env] id = "gsm8k"``
trains on; rollouts ignore it). Otherwise (no network, ``HF_HUB_OFFLINE=1``,
or ``source="offline"``) the OFFLINE SET shipped in ``data/``: it is SYNTHETIC, not GSM8K:
200 train and 50 eval GSM8K-style problems generated from templates written for this
project (``scripts/make_gsm8k_sample.py``), in the hub dataset's columns.

``load_gsm8k`` is also the data loader of the ``math-python`` environment.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from datasets import Dataset, load_dataset

from vf_rl.env_api import BoxedParser, MathRubric, SingleTurnEnv
from vf_rl.env_api.hub import check_source, hub_or_offline
from vf_rl.env_api.parsers import extract_boxed_answer, last_assistant_text

DATA_DIR = Path(__file__).parent / "data"
HUB_DATASET = "openai/gsm8k"
SPLITS = ("train", "test")
SYSTEM_PROMPT = ("Solve the math problem. Reason step by step, then give the final answer as a number "
                 "inside \\boxed{}, for example \\boxed{42}.")
# Example turns for ``few_shot=N``: written for this project, not drawn from any data set.
EXAMPLES = [
    ("Lena has 3 bags with 4 oranges in each bag. She eats 2 oranges. How many oranges are left?",
     "She has 3*4 = 12 oranges. After eating 2 she has 12-2 = 10 oranges.\n\\boxed{10}"),
    ("A train travels 60 miles per hour for 2 hours. How many miles does it travel?",
     "It travels 60*2 = 120 miles.\n\\boxed{120}"),
]


def extract_hash_answer(text: str) -> str:
    """The final answer of a GSM8K solution: the text after the last ``####``, stripped, with
    thousands separators (commas) removed. ``"... #### 1,200"`` -> ``"1200"``.

    Raises:
        ValueError: if ``text`` has no ``####``.
    """
    if "####" not in text:
        raise ValueError(f"gsm8k: solution has no '####' final answer: {text[-80:]!r}")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def worked_solution(text: str) -> str:
    """A GSM8K solution as the rubric wants a reply: its steps without the calculator notes
    (``<<6*4=24>>``), then ``\\boxed{answer}`` in place of the ``#### answer`` line.
    ``"4*6 = <<4*6=24>>24\\n#### 24"`` -> ``"4*6 = 24\\n\\boxed{24}"``.

    Raises:
        ValueError: if ``text`` has no ``####``.
    """
    answer = extract_hash_answer(text)
    steps = re.sub(r"<<[^>]*>>", "", text.rsplit("####", 1)[0]).strip()
    return f"{steps}\n\\boxed{{{answer}}}" if steps else f"\\boxed{{{answer}}}"


def few_shot_messages(n: int) -> list[dict]:
    """``n`` built-in example user/assistant turns (0 <= n <= 2).

    Raises:
        ValueError: ``n`` out of range.
    """
    if not 0 <= n <= len(EXAMPLES):
        raise ValueError(f"gsm8k: few_shot must be between 0 and {len(EXAMPLES)} or a list of messages, got {n}")
    messages = []
    for question, solution in EXAMPLES[:n]:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": solution}]
    return messages


def _offline(split: str) -> Dataset:
    path = DATA_DIR / ("train.jsonl" if split == "train" else "eval.jsonl")
    return Dataset.from_list([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def load_gsm8k(split: str = "train", source: str = "auto", dataset_name: str = HUB_DATASET,
               num_examples: int = -1) -> Dataset:
    """GSM8K rows with columns ``question``, ``answer`` (the final answer only, e.g. ``"72"``),
    ``completion`` (the worked solution ending in ``\\boxed{72}``, :func:`worked_solution`)
    and ``task`` (``"gsm8k"``).

    Args:
        split: ``"train"`` or ``"test"`` (offline: the 200-row train or the 50-row eval file).
        source: ``"auto"`` (hub, else the shipped synthetic sample), ``"hub"`` or ``"offline"``.
        dataset_name: hub dataset with GSM8K's ``main`` config and columns.
        num_examples: keep the first ``num_examples`` rows (-1: all).
    Raises:
        ValueError: bad ``split``, ``source`` or ``num_examples``.
        Exception: whatever ``datasets`` raises when ``source="hub"`` and the hub fails.
    """
    check_source(source, "gsm8k")
    if split not in SPLITS:
        raise ValueError(f"gsm8k: split must be one of {SPLITS}, got {split!r}")
    if num_examples < -1 or num_examples == 0:
        raise ValueError(f"gsm8k: num_examples must be -1 (all) or positive, got {num_examples}")
    ds = hub_or_offline("gsm8k", source, lambda: load_dataset(dataset_name, "main", split=split),
                        lambda: _offline(split))
    if num_examples > 0:
        ds = ds.select(range(min(num_examples, len(ds))))
    return ds.map(lambda x: {"question": x["question"], "answer": extract_hash_answer(x["answer"]),
                             "completion": worked_solution(x["answer"]), "task": "gsm8k"})


def boxed_format_reward(completion, **kwargs) -> float:
    """1.0 if the last assistant message has a non-empty ``\\boxed{}`` answer, else 0.0."""
    return 1.0 if extract_boxed_answer(last_assistant_text(completion)) else 0.0


def load_environment(system_prompt: str | None = SYSTEM_PROMPT, few_shot: int | list[dict] = 0,
                     source: str = "auto", dataset_name: str = HUB_DATASET, num_train_examples: int = -1,
                     num_eval_examples: int = -1, format_weight: float = 0.0) -> SingleTurnEnv:
    """Build the gsm8k environment.

    Args:
        system_prompt: asks for step-by-step reasoning and a ``\\boxed{}`` answer.
        few_shot: number of built-in example turns (0-2) or a list of chat messages placed
            after the system prompt.
        source: ``"auto"`` (hub, else the shipped synthetic sample), ``"hub"`` or ``"offline"``.
        dataset_name: the hub dataset (GSM8K's columns and ``main`` config).
        num_train_examples, num_eval_examples: first rows of train / test (-1: all).
        format_weight: weight of ``boxed_format_reward`` in the reward (0: metric only).
    Raises:
        ValueError: bad ``source``, ``few_shot``, example counts or a negative ``format_weight``.
    """
    if format_weight < 0:
        raise ValueError(f"gsm8k: format_weight must be >= 0, got {format_weight}")
    examples = few_shot_messages(few_shot) if isinstance(few_shot, int) else few_shot
    train = load_gsm8k("train", source, dataset_name, num_train_examples)
    test = load_gsm8k("test", source, dataset_name, num_eval_examples)
    parser = BoxedParser()
    rubric = MathRubric(funcs=[boxed_format_reward], weights=[format_weight], parser=parser)
    return SingleTurnEnv(dataset=train, eval_dataset=test, system_prompt=system_prompt, few_shot=examples,
                         parser=parser, rubric=rubric)
