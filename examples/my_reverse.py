from difflib import SequenceMatcher

import verifiers as vf
from datasets import Dataset


def load_environment(**kwargs) -> vf.Environment:
    def build_dataset():
        texts = ["lemon window bridge", "tea bird square", "fly sister sound", "small paper boat"]
        return Dataset.from_list([{"question": t, "answer": t[::-1]} for t in texts])

    parser = vf.XMLParser(["reversed_text"], answer_field="reversed_text")

    def lcs_reward_func(completion, answer, **kwargs) -> float:
        return SequenceMatcher(None, parser.parse_answer(completion) or "", answer).ratio()

    return vf.SingleTurnEnv(dataset=build_dataset, parser=parser,
                            system_prompt="Reverse the text character-by-character. "
                                          "Put your answer in <reversed_text> tags.",
                            rubric=vf.Rubric(funcs=[lcs_reward_func], parser=parser))
