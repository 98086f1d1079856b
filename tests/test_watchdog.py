"""The watchdog (``vf_rl.watchdog``): a wait without progress is named in one line, then ended.

- the watch itself: one line past the warning limit, ``Stalled`` past the stop limit, never while
  the other side progresses, and a side that does not answer counts as no progress;
- the orchestrator waiting on a real vf-vllm stopped with SIGSTOP: the line names the batch, the
  requests in flight and that vLLM's ``/metrics`` gives no answer;
- vf-train against a server stopped with SIGSTOP mid-run: the line, a checkpoint of the last
  complete step and exit status 5; ``--resume`` after SIGCONT runs every step once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import wait_for_memory, write_cpu_config

from vf_rl.watchdog import Limits, Look, Stalled, Watch

LINE = re.compile(r"^\[vf-rl\] watchdog: (stopping the run: )?the trainer has waited \d+ s on "
                  r"(the orchestrator for batch 2|vf-vllm for the push of the weights after step 1), no progress")


def checked_until_stalled(watch: Watch, most: int = 2000) -> Stalled | None:
    """``watch.check()`` every 10 ms, ``most`` times at most; the ``Stalled`` it raised, if it did."""
    for _ in range(most):
        try:
            watch.check()
        except Stalled as exc:
            return exc
        time.sleep(0.01)
    return None


def test_a_wait_without_progress_warns_once_then_stops():
    printed = []
    watch = Watch("the trainer", "the orchestrator", "batch 3", lambda: Look(7, "0/8 rollouts done"),
                  Limits(0.2, 0.6), period_s=0.02, printer=printed.append)
    stalled = checked_until_stalled(watch)
    assert stalled is not None
    assert len(printed) == 1 and "\n" not in printed[0]
    assert printed[0].startswith("[vf-rl] watchdog: the trainer has waited ")
    assert "on the orchestrator for batch 3, no progress for " in printed[0]
    assert printed[0].endswith("; 0/8 rollouts done (stopping the run after 1 s without progress: stall_timeout)")
    assert str(stalled).startswith("[vf-rl] watchdog: stopping the run: the trainer has waited ")
    assert str(stalled).endswith("; 0/8 rollouts done")


def test_a_wait_that_progresses_is_never_stopped():
    count = iter(range(10**6))
    printed = []
    watch = Watch("the trainer", "the orchestrator", "batch 1", lambda: Look(next(count), "moving"),
                  Limits(0.1, 0.2), period_s=0.01, printer=printed.append)
    assert checked_until_stalled(watch, most=100) is None  # 1 s of checks: five stop limits
    assert printed == []


def test_a_side_that_does_not_answer_counts_as_no_progress():
    never = threading.Event()

    def look():
        never.wait()
        return Look(0, "unreachable")

    watch = Watch("the trainer", "the orchestrator", "batch 2", look, Limits(0.2, 0.6), period_s=0.01,
                  answer_s=0.1, printer=lambda line: None)
    stalled = checked_until_stalled(watch)
    never.set()
    assert stalled is not None and "the orchestrator gave no answer in " in str(stalled)


@pytest.mark.parametrize("first", ["either", "group"])
def test_a_vllm_worker_waiting_on_the_trainers_broadcast_names_it(capsys, first):
    """The server's side: a vLLM worker (rank 1 of a real gloo group) waits for a weight bucket the
    trainer never sends: one line after warning_s, Stalled at the group's timeout_s, group closed.
    The watch and the group's own timeout both stop at timeout_s; whichever comes first, the wait
    ends with the watchdog's line (``group``: the group's timeout surely first, the watch's limit
    raised past it)."""
    import torch

    from vf_rl.inference.communicator import BroadcastGroup, free_port

    port, groups = free_port(), {}
    worker = threading.Thread(target=lambda: groups.setdefault(
        1, BroadcastGroup("127.0.0.1", port, 1, 2, "gloo", 3.0, warning_s=0.5)))
    worker.start()
    trainer = BroadcastGroup("127.0.0.1", port, 0, 2, "gloo", 3.0)
    worker.join()
    if first == "group":  # the watch's stop at 60 s; gloo's own recv gives up after 3 s
        groups[1].timeout_s = 60.0
    try:
        with pytest.raises(Stalled) as stalled:
            groups[1].broadcast(torch.empty(16), what="weight bucket 1/2")
    finally:
        trainer.close()
    warning = capsys.readouterr().out.strip()
    assert warning.startswith("[vf-rl] watchdog: vf-vllm's worker (rank 1) has waited ")
    assert " on the trainer for weight bucket 1/2, no progress for " in warning
    limit = 3 if first == "either" else 60
    assert f"the broadcast group gives up after timeout_s = {limit} s" in warning
    assert f"(giving up this weight update after {limit} s without progress: stall_timeout)" in warning
    assert str(stalled.value).startswith("[vf-rl] watchdog: giving up this weight update: vf-vllm's worker (rank 1)")
    assert groups[1].group is None


def stopped(server):
    """SIGSTOP the server's processes (its own process group: API server and engine core)."""
    os.killpg(server.process.pid, signal.SIGSTOP)


