"""benchmarks/learning.py: the JSON points, the rewards at fixed minutes, the time to reach the
best TRL side's final reward, the TRL side names, and --from-json (table and plot). The runs
themselves need a server and TRL for minutes each (benchmarks/RESULTS.md, *CPU*)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


def _learning():
    spec = importlib.util.spec_from_file_location("learning", REPO / "benchmarks" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run(rewards, step_s, first=30.0, evals=None):
    elapsed = [first + i * step_s for i in range(len(rewards))]
    return {"steps": list(range(1, len(rewards) + 1)), "elapsed_s": elapsed, "reward": rewards, "wait_s": None,
            "evals": evals or {}, "wall_s": elapsed[-1] + 10, "peak_gib": 1.0, "launch_to_step1_s": first + 5}


def test_points_start_at_step_one_with_the_evaluation_before():
    learning = _learning()
    pts = learning.points(run([0.1, 0.2, 0.3], 60.0, evals={0: 0.05, 3: 0.4}))
    assert pts == [[0.0, 0, None, 0.05], [0.0, 1, 0.1, None], [60.0, 2, 0.2, None], [120.0, 3, 0.3, 0.4]]


def test_reward_by_and_time_to_reach():
    learning = _learning()
    pts = learning.points(run([0.1, 0.2, 0.3, 0.4, 0.5], 60.0))
    assert learning.reward_by(pts, 120.0) == pytest.approx(0.2)  # steps 1-3 done by 2 minutes
    assert learning.reward_by(pts, 240.0) == pytest.approx(0.4)
    assert learning.time_to_reach(pts, 0.3) == 180.0  # the mean of steps 2-4 first reaches 0.3
    assert learning.time_to_reach(pts, 0.9) is None


def test_rewards_are_read_over_equal_wall_clock_not_equal_steps():
    """A side with 1 s steps is read over the 30 s before the mark (its last 3 steps alone would
    follow one step's noise), and reaches a target when that window's mean does."""
    learning = _learning()
    alternating = learning.points(run([1.0 if i % 2 == 0 else 0.0 for i in range(120)], 1.0))
    assert learning.reward_by(alternating, 60.0) == pytest.approx(0.5)  # 30 steps, 15 of each
    assert learning.reward_by(alternating, 60.0, window_s=2.0) == pytest.approx(2 / 3)  # the last 3: 1, 0, 1
    rising = learning.points(run([i / 100 for i in range(120)], 1.0))  # step i ends i s after step 1
    # the steps of (t - 30, t] average (t - 14.5) / 100: 0.5 first at t = 65 (the last 3 alone: t = 51)
    assert learning.time_to_reach(rising, 0.5) == 65.0
    summary = learning.summarize(run([i / 100 for i in range(120)], 1.0), rising, 128, 0)
    # 119 s trained: the 2-minute mark is read (steps 91-119 s), and the end (steps 90-119 s)
    assert list(summary["reward_at_min"]) == [2] and summary["reward_at_min"][2] == pytest.approx(1.05)
    assert summary["reward_final"] == pytest.approx(1.045)


def summarized(learning, sides: dict, env: str) -> dict:
    """A learning.py result (16 x 8 rollouts on a GPU) of the runs ``sides`` (name -> :func:`run`)."""
    result = {"settings": {"env": env, "model": "m", "prompts": 16, "rollouts": 8, "max_tokens": 128, "device": "gpu",
                           "lora_rank": 8, "lora_alpha": 32, "lr": 1e-4, "minutes": 8}, "sides": {}}
    for name, r in sides.items():
        pts = learning.points(r)
        result["sides"][name] = {"points": pts, "summary": learning.summarize(r, pts, 128, 0)}
    return result


def test_report_compares_with_the_fastest_trl_side(tmp_path):
    learning = _learning()
    sides = {"vf-rl": run([0.1, 0.3, 0.5, 0.6], 30.0), "trl": run([0.1, 0.2, 0.3, 0.4], 60.0),
             "trl-compile": run([0.1, 0.2, 0.3, 0.35], 40.0)}
    result = summarized(learning, sides, "reverse-text")
    table = learning.report(result)
    # trl-compile has the most rollouts/s (0.025 s^-1 * 128); vf-rl's 30 s steps are 1.33x faster
    assert "best TRL side (most rollouts/s): trl-compile; vf-rl / trl-compile rollouts per second: 1.33x" in table
    target = learning.reward_by(result["sides"]["trl-compile"]["points"], 120.0)
    assert f"s to reach trl-compile's final reward ({target:.3f})" in table
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learning.py"), "--from-json", str(path),
                          "--plot", str(tmp_path / "r.png")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "| reward at 2 min |" in out.stdout and (tmp_path / "r.png").stat().st_size > 1000


def test_the_compile_before_step_one_is_read_from_the_trainer_log():
    """vf-rl's compile before step 1 (the trainer log's ``compiled in`` line) reaches the summary
    and the table; a side without one (TRL, or vf-rl not compiling) shows "-"."""
    learning = _learning()
    log = ("Loading model m...\ntorch_compile: 30 decoder layers compile before the first step (warmup.py)\n"
           "torch_compile: compiled in 25.2 s on synthetic batches of 1096 tokens\n")
    assert learning.compile_seconds(log) == 25.2 and learning.compile_seconds("Loading model m...\n") is None
    sides = {"vf-rl": {**run([0.1, 0.3], 30.0), "compile_s": 25.2}, "trl": run([0.1, 0.2], 60.0)}
    table = learning.report(summarized(learning, sides, "reverse-text"))
    assert "| s of torch_compile before step 1 | 25.200 | - |" in table


def test_a_side_that_does_not_sample_its_trained_weights_is_left_out(tmp_path):
    """A TRL side whose vLLM generated with other weights than it trained (its log-probs 14 nats per
    token from the trainer's, as a broken colocated sync read on an H200) is faster and would be the
    'best' side: the table marks it, the ratio is against the valid side, the exit status is 3."""
    learning = _learning()
    sides = {"vf-rl": run([0.1, 0.3, 0.5, 0.6], 30.0) | {"logp_diff": [0.04, 0.05, None, 0.04]},
             "trl-liger": run([0.0, 0.0, 0.0, 0.0], 10.0) | {"logp_diff": [14.1, 13.8, 14.4, 14.0]},
             "trl": run([0.1, 0.2, 0.3, 0.4], 60.0) | {"logp_diff": [0.05, 0.6, 0.07, 0.06]}}
    result = summarized(learning, sides, "alphabet-sort")
    assert result["sides"]["vf-rl"]["summary"]["sampler_logp_gap"] == pytest.approx(0.04)
    assert result["sides"]["trl"]["summary"]["invalid"] is None
    assert "14.05 nats per token" in result["sides"]["trl-liger"]["summary"]["invalid"]
    table = learning.report(result)
    assert "best TRL side (most rollouts/s): trl; vf-rl / trl rollouts per second: 2.00x" in table
    assert "NOT A MEASUREMENT: trl-liger: its sampler's log-probs differ" in table
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learning.py"), "--from-json", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 3, out.stderr
    assert "| sampler-trainer log-prob gap (nats/token) | 0.040 | 14.050 | 0.065 |" in out.stdout


def test_from_json_merges_runs_of_one_side_each(tmp_path):
    """Sides run at once on two GPUs of a host write one JSON each; --from-json twice gives one
    table, plot and --json with both, and refuses runs that do not compare."""
    learning = _learning()
    settings = {"env": "reverse-text", "model": "m", "prompts": 16, "rollouts": 8, "max_tokens": 128,
                "device": "gpu", "lora_rank": 8, "lora_alpha": 32, "lr": 1e-4, "minutes": 8}
    paths = []
    for name, r in (("vf-rl", run([0.1, 0.3, 0.5, 0.6], 30.0)), ("trl-liger", run([0.1, 0.2, 0.3, 0.4], 60.0))):
        pts = learning.points(r)
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"settings": {**settings, "sides": name}, "sides": {
            name: {"points": pts, "summary": learning.summarize(r, pts, 128, 0)}}}))
    cmd = [sys.executable, str(REPO / "benchmarks" / "learning.py"), "--from-json", str(paths[0]), "--from-json",
           str(paths[1])]
    out = subprocess.run([*cmd, "--json", str(tmp_path / "both.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "best TRL side (most rollouts/s): trl-liger; vf-rl / trl-liger rollouts per second: 2.00x" in out.stdout
    both = json.loads((tmp_path / "both.json").read_text())
    assert list(both["sides"]) == ["vf-rl", "trl-liger"] and both["settings"]["sides"] == "vf-rl,trl-liger"
    out = subprocess.run([*cmd[:4], "--from-json", str(paths[0])], capture_output=True, text=True)  # one side twice
    assert out.returncode == 2 and "side 'vf-rl' is in more than one run" in out.stderr
    other = json.loads(paths[1].read_text())
    other["settings"]["max_tokens"] = 64
    paths[1].write_text(json.dumps(other))
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 2 and "the runs differ in max_tokens" in out.stderr
    paths[1].write_text("[1, 2]")
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 2 and "not a learning.py --json result" in out.stderr


def test_gpu_queries_read_only_the_visible_gpus(tmp_path, monkeypatch):
    """nvidia-smi (a stand-in here: no GPU) is asked for the CUDA_VISIBLE_DEVICES GPUs when set,
    else every GPU; its rows become the peak sampler's memory and the result's card names."""
    learning = _learning()
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$*\" in\n*--id=1*) id=1 ;;\n*--id=*) echo 'No devices were found'; exit 6 ;;\n"
                    "*) id=all ;;\nesac\ncase \"$1\" in\n*name*) [ $id = all ] && echo 'NVIDIA H100, 81559'; "
                    "echo 'NVIDIA H200, 143771' ;;\n*) [ $id = all ] && echo 1000; echo 2000 ;;\nesac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert learning.gpu_names() == [{"name": "NVIDIA H100", "memory_total_mib": 81559},
                                    {"name": "NVIDIA H200", "memory_total_mib": 143771}]
    assert learning.PeakSampler._gpu_used() == 3000 * 2**20
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert learning.gpu_names() == [{"name": "NVIDIA H200", "memory_total_mib": 143771}]
    assert learning.PeakSampler._gpu_used() == 2000 * 2**20
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # nvidia-smi's message is not a GPU
    assert learning.gpu_names() == [] and learning.PeakSampler._gpu_used() == 0


def test_trl_side_names():
    learning = _learning()
    assert learning.trl_options("trl") == {}
    assert learning.trl_options("trl-compile-liger") == {"torch_compile": True, "use_liger_kernel": True}
    assert learning.trl_options("trl-async") == {"async": True}
    for name in ("trl-fast", "trl-async-liger"):  # TRL's async trainer takes none of the GRPOTrainer options
        with pytest.raises(ValueError, match="is not vf-rl, trl"):
            learning.trl_options(name)
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learning.py"), "--sides", "vf-rl,trl-fast"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "trl-fast" in out.stderr
    # the async trainer runs against TRL's server on GPUs only, and single-turn environments only
    for extra in ([], ["--device", "gpu", "--trl-vllm", "colocate"],
                  ["--device", "gpu", "--trl-vllm", "server", "--env", "alphabet-sort"]):
        out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learning.py"), "--sides", "trl-async", *extra],
                             capture_output=True, text=True)
        assert out.returncode == 2 and "trl-async: TRL's async trainer needs --device gpu and --trl-vllm server" \
            in out.stderr, extra
        assert "Traceback" not in out.stderr and out.stderr.strip().splitlines()[-1].startswith("learning.py: error:")


def test_the_async_sides_server_serves_runtime_adapters(tmp_path, monkeypatch):
    """trl-async's server is started as TRL's async trainer asks for LoRA (adapter-only syncs):
    TRL's own vllm-serve parser passes the LoRA flags through to ``vllm serve``; the other server
    sides keep merged-weight syncs."""
    learning = _learning()
    started = []
    monkeypatch.setattr(learning.subprocess, "Popen", lambda argv, **kw: started.append((argv, kw["env"])))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    opts = SimpleNamespace(trl_server_url="http://127.0.0.1:8001", model="/models/m", enforce_eager=False,
                           lora_rank=8)
    before = dict(os.environ)
    learning.start_trl_server(opts, tmp_path, adapters=True)
    learning.start_trl_server(opts, tmp_path)
    assert dict(os.environ) == before  # nothing leaks into the sides started after the server
    monkeypatch.undo()  # subprocess.Popen itself again, for the check below
    (argv, env), (plain_argv, plain_env) = started
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    # compile caches of its own (--caches cold, the default): a side started after another starts cold too
    assert env["VLLM_CACHE_ROOT"] == str((tmp_path / "caches" / "trl-vllm" / "vllm").resolve())
    assert {env[v] for v in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")} \
        .isdisjoint(learning.side_caches(opts, tmp_path, "vf-rl").values())
    assert learning.side_caches(SimpleNamespace(caches="shared"), tmp_path, "vf-rl") == {}
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain_env and "--enable-lora" not in plain_argv
    # TRL's parser in a process of its own: importing it imports vLLM, which sets VLLM_LOGGING_LEVEL in os.environ
    read = ("import json, sys\nfrom trl.scripts import vllm_serve\n"
            "args, extra = vllm_serve.make_parser().parse_args_and_config(sys.argv[1:], return_remaining_strings=True)\n"
            "print(json.dumps(vllm_serve.build_command(args, extra)))")
    out = subprocess.run([sys.executable, "-c", read, *argv[3:]], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    command = json.loads(out.stdout.strip().splitlines()[-1])
    assert command[command.index("serve") + 1] == "/models/m"
    assert "--enable-lora" in command and command[command.index("--max-lora-rank") + 1] == "8"
    assert [learning.served_lora_rank(r) for r in (1, 4, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    # TRL's trainer needs max_staleness + 2 adapter slots (one loads before the oldest unloads)
    assert command[command.index("--max-loras") + 1] == str(learning.ASYNC_MAX_STALENESS + 2)


def test_the_async_sides_attention_is_causal_attention_per_segment():
    """``varlen_flash_attn``, the FlashAttention-3 call of TRL's async trainer served by vf-rl's
    packed attention (on the CPU: one SDPA per segment): segments whose queries are the last of
    their keys (bottom-right causal), grouped-query heads, against attention written out."""
    import itertools

    import torch

    learning = _learning()
    g = torch.Generator().manual_seed(0)
    lq, lk, hq, hkv, d, scale = [3, 5, 4], [6, 5, 9], 4, 2, 8, 0.3
    q = torch.randn(sum(lq), hq, d, generator=g)
    k, v = torch.randn(2, sum(lk), hkv, d, generator=g)
    cq, ck = ([0, *itertools.accumulate(n)] for n in (lq, lk))
    out = learning.varlen_flash_attn(q, k, v, torch.tensor(cq, dtype=torch.int32), torch.tensor(ck, dtype=torch.int32),
                                     max(lq), max(lk), softmax_scale=scale, causal=True)
    expected = []
    for s in range(len(lq)):
        qs = q[cq[s]:cq[s + 1]]
        ks, vs = (x[ck[s]:ck[s + 1]].repeat_interleave(hq // hkv, dim=1) for x in (k, v))  # query head h: kv h // 2
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        later = torch.arange(lk[s])[None] > torch.arange(lq[s])[:, None] + (lk[s] - lq[s])
        expected.append(torch.einsum("hqk,khd->qhd", scores.masked_fill(later, float("-inf")).softmax(-1), vs))
    assert out.shape == q.shape
    assert torch.allclose(out, torch.cat(expected), atol=1e-5)
    with pytest.raises(NotImplementedError, match="without a window"):
        learning.varlen_flash_attn(q, k, v, torch.tensor(cq, dtype=torch.int32), torch.tensor(ck, dtype=torch.int32),
                                   max(lq), max(lk), window_size=(4, 0))


@pytest.mark.slow
def test_trl_side_runs_a_multi_turn_environment(tmp_path):
    """alphabet-sort's TRL side: GRPOTrainer's rollout_func runs the environment's two turns
    (transformers sampling on the CPU), scores them with its rubric, and evaluates held-out rows; each
    step of 4 rollouts trains as 2 micro batches of 2 (--trl-micro-batch, gradient accumulation)."""
    path = tmp_path / "result.json"
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learning.py"), "--env", "alphabet-sort",
                          "--device", "cpu", "--sides", "trl", "--minutes", "0.05", "--steps", "2", "--prompts", "2",
                          "--rollouts", "2", "--trl-micro-batch", "2", "--max-tokens", "32", "--eval-examples", "1",
                          "--eval-rollouts", "2", "--out", str(tmp_path / "run"), "--json", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    side = json.loads(path.read_text())["sides"]["trl"]
    rewards = [p[2] for p in side["points"] if p[2] is not None]
    assert rewards and all(0.0 <= r <= 1.0 for r in rewards)
    assert side["summary"]["eval_before"] is not None and side["summary"]["eval_after"] is not None
    log = (tmp_path / "run" / "trl" / "trl.log").read_text()
    # the turns were sampled: a rollout that failed is one end token (TRL logs completion lengths of 1)
    lengths = [float(x) for x in re.findall(r"'completions/mean_length': '([0-9.e+-]+)'", log)]
    assert lengths and min(lengths) > 1.0
    assert "rollout_func" in log  # TRL's experimental-feature warning: the multi-turn path ran
    assert [p[1] for p in side["points"] if p[2] is not None] == [1, 2]  # optimizer steps, not micro batches


def test_trl_micro_batch_must_divide_the_step():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learning.py"), "--sides", "trl",
                          "--prompts", "16", "--rollouts", "8", "--trl-micro-batch", "48"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--trl-micro-batch must divide the step's 128 rollouts" in out.stderr
    learning = _learning()
    # alphabet-sort's TRL side steps in micro batches of 32 at the 128 rollouts (one of 128 ran out of memory)
    assert learning.default_trl_micro_batch(learning.ENVS["alphabet-sort"], 128) == 32
    assert learning.default_trl_micro_batch(learning.ENVS["alphabet-sort"], 8) is None  # a CPU smoke run's step
    assert learning.default_trl_micro_batch(learning.ENVS["reverse-text"], 128) is None


def test_stability_rule(tmp_path):
    """scripts/stability.py: a reward that stays > 0.1 below its best for more than the window, or
    an entropy under the floor, breaks the rule (exit 1); a steady climb keeps it (exit 0)."""
    spec = importlib.util.spec_from_file_location("stability", REPO / "scripts" / "stability.py")
    stability = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stability)
    climb = [{"step": i, "reward": 0.1 + 0.002 * i, "entropy": 1.0} for i in range(1, 101)]
    assert stability.verdict(climb, 0.1, 50, 0.2, 0)["holds"]
    fall = [{**r, "reward": 0.05} if r["step"] > 40 else r for r in climb]
    v = stability.verdict(fall, 0.1, 50, 0.2, 0)
    assert not v["holds"] and v["longest_drop_steps"] == 60
    sharp = [{**r, "entropy": 0.1} if r["step"] == 90 else r for r in climb]
    v = stability.verdict(sharp, 0.1, 50, 0.2, 0)
    assert not v["holds"] and (v["min_entropy"], v["min_entropy_step"]) == (0.1, 90)
    for steps, code in ((climb, 0), (fall, 1)):
        path = tmp_path / "metrics.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in steps))
        out = subprocess.run([sys.executable, str(REPO / "scripts" / "stability.py"), str(path), "--json",
                              str(tmp_path / "v.json")], capture_output=True, text=True)
        assert out.returncode == code, out.stderr
        written = json.loads((tmp_path / "v.json").read_text())
        assert written["verdict"]["holds"] == (code == 0) and len(written["steps"]) == 100
        assert written["steps"][40] == {"step": 41, "reward": steps[40]["reward"], "entropy": 1.0}
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "stability.py"), str(tmp_path / "none.jsonl")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "no such file" in out.stderr


@pytest.mark.server
@pytest.mark.slow  # a benchmark tool (benchmarks/generation.py) against a real server: minutes, not a product path
def test_generation_probe_against_the_server(server, tmp_path):
    """benchmarks/generation.py measures batches through the orchestrator against a real server."""
    out = tmp_path / "gen.json"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "generation.py"), "--model", server.model,
                             "--base-url", f"{server.base_url}/v1", "--prompts", "2", "--rollouts", "2",
                             "--max-tokens", "8", "--rounds", "1", "--warmup", "0", "--modes", "idle",
                             "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    results = report["results"]
    assert report["server_start_s"] == []  # a --base-url server is not started here
    assert set(results) == {"chat-thread", "group-thread", "group-process"}
    for path, modes in results.items():
        idle = modes["idle"]
        assert len(idle["s_per_batch"]) == 1 and idle["tokens_per_batch"] > 0 and f"{path} " in result.stdout
        # the longest rollout has at most max_tokens (8) completion tokens: at least 1/8 of the batch's ms per token
        assert idle["ms_per_longest_token"] >= 1000 * idle["s_per_batch"][0] / 8 and idle["gpu_busy"] is None


def test_vf_and_env_args_are_toml_values():
    learning = _learning()
    assert learning.toml_pairs(["max_off_policy_steps=2", 'loss_type = "dapo"', "beta=0.01"]) == {
        "max_off_policy_steps": 2, "loss_type": "dapo", "beta": 0.01}
    with pytest.raises(SystemExit, match="--vf-arg"):
        learning.toml_pairs(["loss_type=dapo"])
    with pytest.raises(SystemExit, match="--env-arg"):
        learning.toml_pairs(["few_shot=two"], "--env-arg")


def test_vllm_args_reach_the_vf_rl_sides_inference_table(tmp_path):
    learning = _learning()
    opts = SimpleNamespace(device="gpu", enforce_eager=False, shared=True, vllm_memory=0.3, env="alphabet-sort",
                           model="/m", prompts=16, rollouts=8, micro_batch=128, max_tokens=128, steps=10, minutes=8.0,
                           lr=1e-4, lora_rank=8, lora_alpha=32, seed=42, eval_every=10 ** 6, eval_examples=32,
                           eval_rollouts=2, full_weights=False, no_eval=False, vf_arg=["torch_compile=false"],
                           vllm_arg=["api_server_count=4", "gpu_memory_utilization=0.25"])
    config = learning.vf_rl_config(opts, learning.ENVS["alphabet-sort"], tmp_path, 8123)
    assert config["inference"]["args"]["api_server_count"] == 4
    assert config["inference"]["args"]["gpu_memory_utilization"] == 0.25  # --vllm-arg wins over --vllm-memory
    assert config["trainer"]["args"]["torch_compile"] is False and "api_server_count" not in config["trainer"]["args"]
    with pytest.raises(SystemExit, match="--vllm-arg"):
        learning.vf_rl_config(SimpleNamespace(**{**vars(opts), "vllm_arg": ["api_server_count=four"]}),
                              learning.ENVS["alphabet-sort"], tmp_path, 8123)


def test_scaling_table_reads_each_layouts_run(tmp_path):
    """benchmarks/scaling.py: per layout (from the file name) the median step after the warm-up, rollouts
    and tokens per second, per GPU; a file that names no layout or has too few steps is one line, exit 2."""
    def write(name, step_s, tokens, wait):
        lines = [{"step": 0, "eval/reward": 0.1}]
        elapsed = 0.0
        for i, s in enumerate(step_s, 1):
            elapsed += s
            lines.append({"step": i, "reward": 0.5, "timing/elapsed_s": elapsed, "tokens/trained": tokens,
                          "timing/wait_s": wait * s})
        (tmp_path / name).write_text("\n".join(json.dumps(x) for x in lines))
        return str(tmp_path / name)

    two = write("scale-1-1.metrics.jsonl", [30.0, 9.0, 2.0, 2.0, 2.0, 4.0, 2.0], 40000, 0.5)
    four = write("scale-2-2.metrics.jsonl", [40.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0], 40000, 0.1)
    script = [sys.executable, str(REPO / "benchmarks" / "scaling.py")]
    out = subprocess.run([*script, four, two, "--warmup", "1", "--json", str(tmp_path / "s.json"),
                          "--plot", str(tmp_path / "s.png")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    layouts = json.loads((tmp_path / "s.json").read_text())["layouts"]
    # step 2's 9 s is warm-up; steps 3-7 take 2, 2, 2, 4, 2 s and 1 s on four GPUs
    assert layouts["scale-1-1"]["step_s_median"] == 2.0 and layouts["scale-1-1"]["rollouts_per_s"] == 64.0
    assert layouts["scale-2-2"]["tokens_trained_per_s"] == 40000 and layouts["scale-2-2"]["tokens_per_s_per_gpu"] == 10000
    assert layouts["scale-1-1"]["wait_fraction"] == pytest.approx(0.5)
    assert out.stdout.index("scale-1-1") < out.stdout.index("scale-2-2") and (tmp_path / "s.png").stat().st_size > 1000
    short = write("scale-1-3.metrics.jsonl", [1.0, 1.0], 10, 0.0)
    for bad, message in ((short, "2 steps, at least 5 needed"), (str(tmp_path / "scale-4-4.jsonl"), "No such file"),
                         (write("run.metrics.jsonl", [1.0] * 6, 10, 0.0), "does not say the layout")):
        out = subprocess.run([*script, bad], capture_output=True, text=True)
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_generation_probe_reads_the_gpus_busy_share_from_nvidia_smi(tmp_path, monkeypatch):
    """GpuBusy averages nvidia-smi's utilization samples of the first visible GPU (a stand-in
    nvidia-smi here: no GPU) and reads None without one."""
    spec = importlib.util.spec_from_file_location("generation", REPO / "benchmarks" / "generation.py")
    generation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generation)
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\necho 40\necho 90\necho "$@" > {tmp_path}/args\nexec sleep 600\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    with generation.GpuBusy() as busy:
        while not (tmp_path / "args").exists():  # both samples written
            time.sleep(0.05)
    assert busy.share == pytest.approx(0.65)
    assert (tmp_path / "args").read_text().split()[:2] == ["-i", "3"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with generation.GpuBusy() as busy:
        pass
    assert busy.share is None


ADAPTER_CHECK = r"""
import inspect, os, sys
sys.path.insert(0, sys.argv[2])
from learning import keep_published_adapters
from trl.experimental.async_grpo import async_grpo_trainer as trainer_module
import accelerate, peft, transformers
# TRL deletes stale versions through its module's shutil, where the patch sits
assert "shutil.rmtree(os.path.join(self._lora_dir" in inspect.getsource(trainer_module.AsyncGRPOTrainer._sync_weight_lora)
keep_published_adapters(trainer_module)
config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2)
model = peft.get_peft_model(transformers.LlamaForCausalLM(config), peft.LoraConfig(r=2, target_modules=["q_proj"]))
root = os.path.join(sys.argv[1], ".vllm_lora")
for version in (1, 2):  # TRL's own publishing: staged in .trl-policy-vN.tmp, renamed into place
    trainer_module.save_lora_adapter(model, accelerate.Accelerator(cpu=True), "default", f"{root}/trl-policy-v{version}")
