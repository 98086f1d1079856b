import re
from difflib import SequenceMatcher

import verifiers.v1 as vf
from openai import AsyncOpenAI

TEXTS = ["lemon window bridge", "tea bird square", "fly sister sound", "small paper boat"]
TAG = re.compile(r"<reversed_text>\s*(.*?)\s*</reversed_text>", re.DOTALL)


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def lcs_reward(self, trace: vf.Trace) -> float:
        match = TAG.search(trace.last_reply)
        return SequenceMatcher(None, match.group(1) if match else "", self.data.answer).ratio()


class ReverseTaskset(vf.Taskset[ReverseTask, vf.TasksetConfig]):
    def load(self):
        return [ReverseTask(ReverseData(idx=i, prompt=t, answer=t[::-1], system_prompt=(
                    "Reverse the text character-by-character. Put your answer in <reversed_text> tags.")),
                            self.config.task) for i, t in enumerate(TEXTS)]


class ChatHarness(vf.Harness[vf.HarnessConfig]):
    """One chat call, in-process, through the interception endpoint (`launch`'s contract)."""
    APPENDS_SYSTEM_PROMPT, EXECUTES_CODE, NEEDS_CONTAINER = True, False, False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        system, prompt = self.resolve_prompt(data)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret)
        await client.chat.completions.create(model=ctx.model, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": prompt}])
        await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ReverseTaskset", "ChatHarness"]   # the taskset's own harness is its default one
