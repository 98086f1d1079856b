"""alphabet-sort: keep a list of names sorted alphabetically over several turns.

A re-creation of kalomaze's ``alphabet-sort`` from verifiers. Each example is a session of
1 to ``max_turns`` model turns, sorted by FIRST or by LAST name (chosen per example):

* turn 1: the user gives a few names; the model answers them sorted, one per line, inside
  ``<alphabetical_sorted>`` tags;
* each later turn (the environment's reply): new names are added; the model answers the
  combined sorted list inside ``<combined_alphabetical_sorted>`` tags, with every name new
  in that turn marked ``// new name!``.

Names are written as in the original dataset, first and last name joined without a space
(``"VladimirDrinfeld"``): the first name runs up to the second capital letter.

Reward, in [0, 1]: for each model turn, ``difflib.SequenceMatcher`` ratio between the
lower-cased lines of the last tag block in that turn and the expected lines; a turn with no
(closed) tags, or not reached, scores 0. With ``power_per_turn`` each turn's ratio is raised
to ``similarity_power`` and the results averaged; otherwise the average is raised.

Data: the author lists of the hub dataset ``kalomaze/alphabetic-arxiv-authors-it1``
(column ``names``) when it can be reached; otherwise names made by the ``faker`` package
(``en_US`` locale, seeded with ``seed``; the exact names depend on the installed faker
version). The whole plan of an example (names per turn, sort key, expected answers and the
follow-up messages) is stored in the row's ``info``, so a rollout depends only on its row.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from difflib import SequenceMatcher

from datasets import Dataset, load_dataset

from vf_rl.config.packages import require
from vf_rl.env_api import MultiTurnEnv, Rubric
from vf_rl.env_api.hub import check_source, hub_or_offline

FIRST_TAG = "alphabetical_sorted"
COMBINED_TAG = "combined_alphabetical_sorted"
NEW_MARK = "// new name!"
OFFLINE_TRAIN_EXAMPLES = 2000
EXAMPLE_NAMES = ("GraceHopper", "AlanTuring", "AdaLovelace", "EmmyNoether")


def split_name(name: str) -> tuple[str, str]:
    """``"VladimirDrinfeld"`` -> ``("Vladimir", "Drinfeld")``: split before the second capital.

    A name with no second capital is all first name (last name ``""``), as in the original.
    """
    for i in range(1, len(name)):
        if name[i].isupper():
            return name[:i], name[i:]
    return name, ""


def sort_names(names: Iterable[str], by: str) -> list[str]:
    """Names sorted case-insensitively by ``by`` (``"first"`` or ``"last"``) name, ties by the full name."""
    part = 0 if by == "first" else 1
    return sorted(names, key=lambda n: (split_name(n)[part].casefold(), n.casefold()))


def _template(tag: str, lines: int, new_from: int | None = None) -> str:
    """Example answer block with placeholder names (their count says nothing about the answer)."""
    rows = [f"Name{i}" + (f" {NEW_MARK}" if new_from is not None and i >= new_from else "")
            for i in range(1, lines + 1)]
    return f"<{tag}>\n" + "\n".join(rows) + f"\n</{tag}>"


def plan_turns(rng: random.Random, min_turns: int, max_turns: int, min_names_per_turn: int,
               max_names_per_turn: int) -> list[int]:
    """Number of names added at each turn: ``randint(min_turns, max_turns)`` counts, each
    ``randint(min_names_per_turn, max_names_per_turn)``."""
    num_turns = rng.randint(min_turns, max_turns)
    return [rng.randint(min_names_per_turn, max_names_per_turn) for _ in range(num_turns)]


def build_example(names: list[str], counts: list[int], rng: random.Random, min_names_per_turn: int,
                  max_names_per_turn: int) -> dict | None:
    """Plan one session from distinct ``names`` and the per-turn ``counts`` (``plan_turns``).

    Returns ``None`` if there are fewer names than ``sum(counts)``; otherwise a dataset row:
    ``question`` (the first user message), ``answer`` (the final expected list, one name per
    line), ``task`` and ``info`` with ``num_turns``, ``sort_by`` (``"first"``/``"last"``),
    ``turn_names`` (the names added at each turn), ``ground_truths`` (each turn's expected
    lines) and ``follow_ups`` (the user messages of turns 2..num_turns).
    """
    if len(names) < sum(counts):
        return None
    turn_names, start = [], 0
    for count in counts:
        turn_names.append(names[start:start + count])
        start += count
    sort_by = rng.choice(["first", "last"])
    key = sort_by.upper()

    ground_truths, seen, messages = [], [], []
    for turn, new in enumerate(turn_names):
        seen += new
        shown = rng.sample(new, len(new))  # shuffled copy
        if turn == 0:
            ground_truths.append(sort_names(seen, sort_by))
            template = _template(FIRST_TAG, rng.randint(min_names_per_turn, max_names_per_turn))
            messages.append(f"Sort these names alphabetically by {key} name: {', '.join(shown)}\n\n"
                            f"Write one name per line, exactly in this format:\n{template}")
        else:
            ground_truths.append([f"{n} {NEW_MARK}" if n in new else n for n in sort_names(seen, sort_by)])
            lines = rng.randint(min_names_per_turn, len(seen))
            template = _template(COMBINED_TAG, lines, new_from=rng.randint(1, lines))
            messages.append(f"Here are more names: {', '.join(shown)}\n\n"
                            f"Now sort ALL the names so far (the earlier ones and these) alphabetically by "
                            f"{key} name. Mark each name that is new in this message with `{NEW_MARK}` at the "
                            f"end of its line. Use exactly this format:\n{template}")
    return {"question": messages[0], "answer": "\n".join(ground_truths[-1]), "task": "alphabet-sort",
            "info": {"num_turns": len(counts), "sort_by": sort_by, "turn_names": turn_names,
                     "ground_truths": ground_truths, "follow_ups": messages[1:]}}


def example_session(names: tuple[str, ...] = EXAMPLE_NAMES, counts: tuple[int, ...] = (2, 2),
                    seed: int = 0) -> list[dict]:
    """A whole example session as chat messages (questions and correct answers), for ``few_shot``.

    Built by ``build_example`` from fixed names (pioneers of computing), not from the
    dataset, with the same message formats as the real sessions.
    """
    row = build_example(list(names), list(counts), random.Random(seed), 1, max(counts))
    info, messages = row["info"], []
    for turn, (question, lines) in enumerate(zip([row["question"], *info["follow_ups"]], info["ground_truths"])):
        tag = FIRST_TAG if turn == 0 else COMBINED_TAG
        body = "\n".join(lines)
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": f"<{tag}>\n{body}\n</{tag}>"}]
    return messages


def _unique(names: Iterable[str]) -> list[str]:
    """Names with spaces removed (``"Vladimir Drinfeld"`` -> ``"VladimirDrinfeld"``), duplicates dropped."""
    return list(dict.fromkeys(n.replace(" ", "") for n in names if n and n.strip()))


def _hub_names(dataset_name: str, split: str) -> Callable[[int], list[str] | None]:
    """Supplier of the hub's author lists, one per call (``None`` when exhausted)."""
    entries = iter(load_dataset(dataset_name, split=split))  # loaded now, so that failures surface here

    def take(n: int) -> list[str] | None:  # the whole next author list; the caller checks its length
        entry = next(entries, None)
        return None if entry is None else _unique(entry["names"])

    return take


