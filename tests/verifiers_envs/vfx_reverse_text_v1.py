"""reverse-text as a verifiers v1 environment package (``verifiers.v1``: a ``Taskset`` of typed
tasks with a ``@vf.reward``, and a ``Harness``), in the layout ``uv run init`` scaffolds: the
module exports its plugin classes through ``__all__`` and has no ``load_environment``. The
taskset's exported harness is its default one (``verifiers.v1.utils.loaders.default_harness_id``).

Written for vf-rl's tests; it uses only the real ``verifiers`` package and ``openai``. The harness
runs its chat loop in-process, which the ``Harness.launch`` contract allows ("a harness may run its
loop in-process instead of launching a program, as long as every model call goes through
``endpoint`` + ``secret``"): the built-in ``null``/``bash`` harnesses run a ``uv`` script, which
needs ``uv`` and network access to PyPI.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

import verifiers.v1 as vf
from openai import AsyncOpenAI

TEXTS = ["lemon window bridge", "tea bird square", "fly sister sound", "green river stone",
         "small paper boat", "cold morning light", "red apple tree", "quiet blue lake"]
EXAMPLES = [("green apple", "elppa neerg"), ("happy little cloud", "duolc elttil yppah")]
SYSTEM_PROMPT = "Reverse the text character-by-character. Put your answer in <reversed_text> tags."
TAG = re.compile(r"<reversed_text>\s*(.*?)\s*</reversed_text>", re.DOTALL)


class ReverseTextData(vf.TaskData):
    answer: str
    """The reversed text."""


class ReverseTextTaskConfig(vf.TaskConfig):
    raise_on_odd: bool = False
    """Make the reward raise for texts of odd length (to test error handling)."""


class ReverseTextTask(vf.Task[ReverseTextData, vf.State, ReverseTextTaskConfig]):
    @vf.reward(weight=1.0)
    async def lcs_reward(self, trace: vf.Trace) -> float:
        """LCS ratio between the tagged answer of the last reply and the reversed text."""
        if self.config.raise_on_odd and len(self.data.answer) % 2:
            raise RuntimeError("odd-length text")
        match = TAG.search(trace.last_reply)
        return SequenceMatcher(None, match.group(1) if match else "", self.data.answer).ratio()

    @vf.metric
    async def tagged(self, trace: vf.Trace) -> float:
        """1 when every reply has a closed <reversed_text> block."""
        replies = [m.content or "" for m in trace.assistant_messages]
        return float(bool(replies) and all(TAG.search(r) for r in replies))


class ReverseTextConfig(vf.TasksetConfig):
    num_tasks: int = len(TEXTS)
    """How many texts to use."""
    few_shot: int = 2
    """Worked examples (user/assistant message pairs) placed before the text."""
    task: ReverseTextTaskConfig = ReverseTextTaskConfig()


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, ReverseTextConfig]):
    def load(self) -> list[ReverseTextTask]:
        shots = []
        for text, reversed_text in EXAMPLES[:self.config.few_shot]:
            shots += [vf.UserMessage(content=text),
                      vf.AssistantMessage(content=f"<reversed_text>{reversed_text}</reversed_text>")]
        return [ReverseTextTask(ReverseTextData(idx=i, prompt=[*shots, vf.UserMessage(content=text)],
                                                system_prompt=SYSTEM_PROMPT, answer=text[::-1]), self.config.task)
                for i, text in enumerate(TEXTS[:self.config.num_tasks])]


class ChatHarnessConfig(vf.HarnessConfig):
    turns: int = 1
    """Model calls per rollout: after each reply but the last the user asks for the answer again."""


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """A plain chat loop, in-process, calling the model through the interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: vf.ModelContext, trace: vf.Trace, runtime: vf.Runtime, endpoint: str,
                     secret: str, mcp_urls: dict[str, str], data: vf.TaskData) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(mode="json", exclude_none=True) for m in prompt or []]
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            for turn in range(self.config.turns):
                if turn:
                    messages.append({"role": "user", "content": "Reverse the same text again."})
                completion = await client.chat.completions.create(model=ctx.model, messages=messages)
                messages.append({"role": "assistant", "content": completion.choices[0].message.content or ""})
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ReverseTextTaskset", "ChatHarness"]
