"""Quiet panes: what the Inference and Trainer panes of a vf-rl run show, and what their logs keep.

- the server: no uvicorn access line per request (unless asked for), no "Failed to load weights" at a
  weight update, no nanobind leak report at exit;
- the panes: their command is the pane's own process, never typed into it (so never echoed);
- the trainer: lines above the progress bar (the step line on its own line), the generation progress
  in the bar, the sample table after step 1, every 5 steps and the last, with the expected answer;
- the logs: each line's last state, so no progress refresh lines.
"""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import free_port, write_cpu_config

from vf_rl.config.vllm_flags import check_inference_args, inference_flags, serve_options
from vf_rl.inference.server import serve_argv
from vf_rl.inference.supervision import LOG_FILTER, supervised_shell
from vf_rl.launcher.launch import PaneCommand

# the end of a CPU server's log when it stops (vLLM CPU 0.32), nanobind's report as triton prints it
SERVER_EXIT = """\
INFO:     Application shutdown complete.
nanobind: leaked 4 instances!
 - leaked instance 0x7f497f1cc808 of type "triton._C.libtriton.ir.attribute"
nanobind: leaked 64 types!
 - leaked type "triton._C.libtriton.ir.location"
 - leaked type "TMEM_LOAD_REDUCE_MODIFIER"
 - ... skipped remainder
nanobind: leaked 514 functions!
 - leaked function "create_async_shared_store"
 - leaked function ""
 - ... skipped remainder
nanobind: this is likely caused by a reference counting issue in the binding code.
See https://nanobind.readthedocs.io/en/latest/refleaks.html
"""


def test_vf_vllm_turns_the_access_log_off_unless_its_flags_name_it():
    argv = serve_argv(["--model", "/m"], cpu=True)
    assert argv.count("--disable-uvicorn-access-log") == 1
    kept = serve_argv(["--model", "/m", "--no-disable-uvicorn-access-log"], cpu=True)
    assert "--disable-uvicorn-access-log" not in kept and kept.count("--no-disable-uvicorn-access-log") == 1
    assert serve_argv(["--model", "/m", "--disable-uvicorn-access-log"], cpu=True).count("--disable-uvicorn-access-log") == 1
    # in a config, false turns a switch that vf-vllm sets itself off; other false values are left out
    assert inference_flags({"disable_uvicorn_access_log": False, "enforce_eager": False}) == [
        "--no-disable-uvicorn-access-log"]
    assert inference_flags({"return_tokens_as_token_ids": False}) == ["--no-return-tokens-as-token-ids"]
    # and both are flags of the installed vLLM's own parser
    options = serve_options()
    assert "--disable-uvicorn-access-log" in options and "--no-disable-uvicorn-access-log" in options
    assert check_inference_args({"disable_uvicorn_access_log": False}, options)


def run_bash(line: str, tmp_path: Path) -> tuple[int, str]:
    """``line`` run by bash in ``tmp_path``: its status and its output as a terminal gets it (``\r`` kept)."""
    result = subprocess.run(["bash", "-c", line], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                            cwd=tmp_path)
    return result.returncode, result.stdout.decode()


def test_the_inference_pane_drops_nanobinds_exit_report_and_its_log_keeps_each_lines_last_state(tmp_path):
    """The server's output reaches the pane without nanobind's report (every other line kept, the
    server's status too); the log keeps the last state of a line redrawn with carriage returns."""
    server = tmp_path / "server.sh"
    (tmp_path / "exit.txt").write_text(SERVER_EXIT)
    server.write_text("printf 'Loading: 0/2\\rLoading: 1/2\\rLoading: 2/2\\n'\ncat exit.txt\nexit 3\n")
    log = tmp_path / "inference.log"
    line = supervised_shell(f"bash {server}", log, tmp_path / "inference.exit", tmp_path / "restarts",
                            tmp_path / "trainer.exit")
    status, pane = run_bash(line, tmp_path)
    assert status == 0, pane
    assert (tmp_path / "inference.exit").read_text().strip() == "3"  # the server's status, not a filter's
    assert "INFO:     Application shutdown complete.\n" in pane and "Loading: 0/2\rLoading: 1/2\r" in pane
    assert "nanobind" not in pane and "leaked" not in pane and "skipped remainder" not in pane, pane
    assert log.read_text().splitlines() == ["Loading: 2/2", "INFO:     Application shutdown complete."]