def continued(server):
    os.killpg(server.process.pid, signal.SIGCONT)


@pytest.mark.server
def test_orchestrator_waiting_on_a_stopped_server_names_it(server, capsys):
    from vf_rl.config.sections import OrchestratorConfig
    from vf_rl.environments.reverse_text import load_environment
    from vf_rl.orchestrator.orchestrator import Orchestrator

    env = load_environment(few_shot=0, source="offline")
    rows = [env.get_dataset()[i] for i in range(2)]
    orch = Orchestrator(env, rows, base_url=f"{server.base_url}/v1", model_name=server.model,
                        config=OrchestratorConfig(batch_size=4, rollouts_per_example=2, max_seq_len=256,
                                                  sampling_args={"max_tokens": 8}, stall_warning_timeout=3,
                                                  stall_timeout=9))
    stopped(server)
    try:
        with pytest.raises(Stalled) as stalled:
            orch.wait(0)
    finally:
        continued(server)
        orch.close()
    warning = capsys.readouterr().out
    print(warning, stalled.value, sep="\n")
    for line in (warning, str(stalled.value)):
        assert "the trainer has waited " in line and " on the orchestrator for batch 1, no progress for " in line
        assert ("the orchestrator: 0/4 rollouts of batch 1 done, batches in flight: 1, the server holds the initial "
                "weights (no weight push yet)") in line
        assert f"2 requests in flight to {server.base_url}/v1, none answered for " in line
        assert f"vLLM at {server.base_url}: no answer to GET /metrics in 5 s (the server is stopped or hung)" in line
    assert "(stopping the run after 9 s without progress: stall_timeout)" in warning
    assert str(stalled.value).startswith("[vf-rl] watchdog: stopping the run: ")


def jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


@pytest.mark.server
def test_vf_train_on_a_stopped_server_stops_with_a_checkpoint_and_resumes(server, model_dir, tmp_path,
                                                                          restore_base_weights):
    """The one proof on the CPU: a real vf-vllm stopped with SIGSTOP after step 1; vf-train prints the
    watchdog's line, stops with checkpoint-1 and exit status 5; after SIGCONT, --resume runs steps 2
    and 3 (each step once, step 1's rows unchanged)."""
    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "stall.toml", model_dir, out, server.port, batch_size=8,
                              rollouts_per_example=4, micro_batch_size=8, max_steps=3, max_tokens=8, save_steps=50,
                              stall_warning_timeout=20, stall_timeout=45, preflight="off")
    wait_for_memory()
    run = subprocess.Popen([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        while run.poll() is None and not any(r.get("step") == 1 and "reward" in r for r in jsonl(out / "metrics.jsonl")):
            time.sleep(0.2)
        stopped(server)
        output, errors = run.communicate(timeout=600)
    finally:
        continued(server)
        if run.poll() is None:
            run.kill()
    print(output[-3000:], errors[-3000:], sep="\n")
    assert run.returncode == 5, errors[-3000:]
    # the line about the stopped server (small limits: a loaded machine's first batch may have its own)
    warning = [line for line in output.splitlines() if line.startswith("[vf-rl] watchdog:")][-1]
    assert LINE.match(warning), output[-3000:]
    # the server's state: its GET /metrics timed out (5 s), or, on a loaded machine, the look as a
    # whole had not come back within the watch's 10 s
    assert re.search(r"(: no answer to GET /metrics in 5 s \(the server is stopped or hung\)"
                     r"|; vf-vllm gave no answer in \d+ s \(stopped or hung\)) "
                     r"\(stopping the run after 45 s without progress: stall_timeout\)$", warning), warning
    last = errors.strip().splitlines()[-1]
    assert last.startswith("[vf-rl] watchdog: stopping the run: the trainer has waited ") and LINE.match(last), errors
    assert last.endswith(f"checkpoint-1 (the last complete step) is in {out}: run with --resume to go on from step 2")
    assert "Traceback" not in errors
    assert (out / "checkpoint-1" / "trainer_state.json").is_file()
    rows_before = jsonl(out / "batches.jsonl")[0]

    resumed = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config), "--resume"],
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"Resuming from {out / 'checkpoint-1'} (step 1)" in resumed.stdout
    assert [r["step"] for r in jsonl(out / "metrics.jsonl") if "reward" in r] == [1, 2, 3]
    batches = jsonl(out / "batches.jsonl")
    assert [b["step"] for b in batches] == [1, 2, 3] and batches[0] == rows_before
    assert (out / "checkpoint-3" / "trainer_state.json").is_file()
