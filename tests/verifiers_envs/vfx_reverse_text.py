"""reverse-text in the style of the verifiers repository's environments/reverse_text (classic
API): ``import verifiers as vf``, an XMLParser, an LCS-ratio reward. Written for vf-rl's tests;
it uses only the real ``verifiers`` package and ``datasets``."""

from difflib import SequenceMatcher

import verifiers as vf
from datasets import Dataset

TEXTS = ["lemon window bridge", "tea bird square", "fly sister sound", "green river stone",
         "small paper boat", "cold morning light", "red apple tree", "quiet blue lake"]
EXAMPLES = [("green apple", "elppa neerg"), ("happy little cloud", "duolc elttil yppah")]


def load_environment(system_prompt: str = "Reverse the text character-by-character. "
                     "Put your answer in <reversed_text> tags.", few_shot: int = 2,
                     raise_in_reward: bool = False, **kwargs) -> vf.Environment:
    def build_dataset() -> Dataset:
        return Dataset.from_list([{"question": t, "answer": t[::-1], "info": {}, "task": "reverse-text"}
                                  for t in TEXTS])

    parser = vf.XMLParser(["reversed_text"], answer_field="reversed_text")

    def lcs_reward_func(completion, answer, **kwargs) -> float:
        response = parser.parse_answer(completion) or ""
        if raise_in_reward and len(answer) % 2:
            raise RuntimeError("odd-length text")
        return SequenceMatcher(None, response, answer).ratio()

    messages = []
    for text, rev in EXAMPLES[:few_shot]:
        messages += [{"role": "user", "content": text},
                     {"role": "assistant", "content": f"<reversed_text>{rev}</reversed_text>"}]
    rubric = vf.Rubric(funcs=[lcs_reward_func], weights=[1.0], parser=parser)
    return vf.SingleTurnEnv(dataset=build_dataset, system_prompt=system_prompt, few_shot=messages or None,
                            parser=parser, rubric=rubric)
