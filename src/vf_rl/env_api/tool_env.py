"""ToolEnv: OpenAI-style tool calling with plain Python functions as tools."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from typing import Any, Callable

from vf_rl.env_api.multiturn import MultiTurnEnv
from vf_rl.env_api.parsers import Messages

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(annotation: Any) -> dict:
    origin = typing.get_origin(annotation)
    if origin in (list, typing.List):
        args = typing.get_args(annotation)
        return {"type": "array", "items": _json_type(args[0]) if args else {}}
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(options[0]) if len(options) == 1 else {"anyOf": [_json_type(a) for a in options]}
    return {"type": _JSON_TYPES.get(annotation, "string")}


def _param_docs(doc: str) -> dict[str, str]:
    """``name: description`` lines of a Google-style ``Args:`` section."""
    docs, in_args = {}, False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if in_args:
            match = re.match(r"(\w+)\s*(\([^)]*\))?:\s*(.*)", stripped)
            if match:
                docs[match.group(1)] = match.group(3)
            elif not stripped or stripped.endswith(":"):
                in_args = False
    return docs


def tool_schema(func: Callable, strict: bool = False) -> dict:
    """The OpenAI tool schema of ``func``: its name, the first paragraph of its docstring, and a
    JSON schema of its parameters from the type hints (parameters without a default are
    required; ``Args:`` lines describe them). ``strict`` marks it ``"strict": true`` with no
    extra properties: vLLM (>= 0.32, hermes parser) then constrains a call's *arguments* to the
    schema; without it a small model may fill them with free text."""
    doc = inspect.getdoc(func) or ""
    hints = typing.get_type_hints(func)
    params, required = {}, []
    descriptions = _param_docs(doc)
    for name, p in inspect.signature(func).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = _json_type(hints.get(name, str))
        if name in descriptions:
            schema["description"] = descriptions[name]
        params[name] = schema
        if p.default is inspect.Parameter.empty:
            required.append(name)
    summary = doc.split("\n\n")[0].strip()
    schema = {"type": "function", "function": {"name": func.__name__, "description": summary,
                                               "parameters": {"type": "object", "properties": params,
                                                              "required": required}}}
    if strict:
        schema["function"]["strict"] = True
        schema["function"]["parameters"]["additionalProperties"] = False
    return schema


def num_tool_calls(completion, **kwargs) -> float:
    """Number of tool calls the model made in the rollout (a metric: give it weight 0)."""
    return float(sum(len(m.get("tool_calls") or []) for m in completion
                     if isinstance(m, dict) and m.get("role") == "assistant"))


class ToolEnv(MultiTurnEnv):
    """Multi-turn environment where the model calls Python functions as OpenAI tools.

    Each model turn is sent with ``tools=[...]``; every ``tool_call`` in the reply runs the
    named function with the JSON arguments (async functions are awaited, sync ones run in a
    thread), and its result (or error text) comes back as a ``{"role": "tool"}`` message. The
    rollout ends when the model answers without a tool call, or after ``max_turns``.

    Args:
        tools: Python functions with type hints and docstrings.
        tool_timeout: seconds one tool call may take.
        tool_choice: passed to the server (``"auto"``; a dict names a tool to force).
        strict_tools: mark the schemas strict (see :func:`tool_schema`).
    The vLLM server needs tool calling (``enable_auto_tool_choice`` and a ``tool_call_parser``):
    ``vf-rl`` turns it on when the model's chat template has a known tool-call format, else
    ``[inference.args]`` must name the parser (:mod:`vf_rl.config.tools`).
    """

    def __init__(self, tools: list[Callable] | None = None, max_turns: int = 10, tool_timeout: float = 30.0,
                 tool_choice: Any = "auto", strict_tools: bool = True, **kwargs: Any):
        super().__init__(max_turns=max_turns, **kwargs)
        self.tools = {t.__name__: t for t in tools or []}
        self.tool_schemas = [tool_schema(t, strict=strict_tools) for t in tools or []]
        self.tool_timeout = tool_timeout
        self.tool_choice = tool_choice

    def turn_args(self, sampling_args: dict) -> dict:
        if not self.tool_schemas:
            return sampling_args
        return {**sampling_args, "tools": self.tool_schemas, "tool_choice": self.tool_choice}

    async def is_completed(self, messages: Messages, state: dict, **kwargs: Any) -> bool:
        last = messages[-1]
        return last.get("role") == "assistant" and not last.get("tool_calls")

    async def rollout(self, client, model: str, rollout, sampling_args: dict) -> None:
        """As :meth:`MultiTurnEnv.rollout`, then count the rollout's tool calls in its state:
        ``tool_calls``, and ``tool_parse_failures``: calls whose arguments are not JSON, and
        replies the server did not parse into a call although they hold a tool-call marker
        (``<tool_call>``...: the model's format differs from the server's ``tool_call_parser``).
        The metrics report both (``tools/calls``, ``tools/parse_failures``)."""
        await super().rollout(client, model, rollout, sampling_args)
        from vf_rl.config.tools import TEMPLATE_FORMATS

        calls = failures = 0
        for message in rollout.completion:
            if message.get("role") != "assistant":
                continue
            for call in message.get("tool_calls") or []:
                calls += 1
                try:
                    json.loads(call["function"].get("arguments") or "{}")
                except json.JSONDecodeError:
                    failures += 1
            if not message.get("tool_calls") and any(m in (message.get("content") or "") for m, _ in TEMPLATE_FORMATS):
                failures += 1
        rollout.state.update(tool_calls=calls, tool_parse_failures=failures)

    async def call_tool(self, name: str, arguments: str) -> str:
        """Run one tool call; errors come back as text for the model to read."""
        if name not in self.tools:
            return f"Error: unknown tool {name!r}; available: {', '.join(self.tools)}"
        try:
            kwargs = json.loads(arguments or "{}")
            func = self.tools[name]
            call = func(**kwargs) if inspect.iscoroutinefunction(func) else asyncio.to_thread(func, **kwargs)
            return str(await asyncio.wait_for(call, self.tool_timeout))
        except asyncio.TimeoutError:
            return f"Error: tool {name} timed out after {self.tool_timeout:.0f} s"
        except Exception as exc:  # the model sees the error and may retry
            return f"Error: {type(exc).__name__}: {exc}"

    async def env_response(self, messages: Messages, state: dict, **kwargs: Any) -> Messages:
        replies = []
        for call in messages[-1].get("tool_calls") or []:
            result = await self.call_tool(call["function"]["name"], call["function"].get("arguments", "{}"))
            replies.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
        return replies
