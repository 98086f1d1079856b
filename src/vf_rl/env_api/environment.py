"""Environments: a dataset, rollout logic against an OpenAI-compatible server, and a rubric.

The trainer needs exactly three things from an environment: its training rows
(``get_dataset``), ``generate`` (rollouts for a list of rows, with the token ids and
sampling log-probs the server reported), and the scores that ``generate`` attaches.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable

from vf_rl.config.args import SamplingArgs  # noqa: F401  (environments build theirs)
from vf_rl.env_api.parsers import Messages, Parser
from vf_rl.env_api.rollout import (  # noqa: F401  (the environment API's names)
    Rollout,
    Turn,
    merge_sampling_args,
    post_json,
    prompt_messages,
    row_info,
    set_error,
)
from vf_rl.env_api.rubric import Rubric

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)


def format_prompt(question: str, system_prompt: str | None = None,
                  few_shot: Messages | None = None) -> Messages:
    """Chat prompt: system prompt first, then few-shot example turns, then the question."""
    messages: Messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.extend(dict(m) for m in few_shot or [])
    messages.append({"role": "user", "content": question})
    return messages


class Environment:
    """Base environment.

    Args:
        dataset: training rows with ``prompt`` (chat messages) or ``question`` (str), and
            optionally ``answer``, ``info``, ``task``.
        eval_dataset: evaluation rows, same columns.
        system_prompt: put first in every prompt built from ``question``.
        few_shot: example messages placed after the system prompt (verifiers' ``few_shot``).
        parser: used by reward functions (``parser=``) and ``parse_answer``.
        rubric: scores each rollout; ``rubric.parser`` defaults to ``parser``.
        sampling_args: the environment's sampling defaults (``max_tokens``, ``extra_body``...):
            they replace vf-rl's built-in defaults but not what the user set
            (:func:`merge_sampling_args`).
    """

    def __init__(self, dataset: Dataset | None = None, eval_dataset: Dataset | None = None,
                 system_prompt: str | None = None, few_shot: Messages | None = None,
                 parser: Parser | None = None, rubric: Rubric | None = None,
                 sampling_args: dict | None = None, **kwargs: Any):
        if dataset is None and eval_dataset is None:
            raise ValueError("an environment needs a dataset or an eval_dataset")
        self.system_prompt = system_prompt
        self.few_shot = few_shot
        self.parser = parser or Parser()
        self.rubric = rubric or Rubric(parser=self.parser)
        if rubric is not None and type(rubric.parser) is Parser:
            rubric.parser = self.parser
        self.sampling_args = dict(sampling_args or {})
        self.dataset = self._format(dataset) if dataset is not None else None
        self.eval_dataset = self._format(eval_dataset) if eval_dataset is not None else None

    def _format(self, dataset: Dataset) -> Dataset:
        """Rows as verifiers shapes them: ``question`` (or a ``prompt`` string) becomes system
        prompt + few-shot turns + the question as a user message; a ``prompt`` of messages gets
        the system prompt first unless it opens with one (few-shot turns are not added to it)."""
        sp, fs = self.system_prompt, self.few_shot
        if "prompt" in dataset.column_names and len(dataset) and isinstance(dataset[0]["prompt"], str):
            dataset = dataset.map(lambda row: {"prompt_messages": format_prompt(row["prompt"], sp, fs)})
            dataset = dataset.remove_columns("prompt").rename_column("prompt_messages", "prompt")
        elif "prompt" in dataset.column_names and sp:
            def with_system(row):
                opens = row["prompt"] and row["prompt"][0].get("role") == "system"
                return {"prompt": row["prompt"] if opens else [{"role": "system", "content": sp}, *row["prompt"]]}

            dataset = dataset.map(with_system)
        if "prompt" not in dataset.column_names:
            if "question" not in dataset.column_names:
                raise ValueError(f"dataset needs a 'prompt' or 'question' column, has {dataset.column_names}")
            dataset = dataset.map(lambda row: {"prompt": format_prompt(row["question"], sp, fs)})
        if "answer" not in dataset.column_names:
            dataset = dataset.add_column("answer", [""] * len(dataset))
        if "task" not in dataset.column_names:
            dataset = dataset.add_column("task", ["default"] * len(dataset))
        return dataset

    def get_dataset(self, n: int = -1) -> Dataset:
        """Training rows (falls back to the eval rows); the first ``n`` if ``n > 0``."""
        ds = self.dataset if self.dataset is not None else self.eval_dataset
        return ds.select(range(min(n, len(ds)))) if n > 0 else ds

    def get_eval_dataset(self, n: int = -1) -> Dataset:
        """Evaluation rows (falls back to the training rows); the first ``n`` if ``n > 0``."""
        ds = self.eval_dataset if self.eval_dataset is not None else self.dataset
        return ds.select(range(min(n, len(ds)))) if n > 0 else ds

    async def rollout(self, client, model: str, rollout: Rollout, sampling_args: dict) -> None:
        """Run one rollout in place: fill ``completion``, ``turns``, ``state``. Subclasses override."""
        raise NotImplementedError

    async def call_model(self, client, model: str, messages: Messages, sampling_args: dict) -> tuple[dict, Turn, bool]:
        """One chat completion with token ids and log-probs.

        The request is the one ``client.chat.completions.create`` would send (``extra_body``
        merged into the body; ``extra_headers``, ``extra_query`` and ``timeout`` as request
        options), posted and read as plain JSON (:func:`post_json`).

        Returns:
            ``(assistant_message, turn, truncated)``.
        Raises:
            ModelServerError: the server returned no token ids or log-probs (not a vLLM
                server, or too old), or as many log-probs as tokens.
            openai.APIError: the request failed (after the client's retries).
        """
        args = dict(sampling_args)
        options = {key: args.pop(key) for key in ("extra_headers", "extra_query", "timeout") if key in args}
        if "extra_headers" in options:
            options["headers"] = options.pop("extra_headers")
        if "extra_query" in options:
            options["params"] = options.pop("extra_query")
        body = {"model": model, "messages": messages, "logprobs": True, "return_token_ids": True,
                "skip_special_tokens": False, **{k: v for k, v in args.items() if k != "extra_body"},
                **args.get("extra_body", {})}
        data = await post_json(client, "/chat/completions", body, options)
        choice = data["choices"][0]
        content = (choice.get("logprobs") or {}).get("content")
        turn = Turn.served(data.get("prompt_token_ids"), choice.get("token_ids"),
                           None if content is None else [t["logprob"] for t in content])
        reply = choice.get("message") or {}
        message = {"role": "assistant", "content": reply.get("content") or ""}
        if reply.get("tool_calls"):
            message["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["function"]["name"],
                                                   "arguments": c["function"]["arguments"]}}
                                     for c in reply["tool_calls"]]
        return message, turn, choice.get("finish_reason") == "length"

    async def run_rollout(self, client, model: str, rollout: Rollout, sampling_args: dict,
                          semaphore: asyncio.Semaphore, deadline: float | None = None, on_done=None) -> Rollout:
        """Rollout then score; any exception, or running past ``deadline`` (the event loop's
        clock, ``loop.time()``), becomes ``rollout.error`` with reward 0."""
        async with semaphore:
            try:
                left = None if deadline is None else max(deadline - asyncio.get_running_loop().time(), 0.0)
                await asyncio.wait_for(self._rollout_and_score(client, model, rollout, sampling_args), left)
            except Exception as exc:  # kept as an error so that training goes on
                set_error(rollout, exc)
        if on_done is not None:
            on_done(rollout)
        return rollout

    async def _rollout_and_score(self, client, model: str, rollout: Rollout, sampling_args: dict) -> None:
        await self.rollout(client, model, rollout, sampling_args)
        await self.score(rollout)

    async def score(self, rollout: Rollout) -> None:
        """Set ``rollout.reward`` and ``rollout.metrics`` with the rubric."""
        rollout.reward, rollout.metrics = await self.rubric.score(
            prompt=rollout.prompt, completion=rollout.completion, answer=rollout.answer,
            state=rollout.state, info=rollout.info, task=rollout.task)

    def new_rollouts(self, rows: list[dict], rollouts_per_example: int) -> list[Rollout]:
        """Empty rollouts, ``rollouts_per_example`` per row, grouped by row."""
        return [Rollout(example_id=i, prompt=prompt_messages(row["prompt"]), answer=row.get("answer"),
                        info=row_info(row.get("info")), task=row.get("task"))
                for i, row in enumerate(rows) for _ in range(rollouts_per_example)]

    async def generate(self, client, model: str, rows: list[dict], rollouts_per_example: int,
                       sampling_args: dict, max_concurrent: int = 1024,
                       timeout: float | None = None, on_done: Callable[[Rollout], None] | None = None) -> list[Rollout]:
        """Roll out every row ``rollouts_per_example`` times and score each rollout.

        Args:
            rows: dataset rows (dicts with ``prompt``, ``answer``, ``info``, ``task``).
            sampling_args: OpenAI chat-completion arguments (``max_tokens``, ``temperature``,
                ``top_p``, ``extra_body``...), merged with the environment's defaults
                (:func:`merge_sampling_args`).
            timeout: seconds allowed for the whole call (``None``: unlimited); rollouts not
                finished by then are errors.
            on_done: called with each rollout as it finishes (progress display).
        Returns:
            ``len(rows) * rollouts_per_example`` rollouts, grouped: rollouts of row ``i``
            are at ``[i*r, (i+1)*r)``.
        """
        args = merge_sampling_args(self.sampling_args, sampling_args)
        semaphore = asyncio.Semaphore(max_concurrent)
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        rollouts = self.new_rollouts(rows, rollouts_per_example)
        return list(await asyncio.gather(
            *(self.run_rollout(client, model, r, args, semaphore, deadline, on_done) for r in rollouts)))


class SingleTurnEnv(Environment):
    """One model response per rollout.

    The rollouts of one row are sampled with one request (``group_sampling.py``: one prefill,
    ``n`` children) unless a subclass overrides ``rollout``, the sampling arguments have no
    ``/v1/completions`` equivalent, or several rollouts per row are sampled greedily (vLLM takes
    ``n > 1`` only when sampling); then each rollout is its own chat completion.
    """

    async def generate(self, client, model: str, rows: list[dict], rollouts_per_example: int,
                       sampling_args: dict, max_concurrent: int = 1024,
                       timeout: float | None = None, on_done: Callable[[Rollout], None] | None = None) -> list[Rollout]:
        """As :meth:`Environment.generate`; ``max_concurrent`` rollouts in flight are
        ``max_concurrent // rollouts_per_example`` group requests (at least one)."""
        from vf_rl.env_api.group_sampling import SingleTurnGroups, group_request_args

        split = group_request_args(self, client, sampling_args, rollouts_per_example)
        if split is None or type(self).rollout is not SingleTurnEnv.rollout:
            return await super().generate(client, model, rows, rollouts_per_example, sampling_args, max_concurrent,
                                          timeout, on_done)
        return await SingleTurnGroups(self, *split).generate(client, model, rows, rollouts_per_example,
                                                            sampling_args, max_concurrent, timeout, on_done)

    async def rollout(self, client, model: str, rollout: Rollout, sampling_args: dict) -> None:
        message, turn, truncated = await self.call_model(client, model, rollout.prompt, sampling_args)
        rollout.completion = [message]
        rollout.turns = [turn]
        rollout.is_truncated = truncated