def _faker_names(seed: int) -> Callable[[int], list[str]]:
    """Supplier of ``n`` distinct ``FirstLast`` names per call from faker (en_US, seeded)."""
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(seed)

    def take(n: int) -> list[str]:
        names: dict[str, None] = {}
        while len(names) < n:
            name = fake.first_name() + fake.last_name()
            if re.fullmatch(r"[A-Z][a-z]+[A-Z][a-z]+", name):
                names[name] = None
        return list(names)

    return take


def _name_source(dataset_name: str, split: str, source: str, seed: int) -> tuple[Callable, bool]:
    """``(supplier, from_hub)``: the hub's author lists, else faker names (see the module docstring)."""
    return hub_or_offline("alphabet-sort", source, lambda: (_hub_names(dataset_name, split), True),
                          lambda: (_faker_names(seed), False))


def tag_lines(text: str, tag: str) -> list[str] | None:
    """Non-empty stripped lines of the last closed ``<tag>...</tag>`` block of ``text``, or ``None``."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    if not blocks:
        return None
    return [line.strip() for line in blocks[-1].splitlines() if line.strip()]


def similarity(predicted: list[str], expected: list[str]) -> float:
    """``SequenceMatcher`` ratio, in [0, 1], of the lower-cased lines joined by newlines (0 if either is empty)."""
    if not predicted or not expected:
        return 0.0
    return SequenceMatcher(None, "\n".join(p.lower() for p in predicted),
                           "\n".join(e.lower() for e in expected)).ratio()


def turn_similarities(completion: list[dict], info: dict) -> list[float]:
    """Unpowered similarity of each of the ``info["num_turns"]`` turns (0 for a turn not reached or without tags)."""
    replies = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
    scores = []
    for turn, expected in enumerate(info["ground_truths"]):
        lines = tag_lines(replies[turn], FIRST_TAG if turn == 0 else COMBINED_TAG) if turn < len(replies) else None
        scores.append(similarity(lines or [], expected))
    return scores


class AlphabetSortEnv(MultiTurnEnv):
    """Multi-turn sorting: the row's ``info`` plans the session (see ``build_example``)."""

    async def is_completed(self, messages, state, **kwargs) -> bool:
        return state["turn"] >= state["info"]["num_turns"]

    async def env_response(self, messages, state, **kwargs):
        follow_ups = state["info"]["follow_ups"]
        return [{"role": "user", "content": follow_ups[state["turn"] - 1]}]


