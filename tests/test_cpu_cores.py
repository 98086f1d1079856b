"""CPU-only runs: the launcher splits the cores between vf-vllm and vf-train, as it splits GPUs."""

import os
import subprocess
import sys

import pytest

from vf_rl.config import cpus
from vf_rl.config.schema import load_config
from vf_rl.launcher.launch import build_commands

CONFIG = '''
model = "HuggingFaceTB/SmolLM2-135M-Instruct"
[env]
id = "reverse-text"
[inference]
gpus = {inf}
[trainer]
gpus = {train}
[trainer.args]
vllm_server_port = 8123
'''


def test_cpu_lists_round_trip_and_bad_values():
    assert cpus.format_cpu_list([5, 0, 1, 2]) == "0-2,5"
    assert cpus.parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    assert cpus.parse_cpu_list(cpus.format_cpu_list([1, 3, 4, 7])) == {1, 3, 4, 7}
    for bad in ("", "x", "3-1", "-2", "1,,2"):
        with pytest.raises(ValueError, match="VF_RL_CPU_CORES"):
            cpus.parse_cpu_list(bad)


def test_split_gives_the_server_the_first_half():
    assert cpus.split_cpu_cores([0, 1]) == ("0", "1")
    assert cpus.split_cpu_cores(list(range(8))) == ("0-3", "4-7")
    assert cpus.split_cpu_cores([2, 4, 6, 9, 10]) == ("2,4", "6,9-10")
    assert cpus.split_cpu_cores([3]) is None  # one core: both sides share it


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv(cpus.SERVER_CORES_ENV, raising=False)
    monkeypatch.delenv(cpus.TRAINER_CORES_ENV, raising=False)


def test_launcher_splits_cores_only_when_both_sides_are_on_the_cpu(tmp_path, four_cores, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(inf=0, train=0))
    inference, trainer = build_commands(load_config(path), path, [])
    assert inference.env[cpus.SERVER_CORES_ENV] == "0-1" and trainer.env[cpus.TRAINER_CORES_ENV] == "2-3"
    assert "VLLM_CPU_OMP_THREADS_BIND=0-1" in inference.line() and "VF_RL_CPU_CORES=2-3" in trainer.line()

    path.write_text(CONFIG.format(inf=1, train=0))  # the server on a GPU: the trainer keeps every core
    inference, trainer = build_commands(load_config(path), path, ["0"])
    assert cpus.SERVER_CORES_ENV not in inference.env and cpus.TRAINER_CORES_ENV not in trainer.env

    path.write_text(CONFIG.format(inf=0, train=0))  # the user's own setting wins, per side
    monkeypatch.setenv(cpus.TRAINER_CORES_ENV, "all")
    inference, trainer = build_commands(load_config(path), path, [])
    assert inference.env[cpus.SERVER_CORES_ENV] == "0-1" and cpus.TRAINER_CORES_ENV not in trainer.env


def test_trainer_pins_itself_and_sizes_torch_threads_before_torch_starts():
    core = max(os.sched_getaffinity(0))
    code = ("import os; from vf_rl.config.cpus import apply_trainer_cores; apply_trainer_cores(); import torch; "
            "print(sorted(os.sched_getaffinity(0)), torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, cpus.TRAINER_CORES_ENV: str(core)}, check=True)
    assert out.stdout.split() == [f"[{core}]", "1"]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, cpus.TRAINER_CORES_ENV: "all"}, check=True)
    assert out.stdout.split()[-1] == str(len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("value, message", [("9999", "not among the cores"), ("one", "expected core ids")])
def test_vf_train_rejects_bad_cores_in_one_line(tmp_path, value, message):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(inf=0, train=0))
    run = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(path)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, cpus.TRAINER_CORES_ENV: value})
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and message in run.stderr and "Traceback" not in run.stderr


def test_vf_train_pins_itself_before_the_config_check_imports_torch(tmp_path):
    """A config key of TrainingArguments (``seed``) makes the config check import transformers,
    and with it torch: vf-train must have applied VF_RL_CPU_CORES by then, or torch's thread pool
    is sized for every core while the process runs on one (training many times slower)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores: with one, every thread pool has one thread")
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(inf=0, train=0).replace("[trainer.args]", "[trainer.args]\nseed = 7"))
    code = ("import sys; from vf_rl.trainer import cli as train\n"
            "def checked(path):\n"
            "    config = load(path); import torch; print('threads', torch.get_num_threads()); sys.exit(0)\n"
            "load, train.load_config = train.load_config, checked\n"
            f"train._main(['@', {str(path)!r}])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**env, cpus.TRAINER_CORES_ENV: str(max(os.sched_getaffinity(0)))})
    assert "threads 1" in out.stdout, (out.stdout, out.stderr[-2000:])


@pytest.mark.parametrize("before", [None, "0"])
def test_vf_vllm_asks_for_a_gpu_through_nvml_and_leaves_the_setting_as_it_was(monkeypatch, before):
    """vf-vllm's CPU-or-GPU choice asks torch with PYTORCH_NVML_BASED_CUDA_CHECK=1 (torch's
    default asks the CUDA runtime, which initializes the driver in vf-vllm's process and keeps
    vLLM's engine from being forked from it) and restores the variable afterwards."""
    import torch

    from vf_rl.inference.server import gpu_visible

    if before is None:
        monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", before)
    seen = []
    real = torch.cuda.is_available
    monkeypatch.setattr(torch.cuda, "is_available",
                        lambda: seen.append(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")) or real())
    assert gpu_visible() is real() is False  # this machine has no GPU
    assert seen == ["1"]
    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == before


@pytest.mark.parametrize("cpu,before,after", [(False, None, "fork"), (False, "spawn", "spawn"), (True, None, None)])
def test_vf_vllm_forks_vllm_engine_on_a_gpu_unless_told_otherwise(monkeypatch, cpu, before, after):
    """On a GPU vf-vllm has vLLM fork its engine process (a spawned one imports vLLM again, 15-17 s
    of a cold start); a value the user set stays, and on the CPU vLLM's CLI default (spawn) stays."""
    from vf_rl.inference.server import engine_start_method

    if before is None:
        monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    else:
        monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", before)
    engine_start_method(cpu)
    assert os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == after
