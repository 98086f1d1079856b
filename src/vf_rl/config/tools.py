"""Tool calling on the inference server: the vLLM tool-call parser a model's chat template needs,
and whether a run's environments call tools.

vLLM answers a chat request that carries ``tools`` only when it was started with
``--enable-auto-tool-choice`` and a ``--tool-call-parser`` for the model's tool-call format (else
its 400: ``"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser``). The
resolved config turns both on whenever the model's chat template writes tool calls in a format
listed in :data:`TEMPLATE_FORMATS` (harmless for requests without tools); a model whose template
has none (SmolLM2's) needs ``tool_call_parser`` in ``[inference.args]`` for a tool-using
environment, which ``env_api/checks.py`` enforces before anything starts.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from vf_rl.config.hub import hub_reachable
from vf_rl.config.rules import ConfigError

# (marker in the chat template / the model's output, vLLM's --tool-call-parser); the first marker
# found in a template decides, so the more specific formats come first.
TEMPLATE_FORMATS = (
    ("<function=", "qwen3_coder"),  # Qwen3-Coder: <tool_call><function=name>...
    ("<｜tool▁calls▁begin｜>", "deepseek_v3"),
    ("<|tool_calls_section_begin|>", "kimi_k2"),
    ("<arg_key>", "glm45"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),  # Llama 3.1-3.3
    ("<|tool_call|>", "granite"),
    ("functools[", "phi4_mini_json"),
    ("<|action_start|><|plugin|>", "internlm"),
    ("<tool_call>", "hermes"),  # Qwen2.5/Qwen3, Hermes, SmolLM3...
)


def chat_template(model: str) -> str | None:
    """The chat template of ``model`` (a local directory or a Hugging Face hub id), from
    ``chat_template.jinja`` or ``tokenizer_config.json``; a hub model's files come from the
    local hub cache, else are downloaded unless ``HF_HUB_OFFLINE=1`` or the hub does not answer
    within 3 s. ``None`` when there is none or it cannot be read."""
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        path = model_file(model, name)
        try:
            text = path.read_text(encoding="utf-8") if path is not None else None
            template = text if name.endswith(".jinja") or text is None else json.loads(text).get("chat_template")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            template = "\n".join(t.get("template", "") for t in template if isinstance(t, dict))
        if isinstance(template, str):
            return template
    return None


def model_file(model: str, name: str) -> Path | None:
    """``name`` of ``model``: in its directory, or from the hub cache, else downloaded (as
    :func:`chat_template` says); ``None`` when it cannot be had."""
    local = Path(model).expanduser()
    if local.is_dir():
        return local / name if (local / name).is_file() else None
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        return None
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_OFFLINE

        cached = try_to_load_from_cache(model, name)
        if isinstance(cached, str):
            return Path(cached)
        if HF_HUB_OFFLINE or cached is not None or not _hub_reachable():  # offline, or no such file
            return None
        return Path(hf_hub_download(model, name, etag_timeout=5))
    except Exception:  # no network, no such repository or file: unknown
        return None


@functools.lru_cache(maxsize=1)
def _hub_reachable() -> bool:
    return hub_reachable()


def template_parser(template: str | None) -> tuple[str, str] | None:
    """``(parser, marker)``: vLLM's tool-call parser for the tool-call format ``template`` writes
    (:data:`TEMPLATE_FORMATS`), or ``None``."""
    for marker, parser in TEMPLATE_FORMATS:
        if template and marker in template:
            return parser, marker
    return None


def tool_flags(model: str, inference_args: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The tool-calling flags to derive for ``[inference.args]``: ``{key: (value, why)}``.

    - ``tool_call_parser`` set: ``enable_auto_tool_choice`` on, unless the file sets it;
    - neither set: both, when the chat template's format is known (:func:`template_parser`);
    - ``enable_auto_tool_choice = false``: nothing.

    Raises:
        ConfigError: ``enable_auto_tool_choice = true`` without a ``tool_call_parser`` and no known
            format in the chat template (vLLM refuses to start so).
    """
    auto, parser = inference_args.get("enable_auto_tool_choice"), inference_args.get("tool_call_parser")
    if parser is not None:
        return {} if auto is not None else {"enable_auto_tool_choice": (True, "inference.args.tool_call_parser")}
    if auto is False:
        return {}
    found = template_parser(chat_template(model))
    if found is None:
        if auto:
            raise ConfigError(f"inference.args.enable_auto_tool_choice = true needs tool_call_parser, and the chat "
                              f"template of {model} has no tool-call format vf-rl recognises: set "
                              f"inference.args.tool_call_parser to vLLM's parser for this model (e.g. \"hermes\")")
        return {}
    why = f"the chat template of the model writes tool calls as {found[1]}"
    return {"tool_call_parser": (found[0], why), **({} if auto else {"enable_auto_tool_choice": (True, why)})}