def load_environment(max_turns: int = 3, min_turns: int = 1, min_names_per_turn: int = 1,
                     max_names_per_turn: int = 5, similarity_power: float = 4, power_per_turn: bool = True,
                     dataset_name: str = "kalomaze/alphabetic-arxiv-authors-it1", dataset_split: str = "train",
                     seed: int = 1337420, source: str = "auto", num_train_examples: int = -1,
                     num_eval_examples: int = 200, system_prompt: str | None = None,
                     few_shot: int | list[dict] = 0) -> AlphabetSortEnv:
    """Build the alphabet-sort environment.

    Args:
        max_turns, min_turns: model turns per example, drawn uniformly in ``[min_turns, max_turns]``.
        min_names_per_turn, max_names_per_turn: names added per turn, drawn uniformly.
        similarity_power: exponent applied to the similarity ratio (> 0; higher favours exact answers).
        power_per_turn: raise each turn's ratio to the power and average (True), or raise the
            average (False).
        dataset_name, dataset_split: the hub dataset of author lists (column ``names``).
        seed: seeds the session plans and the faker names; the same seed gives the same rows.
        source: ``"auto"`` (hub, else faker names), ``"hub"`` or ``"offline"`` (faker).
        num_train_examples: training rows (-1: every usable hub row, or 2000 offline).
        num_eval_examples: rows held out for evaluation, taken before the training rows
            (0: no eval set).
        system_prompt: optional system message (the original has none).
        few_shot: 1 to put one solved two-turn example session (``example_session``) before
            the question, 0 for none (the original), or a list of chat messages. Helps
            SmolLM2-135M answer briefly enough to reach later turns with a short ``max_tokens``.

    Raises:
        ValueError: on inconsistent turn/name counts, a non-positive ``similarity_power``, a
            negative ``num_eval_examples``, an unknown ``source``, ``few_shot`` an int other
            than 0 or 1, or no usable rows.
        Exception: whatever ``datasets.load_dataset`` raises, with ``source="hub"``.
    """
    require("faker", "faker", "envs", "the alphabet-sort environment")
    if not 1 <= min_turns <= max_turns:
        raise ValueError(f"alphabet-sort: need 1 <= min_turns <= max_turns, got min_turns={min_turns}, "
                         f"max_turns={max_turns}")
    if not 1 <= min_names_per_turn <= max_names_per_turn:
        raise ValueError(f"alphabet-sort: need 1 <= min_names_per_turn <= max_names_per_turn, got "
                         f"{min_names_per_turn} and {max_names_per_turn}")
    if similarity_power <= 0:
        raise ValueError(f"alphabet-sort: similarity_power must be > 0, got {similarity_power}")
    if num_eval_examples < 0:
        raise ValueError(f"alphabet-sort: num_eval_examples must be >= 0, got {num_eval_examples}")
    check_source(source, "alphabet-sort")
    if isinstance(few_shot, int) and few_shot not in (0, 1):
        raise ValueError(f"alphabet-sort: few_shot must be 0, 1 or a list of messages, got {few_shot}")

    take_names, from_hub = _name_source(dataset_name, dataset_split, source, seed)
    n_train = num_train_examples if num_train_examples >= 0 or from_hub else OFFLINE_TRAIN_EXAMPLES
    wanted = n_train + num_eval_examples if n_train >= 0 else None
    rng, rows = random.Random(seed), []
    while wanted is None or len(rows) < wanted:
        counts = plan_turns(rng, min_turns, max_turns, min_names_per_turn, max_names_per_turn)
        names = take_names(sum(counts))
        if names is None:  # hub rows exhausted
            break
        row = build_example(names, counts, rng, min_names_per_turn, max_names_per_turn)
        if row is not None:
            rows.append(row)
    if len(rows) <= num_eval_examples:
        raise ValueError(f"alphabet-sort: only {len(rows)} usable rows, need more than num_eval_examples="
                         f"{num_eval_examples}")
    eval_ds = Dataset.from_list(rows[:num_eval_examples]) if num_eval_examples else None
    train = Dataset.from_list(rows[num_eval_examples:])

    def sorting_reward(completion, info, **kwargs) -> float:
        """Mean over turns of similarity**power (or mean similarity, then **power), in [0, 1]."""
        scores = turn_similarities(completion, info)
        if power_per_turn:
            return sum(s ** similarity_power for s in scores) / len(scores)
        return (sum(scores) / len(scores)) ** similarity_power

    examples = (example_session() if few_shot else []) if isinstance(few_shot, int) else few_shot
    return AlphabetSortEnv(max_turns=max_turns, dataset=train, eval_dataset=eval_ds, system_prompt=system_prompt,
                           few_shot=examples, rubric=Rubric(funcs=[sorting_reward], weights=[1.0]))
