"""wordle: find a secret 5-letter word in at most ``max_turns`` guesses.

A native re-creation of verifiers' ``wordle`` (which wrapped TextArena's ``Wordle-v0``).
Each model turn must hold a guess in ``<guess>...</guess>`` tags; the environment replies
with the guess and one feedback letter per position, then the attempts left::

    CRANE
    G X Y X X
    You have 4 attempts left.

``G``: right letter, right place; ``Y``: in the word elsewhere; ``X``: not in the word, or
already accounted for (repeated letters are scored like the real game: greens first, then
yellows left to right while unmatched copies of that letter remain). A guess without tags,
not 5 letters, or not in the allowed list gets an explanatory reply and still uses an
attempt. The game ends on the correct guess or after ``max_turns`` attempts.

Reward, in [0, 1] (weights sum to 1):

* ``correct_answer`` (0.5): 1 if the word was found.
* ``efficiency`` (0.2): ``1 / attempts used`` if found, else 0 (the original's length bonus).
* ``partial_credit`` (0.2): ``(2 * greens + yellows) / 10`` of the last valid guess, so 1 when
  found (the original gives 0.2 per green and 0.1 per yellow, only when not found).
* ``format_reward`` (0.1): the share of model turns with a closed ``<guess>`` block.

(The original weighs 1, 1, 1 and 0.2; these weights keep the same order of importance but a
total of 1.)

Word lists, computed at load time from installed packages (no network, no shipped file):
secret words are the 5-letter words of faker's ``en_US`` lorem word list (about 185 common
words); allowed guesses are those plus the 5-letter words of the ``english-words`` package
(``web2`` list, about 10,000). Pass ``answers``/``allowed_guesses`` to use other lists.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from datasets import Dataset

from vf_rl.config.packages import require
from vf_rl.env_api import MultiTurnEnv, Rubric, XMLParser
from vf_rl.env_api.parsers import last_assistant_text

WORD_LENGTH = 5
SYSTEM_PROMPT = ("You are a competitive game player. Read the game instructions carefully and always follow "
                 "the required format: give your guess inside <guess>...</guess> tags.")
RULES = """Let's play Wordle. I have picked a secret 5-letter English word. You have {max_turns} attempts to find it.

After each guess I show one feedback letter per position:
G = the letter is in the word, in the right place
Y = the letter is in the word, but in another place
X = the letter is not in the word (or not that many times)

Each guess must be a real 5-letter English word, written inside <guess>...</guess> tags, \
for example <guess>crane</guess>."""

EXAMPLE_SECRET, EXAMPLE_GUESSES = "stone", ("crane", "shore", "stone")


def _five_letter(words) -> set[str]:
    return {w.lower() for w in words if len(w) == WORD_LENGTH and w.isascii() and w.isalpha()}


def default_answers() -> list[str]:
    """The secret words: the 5-letter words of faker's en_US lorem word list, sorted, lower case."""
    from faker.providers.lorem.en_US import Provider

    return sorted(_five_letter(Provider.word_list))


def default_allowed_guesses() -> frozenset[str]:
    """Valid guesses: ``default_answers()`` plus the 5-letter words of english-words' ``web2`` list."""
    from english_words import get_english_words_set

    return frozenset(_five_letter(get_english_words_set(["web2"], lower=True, alpha=True)) | set(default_answers()))


def score_guess(guess: str, secret: str) -> str:
    """Feedback for ``guess`` against ``secret`` (same length, lower case): one of G/Y/X per letter.

    Repeated letters follow the real game: exact matches take their letters first; each other
    position is Y while unmatched copies of its letter remain in ``secret`` (left to right), else X.
    """
    result = ["G" if g == s else "X" for g, s in zip(guess, secret)]
    unmatched = Counter(s for g, s in zip(guess, secret) if g != s)
    for i, g in enumerate(guess):
        if result[i] == "X" and unmatched[g] > 0:
            result[i] = "Y"
            unmatched[g] -= 1
    return "".join(result)


