"""A user-defined multi-turn environment: guess a number between 1 and 100.

Use it by id from any directory on the Python path (or an installed package):

    vf-rl eval guess-number -m MODEL -n 10 -r 4       # module name guess_number
    [env]
    id = "you/guess-number"                           # in a vf-rl config; the owner/ prefix is dropped
"""

import random

from datasets import Dataset

import vf_rl as vf

SYSTEM_PROMPT = ("I am thinking of a whole number between 1 and 100. Guess it. Answer with your guess inside "
                 "<guess>...</guess>. After each guess I say 'higher' or 'lower'.")


class GuessNumberEnv(vf.MultiTurnEnv):
    """The environment answers each guess with 'higher'/'lower' until the number is found."""

    def env_response(self, messages, state, **kwargs):
        guess = self.parser.parse_answer(messages)
        state.setdefault("guesses", []).append(guess)
        target = int(state["answer"])
        if guess is None or not guess.strip().lstrip("-").isdigit():
            return [{"role": "user", "content": "Please answer with a number inside <guess>...</guess>."}]
        hint = "higher" if int(guess) < target else "lower"
        return [{"role": "user", "content": f"{guess} is wrong: {hint}."}]

    def is_completed(self, messages, state, **kwargs):
        if not messages or messages[-1]["role"] != "assistant":
            return False
        return self.parser.parse_answer(messages) == str(state["answer"])


def load_environment(num_examples: int = 200, max_turns: int = 7, seed: int = 0) -> vf.Environment:
    rng = random.Random(seed)
    rows = [{"question": "Your first guess?", "answer": str(rng.randint(1, 100))} for _ in range(num_examples)]
    parser = vf.XMLParser(["guess"], answer_field="guess")

    def solved(completion, answer, **kwargs) -> float:
        """1 if the last guess is the number."""
        return 1.0 if parser.parse_answer(completion) == str(answer) else 0.0

    def fewer_turns(completion, answer, state, **kwargs) -> float:
        """Bonus for solving quickly: 1 / number of guesses, if solved."""
        return solved(completion, answer) / max(len(state.get("guesses", [])) + 1, 1)

    rubric = vf.Rubric(funcs=[solved, fewer_turns], weights=[1.0, 0.5])
    dataset = Dataset.from_list(rows)
    return GuessNumberEnv(dataset=dataset, system_prompt=SYSTEM_PROMPT, parser=parser, rubric=rubric,
                          max_turns=max_turns)
