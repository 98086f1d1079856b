"""Faults, as a user meets them, with real tmux, a real vf-vllm and real kills:

- a server that cannot start (a flag vLLM's parser accepts but the engine refuses): ``vf-rl
  --wait`` ends within seconds, non-zero, with vLLM's error line and the log paths;
- the server killed with SIGKILL mid-run (as an OOM kill would), or its engine process alone
  mid-generation or mid-push: ``vf-rl`` restarts it, the trainer pushes the current weights and
  regenerates the batch in flight, and the run ends with every step once and the same dataset
  rows per step as an undisturbed run;
- the supervisor's restart rules, in bash, without vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CORES, free_port, start_server, wait_for_memory, write_cpu_config

from vf_rl.config.cpus import SERVER_CORES_ENV
from vf_rl.config.schema import load_config
from vf_rl.inference.supervision import supervised_shell
from vf_rl.parent_watch import kill_tree


def launch(config: Path, session: str, cwd: Path, timeout: float = 900) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "-s", session, "--wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)


def jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def server_pids(out: Path) -> list[int]:
    """The vf-vllm processes of the run whose output_dir is ``out`` (they read its resolved.toml)."""
    import psutil

    resolved = str(out.resolve() / "resolved.toml")
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        argv = p.info["cmdline"] or []  # the server's own argv, not a shell's or tmux's line that names it
        if any(a.endswith(("vf-vllm", "vf_rl.inference.server")) and argv[i + 1:i + 3] == ["@", resolved]
               for i, a in enumerate(argv)):
            found.append(p.info["pid"])
    return sorted(found)


def no_server_left(out: Path) -> bool:
    return not server_pids(out)


@pytest.mark.parametrize("status, trainer_done, restarts", [(137, False, 3), (0, False, 3), (1, False, 0),
                                                            (130, False, 0), (137, True, 0), (0, True, 0)])
def test_supervisor_restarts_only_a_killed_server_while_the_trainer_runs(tmp_path, status, trainer_done, restarts):
    """The Inference pane's loop: SIGKILL'd (137) or ended by itself (0: vLLM's API server after its
    engine died) -> restarted (at most 3 times); a start-up error (1), Ctrl-C (130) or a finished
    trainer -> final, status in inference.exit."""
    trainer_exit = tmp_path / "trainer.exit"
    if trainer_done:
        trainer_exit.write_text("0\n")
    line = supervised_shell(f"bash -c 'echo run; exit {status}'", tmp_path / "log", tmp_path / "inference.exit",
                            tmp_path / "restarts", trainer_exit)
    env = {**os.environ}
    result = subprocess.run(["bash", "-c", line.replace("$((n*5))", "0")], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "inference.exit").read_text().strip() == str(status)
    assert (tmp_path / "log").read_text().count("run") == restarts + 1
    written = (tmp_path / "restarts").read_text().splitlines() if (tmp_path / "restarts").exists() else []
    assert len(written) == restarts


def test_supervisor_does_not_restart_a_server_that_ctrl_c_ended_with_status_0(tmp_path):
    """Ctrl-C reaches the pane's whole process group; vf-vllm then exits 0, as it does when its
    engine died. The loop's own trap tells the two apart: this end is final, not restarted."""
    command = "bash -c 'trap \"exit 0\" INT; echo run; sleep 1; kill -INT 0; sleep 5'"  # the group, as a terminal's Ctrl-C
    line = supervised_shell(command, tmp_path / "log", tmp_path / "inference.exit", tmp_path / "restarts",
                            tmp_path / "trainer.exit")
    # SIGINT at its default, as in a tmux pane: a shell that starts with it ignored cannot trap it, and an
    # earlier test in this worker process may have left it ignored
    result = subprocess.run(["bash", "-c", line.replace("$((n*5))", "0")], capture_output=True, text=True,
                            timeout=60, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (tmp_path / "inference.exit").read_text().strip() == "0", result.stdout + result.stderr
    assert (tmp_path / "log").read_text().count("run") == 1
    assert not (tmp_path / "restarts").exists()


def test_supervisor_restarts_a_server_that_served_again_after_its_count_is_used_up(tmp_path):
    """A server that ran for ``stable_s`` seconds before each kill is not a crash loop: killed 5
    times (more than MAX_RESTARTS), it is restarted every time; the 6th run's start-up error ends it."""
    runs = tmp_path / "runs"
    command = (f"bash -c 'echo run >> {runs}; sleep 1.2; [ $(wc -l < {runs}) -gt 5 ] && exit 1; exit 137'")
    line = supervised_shell(command, tmp_path / "log", tmp_path / "inference.exit", tmp_path / "restarts",
                            tmp_path / "trainer.exit", stable_s=1)
    result = subprocess.run(["bash", "-c", line.replace("$((n*5))", "0")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert runs.read_text().count("run") == 6
    assert len((tmp_path / "restarts").read_text().splitlines()) == 5
    assert (tmp_path / "inference.exit").read_text().strip() == "1"


@pytest.mark.server
def test_server_that_cannot_start_ends_the_run_in_seconds_with_its_error(model_dir, tmp_path):
    port = free_port()
    config = write_cpu_config(tmp_path / "bad.toml", model_dir, tmp_path / "run", port,
                              inference_args={"enforce_eager": True, "max_model_len": 100000},
                              batch_size=8, rollouts_per_example=4, micro_batch_size=4, max_steps=2, max_tokens=8)
    start = time.monotonic()
    run = launch(config, f"vf-rl-bad-{port}", tmp_path)
    out, _ = run.communicate(timeout=300)
    elapsed = time.monotonic() - start
    print(f"vf-rl --wait with a server that cannot start: exit {run.returncode} after {elapsed:.1f} s")
    assert run.returncode not in (0, None), out
    assert "max_model_len (100000) is greater than the derived max_model_len" in out, out
    assert "inference.log" in out and "trainer.log" in out
    trainer_log = (tmp_path / "run" / "logs" / "trainer.log").read_text()
    # the trainer saw the server exit (it does not wait out vllm_server_timeout)
    assert "vf-train: error: the inference server exited with status 1" in trainer_log
    assert "Traceback" not in trainer_log
    assert no_server_left(tmp_path / "run")


def engine_pids(server_pid: int) -> list[int]:
    """vLLM's engine processes under the vf-vllm process ``server_pid`` (the API server stays)."""
    import psutil

    return [p.pid for p in psutil.Process(server_pid).children(recursive=True) if "EngineCore" in p.name()]


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.parametrize("target", ["server", "engine", "engine-mid-push"])
def test_server_killed_mid_run_is_restarted_and_no_step_is_lost(server, model_dir, tmp_path, restore_base_weights,
                                                                target):
    """SIGKILL mid-run, once step 2 is logged: ``server``, vf-vllm and its engine (an OOM kill of
    the tree); ``engine``, vLLM's engine process alone, mid-generation (the API server answers 500
    and shuts itself down, status 0); ``engine-mid-push``, the engine alone once the next weight
    push has begun (its weights file rewritten). In each case the server is restarted, the current
    weights pushed, the lost batch generated again, and the run has the undisturbed run's steps."""
    common = dict(batch_size=8, rollouts_per_example=4, micro_batch_size=8, max_steps=4, max_tokens=8, save_steps=50)
    # the undisturbed reference: the same config against the session's server
    reference = write_cpu_config(tmp_path / "ref.toml", model_dir, tmp_path / "ref", server.port, **common)
    result = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(reference)], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert load_config(tmp_path / "ref" / "resolved.toml").trainer.args["max_steps"] == 4  # vf-train alone writes it

    port = free_port()
    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "kill.toml", model_dir, out, port,
                              inference_args={"enforce_eager": True, "max_model_len": 512}, **common)
    run = launch(config, f"vf-rl-kill-{port}", tmp_path)
    deadline, killed = time.monotonic() + 900, False
    weights, pushed_at = out / "weights", None
    while time.monotonic() < deadline and run.poll() is None and not killed:
        if any(r.get("step") == 2 and "reward" in r for r in jsonl(out / "metrics.jsonl")):
            pids = server_pids(out)
            assert pids, "no vf-vllm process found"
            if target == "server":
                kill_tree(pids[0])  # the server and its engine processes, as an OOM kill
                killed = True
            elif target == "engine":
                engines = engine_pids(pids[0])
                assert engines, "no engine process under vf-vllm"
                for pid in engines:
                    os.kill(pid, signal.SIGKILL)
                killed = True
            else:  # the weights file of the next push is being written or sent
                stamp = max((f.stat().st_mtime for f in weights.glob("*.safetensors")), default=None)
                pushed_at = stamp if pushed_at is None else pushed_at
                if stamp is not None and stamp > pushed_at:
                    for pid in engine_pids(pids[0]):
                        os.kill(pid, signal.SIGKILL)
                    killed = True
        time.sleep(0.05)
    assert killed, "step 2 was never logged"
    output, _ = run.communicate(timeout=900)
    logs = out / "logs"
    trainer_log = (logs / "trainer.log").read_text()
    assert run.returncode == 0, (output, trainer_log[-4000:])
    assert len((logs / "inference.restarts").read_text().splitlines()) == 1
    steps = [r for r in jsonl(out / "metrics.jsonl") if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert steps[-1]["server/reconnects"] >= 1
    assert "inference server back; current weights pushed" in trainer_log
    if target == "engine-mid-push":  # the push failed, and was made again to the restarted server (the CPU's
        # filesystem transport pushes before the next batch is submitted; a batch that waits for an overlapped
        # push that fails is test_group_sampling's)
        assert "the weight sync could not reach the inference server" in trainer_log, trainer_log[-4000:]
    if target != "server":  # vLLM's API server ended by itself once its engine died
        assert (logs / "inference.restarts").read_text().split()[-1] == "0"
    assert jsonl(out / "batches.jsonl") == jsonl(tmp_path / "ref" / "batches.jsonl")
    for r in steps:  # regenerated, not scored 0: no rollout of any step was lost to the kill
        assert r["errors/rate"] == 0.0, r
    assert no_server_left(out)


@pytest.mark.server
@pytest.mark.parametrize("pane, expected", [("trainer", 130), pytest.param("inference", 3, marks=pytest.mark.slow)])
def test_ctrl_c_in_either_pane_ends_both(model_dir, tmp_path, pane, expected):
    """Ctrl-C in the Trainer pane stops the trainer and then the server; Ctrl-C in the Inference
    pane is final (no restart) and the trainer stops at its next batch. No vLLM process is left."""
    port = free_port()
    session = f"vf-rl-ctrlc-{port}"
    out = tmp_path / "run"
    config = write_cpu_config(tmp_path / "c.toml", model_dir, out, port,
                              inference_args={"enforce_eager": True, "max_model_len": 512},
                              batch_size=8, rollouts_per_example=4, micro_batch_size=8, max_steps=200, max_tokens=8)
    run = launch(config, session, tmp_path)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and run.poll() is None:
        if any("reward" in r for r in jsonl(out / "metrics.jsonl")):
            break
        time.sleep(0.5)
    target = f"{session}:vf-rl.{1 if pane == 'trainer' else 0}"
    subprocess.run(["tmux", "send-keys", "-t", target, "C-c"], check=True)
    output, _ = run.communicate(timeout=300)
    assert run.returncode == expected, output
    assert f"trainer exited with status {expected}" in output
    assert not (out / "logs" / "inference.restarts").exists()
    assert subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0
    time.sleep(2)
    assert no_server_left(out)


@pytest.mark.slow
@pytest.mark.server
def test_ctrl_c_ends_the_server_when_its_engine_died_under_open_requests(model_dir, tmp_path):
    """The engine core dies while requests are open, then Ctrl-C: the API server cancels the
    requests it can no longer answer and exits (vf-vllm bounds uvicorn's graceful shutdown), rather
    than waiting for them with the pane and the port held."""
    import signal
    import threading

    import httpx
    import psutil

    servers = start_server(model_dir, tmp_path)
    server = next(servers)
    try:
        def ask():
            try:
                httpx.post(f"{server.base_url}/v1/completions", timeout=600,
                           json={"model": server.model, "prompt": "Count to one thousand:", "max_tokens": 900,
                                 "ignore_eos": True})
            except httpx.HTTPError:
                pass

        threads = [threading.Thread(target=ask, daemon=True) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(5)  # the requests are running
        engines = [p for p in psutil.Process(server.process.pid).children(recursive=True)
                   if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()]
        assert engines, [p.cmdline() for p in psutil.Process(server.process.pid).children(recursive=True)]
        for p in engines:
            p.kill()
        time.sleep(3)
        os.killpg(server.process.pid, signal.SIGINT)
        server.process.wait(timeout=240)
    finally:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGKILL)
            pytest.fail("vf-vllm still runs 240 s after Ctrl-C:\n" + server.log.read_text()[-2000:])


@pytest.mark.slow
@pytest.mark.server
def test_engine_killed_mid_broadcast_is_restarted_and_the_run_goes_on(model_dir, base_weights, tmp_path, monkeypatch,
                                                                      capfd):
    """The ``nccl`` transport's code (a broadcast group, here over gloo on the CPU; the trainer
    in this process) with vf-vllm under the Inference pane's restart loop: vLLM's engine process is
    SIGKILLed in the middle of the second weight update, once two of its buckets have gone out.
    The push ends with the server's answer that it was lost (not a broken-group error), the loop
    restarts the server, the trainer opens a new group with it and pushes the current weights, the
    batch that waited for the lost update is generated after that, and the run has every step once,
    no rollout lost, and the dataset rows of an undisturbed run."""
    import psutil
    import torch

    from vf_rl import RLConfig, RLTrainer
    from vf_rl.environments.reverse_text import load_environment
    from vf_rl.inference.client import InferenceClient
    from vf_rl.inference.communicator import BroadcastGroup
    from vf_rl.trainer import weight_sync as weight_sync_module
    from vf_rl.trainer.weight_sync import BroadcastSync

    port, files = free_port(), {k: tmp_path / k for k in ("inference.log", "inference.exit", "restarts", "trainer.exit")}
    command = (f"{sys.executable} -m vf_rl.inference.server --model {model_dir} --port {port} --enforce-eager "
               "--max-model-len 512")
    wait_for_memory()
    loop = subprocess.Popen(["bash", "-c", supervised_shell(command, files["inference.log"], files["inference.exit"],
                                                            files["restarts"], files["trainer.exit"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_CACHE_ROOT": str(tmp_path / "cache"),
                                 **({SERVER_CORES_ENV: CORES[0]} if CORES and SERVER_CORES_ENV not in os.environ
                                    else {})})
    pushes, sent, killed = [], [0], []  # buckets per weight update; of the current one sent; engines killed
    real_send, real_broadcast = BroadcastSync._send, BroadcastGroup.broadcast

    def send(self, snapshot):  # counts the weight updates and their buckets
        pushes.append(len(snapshot[0]))
        sent[0] = 0
        return real_send(self, snapshot)

    def broadcast(self, tensor, *args, **kwargs):  # the trainer's side: the engine dies after bucket 2 of update 2
        real_broadcast(self, tensor, *args, **kwargs)
        if self.rank == 0:
            sent[0] += 1
            if len(pushes) == 2 and sent[0] == 2 and not killed:
                engines = [p for p in psutil.Process(loop.pid).children(recursive=True) if "EngineCore" in p.name()]
                assert engines, "no engine process under vf-vllm"
                for p in engines:
                    p.kill()
                killed.append(len(engines))

    def make(kind, client, *args):  # 16 MB buckets: SmolLM2's ~540 MB of float32 weights in some 31 broadcasts
        return BroadcastSync(client, torch.device("cpu"), backend="gloo", timeout_s=120, bucket_bytes=16 << 20)

    monkeypatch.setattr(BroadcastSync, "_send", send)
    monkeypatch.setattr(BroadcastGroup, "broadcast", broadcast)
    monkeypatch.setattr(weight_sync_module, "choose_weight_sync", lambda *args, **kwargs: "nccl")
    monkeypatch.setattr(weight_sync_module, "make_weight_sync", make)

    def train(out: Path) -> str:
        args = RLConfig(output_dir=str(out), use_cpu=True, vllm_server_port=port, vllm_server_timeout=600,
                        batch_size=4, rollouts_per_example=2, micro_batch_size=4, max_tokens=8, max_steps=4,
                        learning_rate=1e-3, logging_steps=1, save_steps=100, report_to=[])
        env = load_environment("reverse-text", source="offline", num_train_examples=16, num_eval_examples=1)
        RLTrainer(model=str(model_dir), env=env, args=args, served_model_name=str(model_dir)).train()
        printed = capfd.readouterr()
        return printed.out + printed.err

    try:
        output = train(tmp_path / "run")
        assert killed, f"the second weight update never sent two buckets (updates: {pushes})"
        assert len(pushes) >= 4 and pushes[1] > 2  # the lost update had buckets left to send
        restarts = files["restarts"].read_text().splitlines()
        assert len(restarts) == 1 and restarts[0].split()[-1] == "0"  # vLLM's API server ended by itself
        assert "the weight sync could not reach the inference server" in output, output[-4000:]
        assert "inference server back; current weights pushed" in output
        # batch 4 was to be generated with update 2 (the weights after step 2): it is generated late, on-policy
        assert "[orchestrator] batch 4: the weight update it was to be generated with failed" in output, output[-4000:]
        steps = [r for r in jsonl(tmp_path / "run" / "metrics.jsonl") if "reward" in r]
        assert [r["step"] for r in steps] == [1, 2, 3, 4]
        assert steps[-1]["server/reconnects"] == 1 and steps[3]["off_policy/staleness"] == 0.0
        for r in steps:  # no rollout lost to the kill
            assert r["errors/rate"] == 0.0, r
        # the undisturbed reference, against the restarted server given the base weights back
        InferenceClient(port=port).update_weights(str(base_weights))
        pushes.clear()  # its second update is not killed: `killed` is not empty
        train(tmp_path / "ref")
        assert jsonl(tmp_path / "run" / "batches.jsonl") == jsonl(tmp_path / "ref" / "batches.jsonl")
    finally:
        files["trainer.exit"].write_text("0\n")
        kill_tree(loop.pid)
        loop.wait(timeout=60)