def test_the_trainer_log_keeps_each_lines_last_state(tmp_path):
    """A bar redrawn in place leaves its final line in trainer.log; a bar cleared for a line printed
    above it leaves nothing, and the line is there once."""
    text = "\\r 0%|  | 0/3\\r 33%|# | 1/3\\r          \\rStep 1/3: reward=0.5\\n\\r 33%|# | 1/3\\r100%|##| 3/3\\nPlot: x\\n"
    log, exit_file = tmp_path / "trainer.log", tmp_path / "trainer.exit"
    status, pane = run_bash(PaneCommand("Trainer", {}, ["printf", "%b", text]).shell(log, exit_file), tmp_path)
    assert status == 0 and exit_file.read_text().strip() == "0", pane
    assert log.read_text().splitlines() == ["Step 1/3: reward=0.5", "100%|##| 3/3", "Plot: x"]


def test_lines_go_above_the_progress_bar_and_the_generation_progress_into_it(monkeypatch):
    """With Trainer's bar attached (a real tqdm bar), the step line and the sample table are printed
    on lines of their own, the batch's progress is the bar's postfix; the log (LOG_FILTER, by sed)
    holds each printed line once and the bar's final state."""
    from tqdm.auto import tqdm

    from vf_rl.env_api import Rollout
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer import display

    stream = io.StringIO()
    monkeypatch.setattr("sys.stdout", stream)
    bar = tqdm(total=2, file=stream, dynamic_ncols=True)
    display.attach_progress_bar(bar)
    try:
        batch = Batch(step=0, samples=[], row_ids=[7],
                      rollouts=[Rollout(example_id=7, prompt=[{"role": "user", "content": "Reverse: abc"}], answer="cba",
                                        completion=[{"role": "assistant", "content": "cb"}], reward=0.5)])
        for step in range(2):
            show = display.progress_printer(step)
            show(1, 4)
            assert bar.postfix == f"batch {step + 1}: 1/4 rollouts"
            show(4, 4)
            assert not bar.postfix  # the batch is complete: the step line gives its seconds
            if step == 0:
                display.sample_table(batch, 1)
            bar.update(1)
            display.step_line(step + 1, 2, {"reward": 0.5})
    finally:
        display.attach_progress_bar(None)
        bar.close()
    logged = subprocess.run(["sed", "-u", LOG_FILTER], input=stream.getvalue(), capture_output=True, text=True,
                            check=True).stdout.splitlines()
    steps = [line for line in logged if "Step" in line and "reward=" in line]
    assert [line[:9] for line in steps] == ["Step 1/2:", "Step 2/2:"]  # each at the start of its line
    assert sum("Step 1 samples" in line for line in logged) == 1 and not any("rollouts" in line for line in logged)
    assert sum("2/2 [" in line for line in logged) == 1 and not any("1/2 [" in line for line in logged), logged


def test_the_sample_table_has_its_own_cadence_and_shows_the_expected_answer(monkeypatch):
    from vf_rl.env_api import Rollout
    from vf_rl.orchestrator.orchestrator import Batch
    from vf_rl.trainer import display

    assert [s for s in range(1, 31) if display.shows_samples(s, 30)] == [1, 5, 10, 15, 20, 25, 30]
    assert [s for s in range(1, 8) if display.shows_samples(s, 7)] == [1, 5, 7]
    for answer, column in (("olleh", True), (None, False)):
        stream = io.StringIO()
        monkeypatch.setattr("sys.stdout", stream)
        batch = Batch(step=4, samples=[], row_ids=[3],
                      rollouts=[Rollout(example_id=3, prompt=[{"role": "user", "content": "Reverse: hello"}], answer=answer,
                                        completion=[{"role": "assistant", "content": "ollhe"}], reward=0.6)])
        display.sample_table(batch, 5)
        header = next(line for line in stream.getvalue().splitlines() if "prompt" in line)
        assert ("answer" in header) == column and ("olleh" in stream.getvalue()) == column, stream.getvalue()


