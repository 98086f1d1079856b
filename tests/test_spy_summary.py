"""scripts/gpu/spy_summary.py: py-spy's raw profiles (``--threads --idle --format raw``) read per thread, the
busiest thread found by its non-waiting samples, its call tree from where the stacks split."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# the shape of py-spy 0.4's raw lines: thread frame first, then outermost to innermost, then the sample count
RAW = """\
thread (1112): MainThread;run_engine_core (vllm/v1/engine/core.py:1323);run_busy_loop (vllm/v1/engine/core.py:1364);\
execute_model (vllm/v1/worker/gpu/model_runner.py:1211) 60
thread (1112): MainThread;run_engine_core (vllm/v1/engine/core.py:1323);run_busy_loop (vllm/v1/engine/core.py:1364);\
sample_tokens (vllm/v1/worker/gpu/model_runner.py:1433) 25
thread (1112): MainThread;run_engine_core (vllm/v1/engine/core.py:1323);run_busy_loop (vllm/v1/engine/core.py:1362);\
Queue.get (queue.py:171);Condition.wait (threading.py:355) 15
thread (1646): Thread-1 (process_input_sockets);Thread._bootstrap (threading.py:1002);\
process_input_sockets (vllm/v1/engine/core.py:1656);Poller.poll (zmq/sugar/poll.py:106) 100
thread (1649): Thread-2 (process_output_sockets);Queue.get (queue.py:171);Condition.wait (threading.py:355) 100
not a profile line
"""


def _module():
    spec = importlib.util.spec_from_file_location("spy_summary", REPO / "scripts" / "gpu" / "spy_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_threads_are_read_apart_and_bad_lines_skipped(tmp_path):
    path = tmp_path / "spy.txt"
    path.write_text(RAW)
    threads = _module().read(path)
    assert {t: sum(c.values()) for t, c in threads.items()} == {
        "thread (1112): MainThread": 100, "thread (1646): Thread-1 (process_input_sockets)": 100,
        "thread (1649): Thread-2 (process_output_sockets)": 100}
    main = threads["thread (1112): MainThread"]
    assert main[("run_engine_core (vllm/v1/engine/core.py:1323)", "run_busy_loop (vllm/v1/engine/core.py:1364)",
                 "sample_tokens (vllm/v1/worker/gpu/model_runner.py:1433)")] == 25


def test_the_busiest_thread_is_the_one_not_waiting(tmp_path, capsys, monkeypatch):
    path = tmp_path / "spy.txt"
    path.write_text(RAW)
    spy = _module()
    # every thread has 100 samples; the engine loop's are the only ones not in a wait
    assert [spy._waiting(f) for f in spy.read(path)["thread (1649): Thread-2 (process_output_sockets)"]] == [True]
    monkeypatch.setattr(sys, "argv", ["spy_summary.py", str(path), "--tree", "0.2"])
    spy.main()
    out = capsys.readouterr().out
    tree = out.split("call tree of the busiest thread:\n")[1].splitlines()
    # the chain every sample passes through (run_engine_core) is skipped; shares are of the thread's samples;
    # frames under 20% (the 15 waiting samples) are left out
    assert tree == ["    85.0% run_busy_loop (vllm/v1/engine/core.py:1364)",
                    "      60.0% execute_model (vllm/v1/worker/gpu/model_runner.py:1211)",
                    "      25.0% sample_tokens (vllm/v1/worker/gpu/model_runner.py:1433)"]
    assert "15% Condition.wait (threading.py:355)" in out  # the engine thread's idle share, as a leaf
