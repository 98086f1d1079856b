"""Tool calling on the inference server: on when the model's chat template has a known tool-call
format; a tool-using environment on a server without it is refused before anything starts (one
line, exit 2); tool calls and their parse failures are counted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_cpu_config

from vf_rl.config.schema import load_config
from vf_rl.config.tools import chat_template, template_parser

ROOT = Path(__file__).resolve().parents[1]

# the tool section of a Qwen2.5-style chat template (the Hermes format)
HERMES_TEMPLATE = """{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}
{{- tool | tojson }}{%- endfor %}{{- '</tools>\\nFor each function call, return a json object within
<tool_call></tool_call> XML tags<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def model_with_template(model_dir: Path, target: Path, template: str) -> Path:
    """``model_dir``'s files (linked) with ``template`` as its chat template."""
    target.mkdir()
    for f in model_dir.iterdir():
        if f.name != "chat_template.jinja":
            (target / f.name).symlink_to(f)
    (target / "chat_template.jinja").write_text(template)
    return target


def dry_run(config: Path, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--dry-run"],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_template_formats(model_dir):
    assert template_parser(chat_template(str(model_dir))) is None  # SmolLM2's template has no tool format
    assert template_parser(HERMES_TEMPLATE) == ("hermes", "<tool_call>")
    assert template_parser("...<tool_call>\\n<function=name>...") == ("qwen3_coder", "<function=")
    assert template_parser("{{- '<|python_tag|>' + tool_call.name }}") == ("llama3_json", "<|python_tag|>")
    assert template_parser("[AVAILABLE_TOOLS] ... [TOOL_CALLS]") == ("mistral", "[TOOL_CALLS]")


def test_tool_calling_follows_the_chat_template(model_dir, tmp_path):
    model = model_with_template(model_dir, tmp_path / "model", HERMES_TEMPLATE)
    config = write_cpu_config(tmp_path / "c.toml", model, tmp_path / "run", 8123)
    resolved = load_config(config)
    assert resolved.inference.args["tool_call_parser"] == "hermes"
    assert resolved.inference.args["enable_auto_tool_choice"] is True
    assert resolved.origins["inference.args.tool_call_parser"] == (
        "derived: the chat template of the model writes tool calls as <tool_call>")
    result = dry_run(config)
    assert result.returncode == 0, result.stderr
    assert "--tool-call-parser hermes --enable-auto-tool-choice" in result.stdout
    # the user's choice wins: off stays off
    off = write_cpu_config(tmp_path / "off.toml", model, tmp_path / "run", 8123,
                           inference_args={"enable_auto_tool_choice": False})
    assert "tool_call_parser" not in load_config(off).inference.args


@pytest.mark.parametrize("env_id,env_args,pythonpath", [
    ("math-python", {"source": "offline"}, None),  # vf-rl's ToolEnv
    pytest.param("vfx-calculator", {}, "verifiers_envs", marks=pytest.mark.classic),  # a classic verifiers vf.ToolEnv
])
def test_a_tool_environment_without_tool_calling_is_refused(model_dir, tmp_path, env_id, env_args, pythonpath):
    env = ({**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / pythonpath),
                                                                      os.environ.get("PYTHONPATH")]))}
           if pythonpath else None)
    config = write_cpu_config(tmp_path / "tools.toml", model_dir, tmp_path / "run", 8123, env_id=env_id,
                              env_args=env_args)
    result = dry_run(config, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"vf-rl: error: {config}: env {env_id!r} calls tools, but the inference server would start without tool calling: "
        "set enable_auto_tool_choice = true and tool_call_parser = \"<vLLM's parser for this model, e.g. hermes>\" "
        "in [inference.args]"]
    # naming the parser is enough: tool calling is derived from it
    fixed = write_cpu_config(tmp_path / "fixed.toml", model_dir, tmp_path / "run", 8123, env_id=env_id,
                             env_args=env_args, inference_args={"tool_call_parser": "hermes"})
    result = dry_run(fixed, env=env)
    assert result.returncode == 0, result.stderr
    flags = next(line for line in result.stdout.splitlines() if line.startswith("vf-vllm: ")).split()
    assert "--enable-auto-tool-choice" in flags and flags[flags.index("--tool-call-parser") + 1] == "hermes"


def test_auto_tool_choice_without_a_parser_is_refused(model_dir, tmp_path):
    config = write_cpu_config(tmp_path / "c.toml", model_dir, tmp_path / "run", 8123,
                              inference_args={"enable_auto_tool_choice": True})
    result = dry_run(config)
    assert result.returncode == 2
    assert result.stderr.startswith(f"vf-rl: error: {config}: inference.args.enable_auto_tool_choice = true needs "
                                    "tool_call_parser") and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.server
def test_tool_calls_and_parse_failures_are_counted(server):
    """Against the real server (hermes parser): a reply that is a well-formed call is parsed and
    counted; a ``<tool_call>`` the parser cannot read stays text and counts as a parse failure.
    The replies are forced with vLLM's structured outputs (a regex; strict tool schemas would
    constrain the call's arguments instead)."""
    from datasets import Dataset
    from openai import AsyncOpenAI

    from vf_rl.env_api import Rubric, ToolEnv
    from vf_rl.orchestrator.metrics import rollout_metrics

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    env = ToolEnv(tools=[add], max_turns=2, strict_tools=False,
                  dataset=Dataset.from_list([{"question": "2 + 3?", "answer": "5"}]),
                  rubric=Rubric(funcs=[lambda completion, **kw: 0.0]))

    def run(regex: str):
        async def go():
            client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x")
            try:
                return await env.generate(client, server.model, list(env.get_dataset()), 2,
                                          {"max_tokens": 60, "temperature": 1.0,
                                           "extra_body": {"structured_outputs": {"regex": regex}}})
            finally:
                await client.close()
        return asyncio.run(go())

    good = run(r'<tool_call>\n\{"name": "add", "arguments": \{"a": 2, "b": 3\}\}\n</tool_call>')
    assert all(r.error is None and r.state["tool_calls"] >= 1 and r.state["tool_parse_failures"] == 0 for r in good), \
        [(r.error, r.completion) for r in good]
    assert good[0].completion[1] == {"role": "tool", "tool_call_id": good[0].completion[0]["tool_calls"][0]["id"],
                                     "content": "5"}
    bad = run(r"<tool_call>\nadd two and three\n</tool_call>")
    assert all(r.error is None and r.state == {**r.state, "tool_calls": 0, "tool_parse_failures": 1} for r in bad), \
        [(r.error, r.completion) for r in bad]
    metrics = rollout_metrics(good + bad, 2)
    assert metrics["tools/parse_failures"] == 0.5 and metrics["tools/calls"] >= 0.5