trainer_module.shutil.rmtree(os.path.join(root, "trl-policy-v1"), ignore_errors=True)  # as _sync_weight_lora does
other = os.path.join(sys.argv[1], "other")
os.makedirs(other)
trainer_module.shutil.rmtree(other)
print(sorted(os.listdir(root)), os.path.exists(other))
"""


def test_trl_async_keeps_the_adapters_queued_requests_name(tmp_path):
    """TRL's async trainer deleted an adapter version that queued requests still named, and vLLM's
    engine died reloading it: with ``keep_published_adapters`` TRL's own publish-and-delete keeps
    every published version (with its ``adapter_config.json``), and still removes its staging
    directories and any other path. A subprocess: TRL's async module imports vLLM."""
    out = subprocess.run([sys.executable, "-c", ADAPTER_CHECK, str(tmp_path), str(REPO / "benchmarks")],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "['trl-policy-v1', 'trl-policy-v2'] False"
    for version in (1, 2):
        assert (tmp_path / ".vllm_lora" / f"trl-policy-v{version}" / "adapter_config.json").is_file()


def test_fixed_length_environment_asks_every_side_to_sample_max_tokens(tmp_path, monkeypatch):
    """--env fixed-length: the environment (benchmarks/fixed_length.py, found on PYTHONPATH) and its
    recipe (what the orchestrator's process builds) put vLLM's ignore_eos in the group request's body;
    TRL's side gets the same flag, or transformers' min_new_tokens without vLLM; --full-weights and
    --no-eval reach vf-rl's config, and max_seq_len keeps the environment's room for prompts."""
    from vf_rl import load_environment
    from vf_rl.env_api.group_sampling import completion_args
    from vf_rl.env_api.rollout import merge_sampling_args

    learning = _learning()
    monkeypatch.syspath_prepend(str(learning.BENCHMARKS_DIR))
    spec = learning.seq_len_for(learning.ENVS["fixed-length"], 2048)
    assert spec.max_seq_len == 2560 and learning.seq_len_for(learning.ENVS["reverse-text"], 24).max_seq_len == 512
    for env in (load_environment(spec.env_id, **spec.args), load_environment(spec.env_id, **spec.args).recipe()):
        args, _ = completion_args(merge_sampling_args(env.sampling_args, {"max_tokens": 2048, "temperature": 1.0}))
        assert args["ignore_eos"] is True and args["max_tokens"] == 2048
        assert env.get_dataset()[0]["prompt"][0]["role"] == "system"  # the base environment's rows
    opts = SimpleNamespace(device="gpu", enforce_eager=False, shared=True, vllm_memory=0.3, env="fixed-length",
                           model="/m", prompts=16, rollouts=16, micro_batch=16, max_tokens=2048, steps=12,
                           minutes=60.0, lr=1e-6, lora_rank=8, lora_alpha=32, seed=42, eval_every=10 ** 6,
                           eval_examples=32, eval_rollouts=2, full_weights=True, no_eval=True, vf_arg=[], vllm_arg=[],
                           trl_vllm="colocate")
    config = learning.vf_rl_config(opts, spec, tmp_path, 8123)
    trainer = config["trainer"]["args"]
    assert config["env"]["id"] == "fixed_length" and trainer["use_lora"] is False and "lora_rank" not in trainer
    assert trainer["eval_strategy"] == "no" and trainer["max_seq_len"] == 2560
    assert config["inference"]["args"]["max_model_len"] == 3072
    assert learning.trl_generation_kwargs(opts, spec) == {"ignore_eos": True}
    opts.trl_vllm = "none"
    assert learning.trl_generation_kwargs(opts, spec) == {"min_new_tokens": 2048}
    assert learning.trl_generation_kwargs(opts, learning.ENVS["reverse-text"]) == {}
    assert learning.side_env(opts, tmp_path, "vf-rl")["PYTHONPATH"].split(os.pathsep)[0] == str(learning.BENCHMARKS_DIR)


@pytest.mark.slow
def test_fixed_length_sides_train_full_weights_on_completions_of_max_tokens(tmp_path):
    """Both sides end to end on the CPU, the user-size benchmark's code path at a tiny size: a random
    Qwen3-shaped model with Qwen3's vocabulary (make_random_model.py --pad-vocab), full weights, no
    evaluations; every completion of every step has --max-tokens tokens on both sides (vf-rl through
    vf-vllm's ignore_eos, TRL through transformers' min_new_tokens), and the table reads them per second."""
    model = tmp_path / "qwen3-tiny"
    tokenizer = Path(os.environ.get("VF_RL_CACHE", Path.home() / ".cache" / "vf-rl")) / "models" / "SmolLM2-135M-Instruct"
    subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "make_random_model.py"), "--config", "qwen3-tiny",
                    "--tokenizer", str(tokenizer), "--pad-vocab", "--out", str(model)], check=True, capture_output=True)
    path = tmp_path / "result.json"
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learning.py"), "--env", "fixed-length", "--device",
                          "cpu", "--model", str(model), "--max-tokens", "16", "--prompts", "2", "--rollouts", "2",
                          "--micro-batch", "2", "--trl-micro-batch", "2", "--steps", "3", "--warmup", "1",
                          "--minutes", "30", "--no-eval", "--full-weights", "--lr", "1e-6", "--sides", "vf-rl,trl",
                          "--vf-arg", "vllm_server_timeout=1200",  # a busy 2-core machine starts vLLM slowly
                          "--out", str(tmp_path / "run"), "--json", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    sides = json.loads(path.read_text())["sides"]
    for name in ("vf-rl", "trl"):
        summary = sides[name]["summary"]
        assert summary["steps"] == 3 and summary["completion_tokens_per_step"] == 4 * 16, name
        assert summary["tokens_trained_per_s"] == pytest.approx(64 / summary["step_s_median"]), name
        assert summary["eval_before"] is None
    metrics = [json.loads(line) for line in (tmp_path / "run" / "vf-rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens/loss"] for r in metrics if "tokens/loss" in r] == [64.0] * 3
    assert "use_lora = false" in (tmp_path / "run" / "vf-rl" / "resolved.toml").read_text()
    lengths = re.findall(r"'completions/mean_length': '([0-9.e+-]+)'", (tmp_path / "run" / "trl" / "trl.log").read_text())
    assert [float(x) for x in lengths] == [16.0] * 3
    assert "completion tokens trained / s" in out.stdout