@dataclass
class Guess:
    """One model turn, judged: ``word`` (normalised, or ``None`` without tags), ``feedback``
    (``"GXYXX"``, ``None`` if invalid) and ``error`` (why it was invalid, else ``None``)."""

    word: str | None
    feedback: str | None = None
    error: str | None = None


PARSER = XMLParser(["guess"], answer_field="guess")


def judge(text: str, secret: str, allowed: frozenset[str]) -> Guess:
    """Judge one model message against the secret word."""
    word = PARSER.parse(text).guess
    if word is None:
        return Guess(None, error="No guess found. Write your guess inside <guess>...</guess> tags.")
    word = word.strip().lower()
    if len(word) != WORD_LENGTH or not word.isalpha():
        return Guess(word, error=f"Invalid guess {word!r}: a guess must be a single {WORD_LENGTH}-letter word.")
    if word not in allowed:
        return Guess(word, error=f"Invalid guess {word!r}: not in the word list.")
    return Guess(word, feedback=score_guess(word, secret))


def play(completion: list[dict], secret: str, allowed: frozenset[str]) -> list[Guess]:
    """Judge every assistant message of ``completion``, in order."""
    return [judge(m.get("content") or "", secret, allowed) for m in completion if m.get("role") == "assistant"]


def reply_text(guess: Guess, attempts_left: int) -> str:
    """The environment's reply to a judged guess, ending with the attempts left."""
    attempts = f"You have {attempts_left} attempt{'s' if attempts_left != 1 else ''} left."
    if guess.error:
        return f"{guess.error} This counts as an attempt. {attempts}"
    return f"{guess.word.upper()}\n{' '.join(guess.feedback)}\n{attempts}"


def example_game(max_turns: int, secret: str = EXAMPLE_SECRET,
                 guesses: tuple[str, ...] = EXAMPLE_GUESSES) -> list[dict]:
    """A whole example game as chat messages (rules, guesses, replies), for ``few_shot``.

    The secret is not one of the default answers, so the example leaks none.
    """
    messages = [{"role": "user", "content": RULES.format(max_turns=max_turns)}]
    for turn, word in enumerate(guesses, start=1):
        messages.append({"role": "assistant", "content": f"<guess>{word}</guess>"})
        if word != secret:
            guess = Guess(word, feedback=score_guess(word, secret))
            messages.append({"role": "user", "content": reply_text(guess, max_turns - turn)})
    return messages


class WordleEnv(MultiTurnEnv):
    """Wordle game: the row's ``answer`` is the secret word.

    Args:
        allowed: valid guesses (lower case).
        **kwargs: ``MultiTurnEnv`` arguments (``max_turns`` = attempts).
    """

    def __init__(self, allowed: frozenset[str], **kwargs):
        super().__init__(**kwargs)
        self.allowed = allowed

    async def is_completed(self, messages, state, **kwargs) -> bool:
        if state["turn"] == 0:  # the prompt's assistant messages (few-shot) are not guesses
            return False
        return judge(last_assistant_text(messages), state["answer"], self.allowed).word == state["answer"]

    async def env_response(self, messages, state, **kwargs):
        guess = judge(last_assistant_text(messages), state["answer"], self.allowed)
        return [{"role": "user", "content": reply_text(guess, self.max_turns - state["turn"])}]