def test_the_reload_warning_is_dropped_only_for_modules_with_nothing_to_load(caplog):
    """``buffer_only_classes`` on a real model: its rotary embedding (a non-persistent buffer, no
    parameter) and nothing with a parameter; the filter drops vLLM's warning for those classes, keeps
    it for the others, and is gone after the block."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from vf_rl.inference.worker_extension import LAYERWISE_LOGGER, buffer_only_classes, quiet_reload_warnings

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=128))
    classes = buffer_only_classes(model)
    assert classes == {"LlamaRotaryEmbedding"}
    logger = logging.getLogger(LAYERWISE_LOGGER)
    with caplog.at_level(logging.WARNING, logger=LAYERWISE_LOGGER):
        with quiet_reload_warnings(classes):
            logger.warning("%s: Failed to load weights", "LlamaRotaryEmbedding")
            logger.warning("%s: Failed to load weights", "ParallelLMHead")
            logger.warning("%s: something else", "LlamaRotaryEmbedding")
        logger.warning("%s: Failed to load weights", "LlamaRotaryEmbedding")
    assert [r.getMessage() for r in caplog.records] == ["ParallelLMHead: Failed to load weights",
                                                         "LlamaRotaryEmbedding: something else",
                                                         "LlamaRotaryEmbedding: Failed to load weights"]


def test_an_update_of_a_tied_model_names_its_lm_head():
    import torch

    from vf_rl.inference.worker_extension import with_tied_head

    embed, norm = torch.ones(4, 2), torch.ones(2)
    update = [("model.embed_tokens.weight", embed), ("model.norm.weight", norm)]
    assert with_tied_head(update)[-1][0] == "lm_head.weight" and with_tied_head(update)[-1][1] is embed
    head = torch.zeros(4, 2)
    assert with_tied_head([*update, ("lm_head.weight", head)]) == [*update, ("lm_head.weight", head)]
    assert with_tied_head([("model.norm.weight", norm)]) == [("model.norm.weight", norm)]  # no embedding: nothing


@pytest.mark.server
def test_the_server_logs_no_request_and_no_failed_load_at_a_weight_update(server, base_weights):
    """The session's vf-vllm (started with ``python -m vf_rl.inference.server``): after requests and a
    weight update in checkpoint format, its log has no access line and no "Failed to load weights".
    uvicorn writes an access line before it sends the response, and the worker logs the reload's
    warnings before the update returns, so what the calls would have logged is in the file by now."""
    from vf_rl.inference.client import InferenceClient

    start = server.log.stat().st_size
    assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200
    response = httpx.post(f"{server.base_url}/v1/completions", timeout=120,
                          json={"model": server.model, "prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert response.status_code == 200
    InferenceClient(port=server.port).update_weights(str(base_weights))
    text = server.log.read_bytes()[start:].decode(errors="replace")
    assert "HTTP/1.1" not in text, text
    assert "Failed to load weights" not in text, text


def capture(target: str) -> str:
    """A pane's whole history as text (wrapped lines joined)."""
    return subprocess.run(["tmux", "capture-pane", "-p", "-J", "-S", "-", "-t", target], capture_output=True,
                          text=True).stdout


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


@pytest.mark.server
def test_a_vf_rl_run_has_quiet_panes_and_clean_logs(model_dir, tmp_path):
    """Three CPU steps of reverse-text through vf-rl in real tmux: neither pane shows its command;
    the Trainer pane has each step line on its own line; trainer.log has no progress refresh line,
    the sample table (with the expected answer) after steps 1 and 3 only; inference.log has no
    access line, no "Failed to load weights" (three weight updates), no nanobind report."""
    out, port = tmp_path / "run", free_port()
    session = f"vf-rl-quiet-{port}"
    config = write_cpu_config(tmp_path / "q.toml", model_dir, out, port,
                              inference_args={"enforce_eager": True, "max_model_len": 512}, batch_size=8,
                              rollouts_per_example=4, micro_batch_size=8, max_steps=3, max_tokens=8, save_steps=50)
    run = subprocess.Popen([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "-s", session, "--wait"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    panes: dict[str, str] = {}
    try:
        while run.poll() is None:  # the panes as a user sees them, once the first step line is out
            trainer = capture(f"{session}:vf-rl.1")
            if "Step 1/3:" in trainer:
                panes = {"inference": capture(f"{session}:vf-rl.0"), "trainer": trainer}
                break
            time.sleep(0.5)
        output, _ = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
    logs = out / "logs"
    trainer_log = (logs / "trainer.log").read_text()
    assert run.returncode == 0, (output, trainer_log[-3000:])
    assert panes, "the Trainer pane never showed step 1"
    for name, text in panes.items():  # the pane's command is its process, not typed in and echoed
        assert "PIPESTATUS" not in text and "trap " not in text, (name, text)
    assert "vf-vllm: vllm serve" in panes["inference"] and "Loading model" in panes["trainer"]
    assert re.search(r"^Step 1/3: reward=", panes["trainer"], re.M), panes["trainer"]
    lines = trainer_log.splitlines()
    assert [line[:9] for line in lines if re.match(r"Step \d/3: reward=", line)] == ["Step 1/3:", "Step 2/3:", "Step 3/3:"]
    assert not [line for line in lines if re.search(r"\d+/8 rollouts", line)], lines  # no generation progress lines
    assert sum(bool(re.search(r"\d/3 \[", line)) for line in lines) == 1, lines  # the training bar's final state only
    assert [s for s in (1, 2, 3) if f"Step {s} samples" in trainer_log] == [1, 3]
    assert re.search(r"prompt.*completion.*answer.*reward", trainer_log), trainer_log
    inference_log = (logs / "inference.log").read_text()
    assert "Application startup complete" in inference_log
    assert "HTTP/1.1" not in inference_log and "Failed to load weights" not in inference_log
    assert "nanobind" not in inference_log
    assert len([r for r in jsonl(out / "metrics.jsonl") if "reward" in r]) == 3
