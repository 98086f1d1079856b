"""A classic verifiers multi-turn environment (MultiTurnEnv subclass) written for vf-rl's tests:
guess a number; the environment answers higher/lower; a ``@vf.stop`` condition ends the game;
each example's range lives in its ``info``."""

import random

import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):
    """Replies 'higher'/'lower' to each <guess>; stops when the guess is right."""

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        guess = self.parser.parse_answer(messages)
        state["guesses"] = state.get("guesses", 0) + 1
        target = int(state["answer"])
        if guess is None or not guess.strip().isdigit():
            return [vf.UserMessage(content=f"Answer with a number from {state['info']['low']} to "
                                           f"{state['info']['high']} inside <guess>...</guess>.")]
        return [vf.UserMessage(content="higher" if int(guess) < target else "lower")]

    @vf.stop
    async def guessed(self, state: vf.State) -> bool:
        completion = state.get("completion") or []
        return bool(completion) and self.parser.parse_answer(completion) == str(state["answer"])


def load_environment(num_examples: int = 8, max_turns: int = 3, seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)

    def build_dataset() -> Dataset:
        rows = []
        for _ in range(num_examples):
            high = rng.choice([10, 20])
            rows.append({"question": f"Guess my number from 1 to {high}. Reply as <guess>N</guess>.",
                         "answer": str(rng.randint(1, high)), "info": {"low": 1, "high": high}})
        return Dataset.from_list(rows)

    parser = vf.XMLParser(["guess"], answer_field="guess")

    def solved(completion, answer, **kwargs) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    def in_range(completion, info, **kwargs) -> float:
        guess = parser.parse_answer(completion) or ""
        return 1.0 if guess.isdigit() and info["low"] <= int(guess) <= info["high"] else 0.0

    rubric = vf.Rubric(funcs=[solved, in_range], weights=[1.0, 0.2], parser=parser)
    return GuessEnv(dataset=build_dataset, parser=parser, rubric=rubric, max_turns=max_turns)