def load_environment(num_train_examples: int = 2000, num_eval_examples: int = 20, max_turns: int = 6,
                     seed: int = 0, system_prompt: str | None = SYSTEM_PROMPT, few_shot: int | list[dict] = 0,
                     answers: list[str] | None = None, allowed_guesses: list[str] | None = None) -> WordleEnv:
    """Build the wordle environment.

    Args:
        num_train_examples: training games (-1: each training word once). Words are cycled,
            reshuffled on every pass, when more games than words are asked for.
        num_eval_examples: secret words held out for evaluation (never used in training).
        max_turns: attempts per game (>= 1).
        seed: shuffles the secret words; the same seed gives the same rows.
        system_prompt: the system message (``None``: none).
        few_shot: 1 to put one solved example game (``example_game``) after the system prompt,
            0 for none, or a list of chat messages. SmolLM2-135M needs 1 to answer briefly
            enough to get past its first turn with a short ``max_tokens``.
        answers: secret words (default ``default_answers()``), 5 letters each.
        allowed_guesses: valid guesses (default ``default_allowed_guesses()``); the answers are
            always allowed.

    Raises:
        ValueError: if ``max_turns < 1``, an answer is not a 5-letter word,
            ``num_eval_examples`` is negative or leaves no training word, or ``few_shot`` is
            an int other than 0 or 1.
    """
    require("faker", "faker", "envs", "the wordle environment")
    require("english_words", "english-words", "envs", "the wordle environment")
    words = default_answers() if answers is None else sorted({w.strip().lower() for w in answers})
    bad = [w for w in words if len(w) != WORD_LENGTH or not w.isalpha()]
    if bad:
        raise ValueError(f"wordle: answers must be {WORD_LENGTH}-letter words, got {bad[:5]}")
    if max_turns < 1:
        raise ValueError(f"wordle: max_turns must be >= 1, got {max_turns}")
    if isinstance(few_shot, int) and few_shot not in (0, 1):
        raise ValueError(f"wordle: few_shot must be 0, 1 or a list of messages, got {few_shot}")
    if not 0 <= num_eval_examples < len(words):
        raise ValueError(f"wordle: num_eval_examples must be in [0, {len(words) - 1}] ({len(words)} secret "
                         f"words), got {num_eval_examples}")
    allowed = default_allowed_guesses() if allowed_guesses is None else frozenset(
        w.strip().lower() for w in allowed_guesses)
    allowed = allowed | set(words)

    rng = random.Random(seed)
    words = rng.sample(words, len(words))
    eval_words, train_words = words[:num_eval_examples], words[num_eval_examples:]
    secrets = list(train_words)
    while 0 <= num_train_examples and len(secrets) < num_train_examples:
        secrets += rng.sample(train_words, len(train_words))
    if num_train_examples >= 0:
        secrets = secrets[:num_train_examples]
    question = RULES.format(max_turns=max_turns)

    def rows(secret_words: list[str]) -> Dataset:
        return Dataset.from_list([{"question": question, "answer": w, "task": "wordle"} for w in secret_words])

    def correct_answer(completion, answer, **kwargs) -> float:
        """1.0 if some guess was the secret word, else 0.0."""
        return float(any(g.word == answer for g in play(completion, answer, allowed)))

    def efficiency(completion, answer, **kwargs) -> float:
        """``1 / attempts`` (invalid ones included) if solved, else 0.0."""
        guesses = play(completion, answer, allowed)
        return 1.0 / len(guesses) if any(g.word == answer for g in guesses) else 0.0

    def partial_credit(completion, answer, **kwargs) -> float:
        """``(2 * greens + yellows) / 10`` of the last valid guess (1.0 if solved; 0.0 if none)."""
        valid = [g for g in play(completion, answer, allowed) if g.feedback]
        return (2 * valid[-1].feedback.count("G") + valid[-1].feedback.count("Y")) / 10 if valid else 0.0

    tag_format = PARSER.get_format_reward_func()

    def format_reward(completion, **kwargs) -> float:
        """Share of model turns with a closed ``<guess>...</guess>`` block."""
        turns = [m for m in completion if m.get("role") == "assistant"]
        return sum(tag_format(completion=[m]) for m in turns) / len(turns) if turns else 0.0

    rubric = Rubric(funcs=[correct_answer, efficiency, partial_credit, format_reward],
                    weights=[0.5, 0.2, 0.2, 0.1], parser=PARSER)
    return WordleEnv(allowed, max_turns=max_turns, dataset=rows(secrets),
                     eval_dataset=rows(eval_words) if eval_words else None,
                     system_prompt=system_prompt, parser=PARSER, rubric=rubric,
                     few_shot=(example_game(max_turns) if few_shot else []) if isinstance(few_shot, int) else few_shot)
