"""Every bad input: one line on stderr naming the file/key, exit 2, no traceback, nothing left behind.
Plus: every trainer key the docs name is accepted, and the field reader matches the real classes."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from vf_rl.config.args import rl_fields

BASE = '''model = "Qwen/Qwen3-4B-Instruct-2507"

[env]
id = "reverse-text"

[inference]
gpus = 1

[inference.args]
enforce_eager = true

[trainer]
gpus = 1

[trainer.args]
run_name = "bad-input"
micro_batch_size = 4
rollouts_per_example = 8
batch_size = 32
max_tokens = 128
max_seq_len = 512
'''


def edit(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


def with_arg(line: str) -> str:
    return edit("batch_size = 32", f"batch_size = 32\n{line}")


def with_env_args(line: str) -> str:
    return edit('id = "reverse-text"\n', f'id = "reverse-text"\n\n[env.args]\n{line}\n')


CASES = {
    "toml syntax error": (edit("gpus = 1\n", "gpus = = 1\n"), "TOML syntax error", "line"),
    "model missing": (edit('model = "Qwen/Qwen3-4B-Instruct-2507"\n', ""), "required key 'model' is missing", None),
    "model empty": (edit('"Qwen/Qwen3-4B-Instruct-2507"', '""'), "model", "at least 1 character"),
    "model path missing": (edit('"Qwen/Qwen3-4B-Instruct-2507"', '"./models/none"'), "model", "does not exist"),
    "env id missing": (edit('id = "reverse-text"\n', ""), "required key 'env.id' is missing", None),
    "env id unknown": (edit('"reverse-text"', '"someone/no-such-env"'), "env.id", "built-in environments: "),
    "inference gpus missing": (edit("[inference]\ngpus = 1\n", "[inference]\n"), "'inference.gpus' is missing", None),
    "trainer gpus missing": (edit("[trainer]\ngpus = 1\n", "[trainer]\n"), "'trainer.gpus' is missing", None),
    "gpus negative": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = -1"), "trainer.gpus", "greater than or equal to 0"),
    "gpus not an integer": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = 1.5"), "trainer.gpus", "integer"),
    "gpus a string": (edit("[inference]\ngpus = 1", '[inference]\ngpus = "1"'), "inference.gpus", "integer"),
    "zero gpus with tensor parallel": (edit("[inference]\ngpus = 1\n\n[inference.args]\n",
                                            "[inference]\ngpus = 0\n\n[inference.args]\ntensor_parallel_size = 2\n"),
                                       "inference.args.tensor_parallel_size", "needs GPUs"),
    "zero trainer gpus with bf16": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = 0").replace(
        'run_name = "bad-input"', 'run_name = "bad-input"\nbf16 = true'), "trainer.args.bf16", "needs a GPU"),
    "unknown top-level key": (edit("[env]", 'modle = "x"\n\n[env]'), "unknown key 'modle'", "did you mean 'model'"),
    "unknown section key": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = 1\ngpu = 1"), "unknown key 'trainer.gpu'",
                            "did you mean 'gpus'"),
    "unknown trainer arg": (edit("batch_size = 32", "batch_size = 32\nlearning_rat = 1e-5"),
                            "unknown key 'trainer.args.learning_rat'", "did you mean 'learning_rate'"),
    "wrong type": (edit("batch_size = 32", 'batch_size = 32\nlearning_rate = "fast"'), "trainer.args.learning_rate",
                   "expected float"),
    "wrong type bool": (edit("batch_size = 32", "batch_size = 32\nuse_lora = 1"), "trainer.args.use_lora", "expected bool"),
    "batch not divisible by micro*gpus": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = 2").replace(
        "batch_size = 32", "batch_size = 36").replace("rollouts_per_example = 8", "rollouts_per_example = 4"),
        "micro_batch_size * trainer processes (trainer.gpus * trainer.nodes)", "4 * 2 = 8"),
    "CUDA graphs on two trainer gpus": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = 2").replace(
        "batch_size = 32", 'batch_size = 32\ntorch_compile_mode = "reduce-overhead"'),
        "trainer.args.torch_compile_mode = 'reduce-overhead'", "runs with one trainer process; this run has 2"),
    "batch not divisible by group": (edit("rollouts_per_example = 8", "rollouts_per_example = 12"),
                                     "trainer.args.batch_size (32)", "rollouts_per_example (12)"),
    "group too small": (edit("rollouts_per_example = 8", "rollouts_per_example = 1"),
                        "trainer.args.rollouts_per_example", "at least 2"),
    "max_tokens not below max_seq_len": (edit("max_tokens = 128", "max_tokens = 512"), "trainer.args.max_tokens (512)",
                                         "below max_seq_len (512)"),
    "negative learning rate": (edit("batch_size = 32", "batch_size = 32\nlearning_rate = -1e-5"),
                               "trainer.args.learning_rate", "negative"),
    "unknown scheduler": (edit("batch_size = 32", 'batch_size = 32\nlr_scheduler_type = "cosin"'),
                          "unknown scheduler 'cosin'", "did you mean 'cosine'"),
    "port mismatch": (edit("enforce_eager = true", "enforce_eager = true\nport = 9000"), "inference.args.port", "differs"),
    "model in inference args": (edit("enforce_eager = true", 'enforce_eager = true\nmodel = "x"'),
                                "inference.args.model", "top-level"),
    "unknown weight_sync": (edit("batch_size = 32", 'batch_size = 32\nweight_sync = "ncl"'),
                            "trainer.args.weight_sync", "auto, filesystem, nccl, ipc, lora"),
    "nccl on the cpu": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = 0").replace(
        "batch_size = 32", 'batch_size = 32\nweight_sync = "nccl"'), "weight_sync = 'nccl'", "use 'filesystem'"),
    "nccl on a shared gpu": (edit("[inference]\ngpus = 1", "[inference]\ngpus = 1\nshared = true").replace(
        "batch_size = 32", 'batch_size = 32\nweight_sync = "nccl"'), "inference.shared = true", "one GPU"),
    "ipc without a shared gpu": (edit("batch_size = 32", 'batch_size = 32\nweight_sync = "ipc"'),
                                 "weight_sync = 'ipc'", "inference.shared = true"),
    "lora sync without lora": (edit("batch_size = 32", 'batch_size = 32\nweight_sync = "lora"\nuse_lora = false'),
                               "weight_sync = 'lora'", "use_lora = true"),
    "lora sync with modules_to_save": (edit("batch_size = 32", 'batch_size = 32\nweight_sync = "lora"\n'
                                            'lora_modules_to_save = ["lm_head"]'), "lora_modules_to_save", "adapters"),
    "shared without trainer gpus": (edit("[inference]\ngpus = 1", "[inference]\ngpus = 1\nshared = true").replace(
        "[trainer]\ngpus = 1", "[trainer]\ngpus = 0"), "inference.shared = true", "trainer.gpus >= 1"),
    "shared not a bool": (edit("[inference]\ngpus = 1", '[inference]\ngpus = 1\nshared = "yes"'),
                          "inference.shared", "boolean"),
    "nodes without main_address": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = 1\nnodes = 2"),
                                   "trainer.main_address", "needs node 0's address"),
    "server urls not urls": (with_arg('vllm_server_urls = ["10.0.0.2:8000"]'), "trainer.args.vllm_server_urls",
                             "http://host:port"),
    "older key refused": (with_arg("num_iterations = 2"), "trainer.args.num_iterations", "not supported"),
    "older key for a derived one": (with_arg("gradient_accumulation_steps = 4"),
                                    "trainer.args.gradient_accumulation_steps", "use trainer.args.batch_size"),
    "bucket size zero": (edit("batch_size = 32", "batch_size = 32\nweight_sync_bucket_mb = 0"),
                         "trainer.args.weight_sync_bucket_mb", "positive"),
    "env args unknown key": (with_env_args("few_shots = 2"), "env.args.few_shots", "did you mean 'few_shot'"),
    "env args wrong type": (with_env_args('few_shot = "two"'), "env.args.few_shot", "expected int | list[dict], got 'two'"),
    "output_dir not writable": (with_arg('output_dir = "/proc/version/run"'), "trainer.args.output_dir", "is a file"),
    "report_to unsupported": (with_arg('report_to = "tensorbord"'), "trainer.args.report_to", "expected one of none, wandb"),
    "output_dir under /proc": (with_arg('output_dir = "/proc/vf-rl-run"'), "trainer.args.output_dir",
                               "cannot write to /proc"),
    "loss function typo": (with_arg('loss_type = "vf_rl.algorithm.loss:cispo_los"'), "trainer.args.loss_type",
                           "has no function 'cispo_los' (did you mean 'cispo_loss'?)"),
    "advantage module missing": (with_arg('advantage_type = "no_such_module:f"'), "trainer.args.advantage_type",
                                 "cannot import module 'no_such_module'"),
    "max_model_len below max_seq_len": (edit("enforce_eager = true", "enforce_eager = true\nmax_model_len = 256"),
                                        "inference.args.max_model_len (256) is below trainer.args.max_seq_len (512)",
                                        None),
    # a TRL user's habits (args.TRL_NAMES): TRL's name points to vf-rl's, a trainer key out of [trainer.args] to it
    "TRL's max_completion_length": (with_arg("max_completion_length = 128"),
                                    "unknown key 'trainer.args.max_completion_length'",
                                    "(TRL's name: here it is trainer.args.max_tokens)"),
    "TRL's max_prompt_length": (with_arg("max_prompt_length = 128"), "unknown key 'trainer.args.max_prompt_length'",
                                "(TRL's name: here it is trainer.args.max_prompt_len)"),
    "TRL's vllm_gpu_memory_utilization": (with_arg("vllm_gpu_memory_utilization = 0.5"),
                                          "trainer.args.vllm_gpu_memory_utilization",
                                          "(TRL's name: here it is inference.args.gpu_memory_utilization)"),
    "TRL's per_device_train_batch_size": (with_arg("per_device_train_batch_size = 2"),
                                          "trainer.args.per_device_train_batch_size", "use trainer.args.micro_batch_size"),
    "TRL's name at the top level": (edit("[env]", "max_completion_length = 128\n\n[env]"),
                                    "unknown key 'max_completion_length'", "here it is trainer.args.max_tokens"),
    "trainer key at the top level": (edit("[env]", "max_steps = 10\n\n[env]"), "unknown key 'max_steps'",
                                     ": max_steps belongs in [trainer.args]"),
    "trainer key in [trainer]": (edit("[trainer]\ngpus = 1", "[trainer]\ngpus = 1\nlearning_rate = 1e-5"),
                                 "unknown key 'trainer.learning_rate'", ": learning_rate belongs in [trainer.args]"),
}

# vf-train and vf-vllm read a config through the same code as vf-rl: one case per layer of it (TOML,
# the schema, the trainer's arguments, the rules across keys, the file system, imports, the sequence length
# both sides share) shows each entry point is guarded, without starting three processes for every case
ENTRY_POINT_CASES = {"toml syntax error", "unknown section key", "unknown trainer arg", "batch not divisible by group",
                     "output_dir under /proc", "loss function typo", "max_model_len below max_seq_len",
                     "env args unknown key"}
assert ENTRY_POINT_CASES <= set(CASES)


def run(args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=60)


def assert_one_line_error(result, *needles):
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        if needle:
            assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config(case, tmp_path):
    text, needle, detail = CASES[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    session = f"vf-rl-bad-{os.getpid()}"
    result = run(["@", str(path), "-s", session], cwd=tmp_path)
    assert_one_line_error(result, str(path), needle, detail)
    assert list(tmp_path.iterdir()) == [path]  # no outputs/ directory
    assert subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0
    if case not in ENTRY_POINT_CASES:
        return
    # the same validation guards vf-train and vf-vllm
    for module in ("vf_rl.trainer.cli", "vf_rl.inference.server"):
        other = subprocess.run([sys.executable, "-m", module, "@", str(path)], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120)
        assert_one_line_error(other, needle)


def test_file_missing(tmp_path):
    assert_one_line_error(run(["@", "nope.toml"], tmp_path), "nope.toml: config file not found")


def test_first_argument_not_at(tmp_path):
    assert_one_line_error(run(["config.toml"], tmp_path), "first argument must be '@'")
    no_args = run([], tmp_path)  # the help on stderr, as a usage error (tests/test_cli_help.py)
    assert no_args.returncode == 2 and no_args.stderr.startswith("usage: vf-rl @ config.toml"), no_args.stderr


def test_tmux_not_installed(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text(BASE)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "CUDA_VISIBLE_DEVICES": "0,1"}
    assert_one_line_error(run(["@", str(path)], tmp_path, env=env), "tmux is not installed", "apt-get install tmux")
    assert list(tmp_path.iterdir()) == [path]


def test_port_in_use_is_named(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        path = tmp_path / "busy.toml"
        path.write_text(BASE.replace("[trainer.args]\n", f"[trainer.args]\nvllm_server_port = {port}\n"))
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"}
        assert_one_line_error(run(["@", str(path)], tmp_path, env=env), f"port {port}", "already in use",
                              f"by pid {os.getpid()}")


def test_port_in_time_wait_is_free():
    """A port whose last connection is in TIME_WAIT (the previous run's server just stopped) binds
    with SO_REUSEADDR, as vLLM's server does: not refused."""
    import socket

    from vf_rl.launcher.ports import check_port_free

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end of the port goes to TIME_WAIT
    server.close()
    client.close()
    with socket.socket() as plain:  # what a bind without SO_REUSEADDR says
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    check_port_free("127.0.0.1", port)


def test_every_documented_trainer_key_is_accepted(tmp_path):
    """The keys the seed docs and REFERENCE.md name, with the docs' kind of values."""
    keys = '''
use_lora = true
lora_rank = 16
lora_alpha = 16
lora_dropout = 0.0
lora_target_modules = "all-linear"
lora_modules_to_save = ["lm_head"]
lora_use_rslora = true
learning_rate = 1e-5
lr_scheduler_type = "cosine"
warmup_steps = 10
max_grad_norm = 1.0
bf16 = true
gradient_checkpointing = true
max_prompt_len = 256
mask_ratio_low = 0.125
mask_ratio_high = 8.0
mask_env_responses = true
mask_truncated_completions = false
zero_truncated_completions = false
temperature = 0.7
top_p = 1.0
top_k = 20
min_p = 0.0
repetition_penalty = 1.0
presence_penalty = 0.0
frequency_penalty = 0.0
generation_timeout = 600.0
max_concurrent = 1024
vllm_server_host = "127.0.0.1"
vllm_server_port = 8001
vllm_server_timeout = 600.0
output_dir = "outputs/x"
save_steps = 50
eval_strategy = "steps"
eval_steps = 50
report_to = "wandb"
seed = 7
weight_decay = 0.01
shuffle_dataset = false

[trainer.args.wandb]
project = "reverse-text-tutorial"
name = "my-first-run"
'''
    path = tmp_path / "all.toml"
    path.write_text(BASE + keys)
    result = run(["@", str(path), "--dry-run"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert 'lora_target_modules = "all-linear"' in result.stdout
    assert '[trainer.args.wandb]\nproject = "reverse-text-tutorial"\nname = "my-first-run"' in result.stdout


def test_rl_config_is_rl_args_on_training_arguments():
    """RLConfig's fields: TrainingArguments' and RLArgs', with RLArgs' defaults winning."""
    from transformers import TrainingArguments

    from vf_rl.config.rl_config import RLConfig

    real = {f.name: f for f in dataclasses.fields(RLConfig) if f.init}
    assert set(real) >= {f.name for f in dataclasses.fields(TrainingArguments) if f.init} | set(rl_fields())
    for name, spec in rl_fields().items():
        assert real[name].default == spec.default, name
    assert set(rl_fields()) - {f.name for f in dataclasses.fields(TrainingArguments)} >= {"batch_size", "lora_rank"}


def test_config_check_never_imports_transformers_for_keys_vf_rl_does_not_declare(tmp_path):
    """Loading a config imports neither torch nor transformers. A TrainingArguments key (``seed``)
    is checked against transformers' class: the first time for a transformers version from the
    annotations in its source, then from vf-rl's cache, which still refuses a wrong type or an
    unknown key."""
    path = tmp_path / "c.toml"
    probe = ("import sys; from vf_rl.config.schema import load_config; load_config(sys.argv[1]); "
             "print('transformers' in sys.modules, 'torch' in sys.modules)")
    env = {**os.environ, "VF_RL_CACHE": str(tmp_path / "cache")}
    for extra, expected in (("", "False False"), ("seed = 3\n", "False False"), ("seed = 3\n", "False False"),
                            ('eval_strategy = "steps"\neval_steps = 5\n', "False False"),
                            ("seeds = 3\n", "unknown key 'trainer.args.seeds' (did you mean 'seed'?)"),
                            ('seed = "3"\n', "trainer.args.seed: expected int, got '3'"),
                            ("eval_strategy = 5\n", "trainer.args.eval_strategy: expected str, got 5")):
        path.write_text(BASE + extra)
        result = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, cwd=tmp_path,
                                env=env)
        if "True" in expected or "False" in expected:
            assert result.stdout.split() == expected.split(), (extra, result.stderr)
        else:
            assert expected in result.stderr, (extra, result.stderr)
            assert result.returncode != 0
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [
        f"training-arguments-{importlib.metadata.version('transformers')}.json"]


def test_training_argument_types_rebuild_from_the_cache_as_toml_values_need():
    """Each TrainingArguments field type, written to the cache and read back: builtins and their
    unions as they are, an enum as the string that names its member, another class as Any."""
    from typing import Any

    from transformers import TrainingArguments

    from vf_rl.config.training_arguments import decode_type, encode_type

    hints = typing.get_type_hints(TrainingArguments)
    decoded = {f.name: decode_type(json.loads(json.dumps(encode_type(hints[f.name]))))
               for f in dataclasses.fields(TrainingArguments) if f.init}
    assert decoded["learning_rate"] is float and decoded["seed"] is int and decoded["bf16"] is bool
    assert decoded["eval_strategy"] is str and decoded["lr_scheduler_type"] is str
    assert decoded["run_name"] == (str | None)
    assert decoded["debug"] == (str | list[str])
    assert decoded["parallelism_config"] == (Any | None)
    same = [n for n, t in decoded.items() if t == hints[n]]
    assert len(same) >= 0.8 * len(decoded)  # everything but the enums and transformers' own classes


def test_training_argument_types_read_from_the_source_equal_the_imported_class_s(monkeypatch):
    """The types read from transformers' ``training_args.py`` without importing it are the ones
    the imported class gives, field for field (enums as ``"str"``, other classes ``Any``); where
    the source cannot be read, the class is imported."""
    from vf_rl.config import training_arguments

    from_source = training_arguments._encode_from_source()
    assert from_source is not None and len(from_source) > 100
    monkeypatch.setattr(training_arguments, "_encode_from_source", lambda: None)
    from_class = training_arguments._encode_training_arguments()
    assert from_source == from_class
    assert from_source["optim"] == ["|", "str", "str"] and from_source["learning_rate"] == "float"


def test_training_argument_types_from_a_source_of_another_shape(tmp_path, monkeypatch):
    """Annotations of every form the reader knows, an enum imported from a sibling module, and
    fields it must skip; a class with a base class (fields it cannot see) is left to the import."""
    from types import SimpleNamespace

    from vf_rl.config import training_arguments

    package = tmp_path / "transformers"
    package.mkdir()
    (package / "schedules.py").write_text("class Kind(ExplicitEnum):\n    A = 'a'\nclass Plain:\n    pass\n")
    (package / "training_args.py").write_text(
        "from typing import ClassVar, Literal, Optional, Union\n"
        "from .schedules import Kind, Plain\n"
        "@dataclass\nclass TrainingArguments:\n"
        "    lr: float = 1e-3\n"
        "    name: Optional[str] = None\n"
        "    kind: Union[Kind, str] = 'a'\n"
        "    plain: 'Plain | None' = None\n"
        "    mode: Literal['x', 'y'] = 'x'\n"
        "    tags: Optional[list[str]] = None\n"
        "    extra: dict[str, int] = field(default_factory=dict)\n"
        "    hidden: int = field(default=0, init=False)\n"
        "    shared: ClassVar[int] = 3\n")
    spec = SimpleNamespace(submodule_search_locations=[str(package)])
    monkeypatch.setattr(training_arguments.importlib.util, "find_spec", lambda name: spec)
    assert training_arguments._encode_from_source() == {
        "lr": "float", "name": ["|", "str", "None"], "kind": ["|", "str", "str"], "plain": ["|", "Any", "None"],
        "mode": ["Literal", "x", "y"], "tags": ["|", ["list", "str"], "None"], "extra": ["dict", "str", "int"]}
    (package / "training_args.py").write_text("class TrainingArguments(Base):\n    lr: float = 1e-3\n")
    assert training_arguments._encode_from_source() is None


def test_documented_defaults():
    """Choices where docs and code disagreed (README "Configuration")."""
    from vf_rl.config.rl_config import RLConfig

    args = RLConfig(output_dir=None, report_to="none")
    assert (args.lora_rank, args.lora_alpha, args.temperature) == (16, 16, None)
    assert (args.rollouts_per_example, args.batch_size, args.micro_batch_size) == (16, 512, 8)
    assert args.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert args.output_dir == "outputs/vf-rl" and args.max_tokens is None
    sampling = args.sampling_args()
    assert (sampling["temperature"], sampling["max_tokens"], args.max_seq_len) == (1.0, 2048, 2048)
    assert args.gradient_accumulation_steps == 1


def test_configuration_reference_is_generated_from_the_schema():
    script = Path(__file__).resolve().parents[1] / "scripts" / "gen_config_table.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_choice_is_a_tagged_union_of_typed_options():
    """The run's choices come back as typed options holding only the keys each reads; a custom
    loss takes every loss key."""
    from vf_rl.config.args import rl_fields
    from vf_rl.config.choices import (
        CustomLoss,
        DapoLoss,
        DifficultyFiltering,
        GroupMeanStdAdvantage,
        IpcSync,
        PaddedMicroBatches,
        run_choices,
    )
    from vf_rl.config.rules import ConfigError

    a = {name: f.default for name, f in rl_fields().items()}
    picked = run_choices(a | {"loss_type": "dapo", "epsilon_high": 0.4, "advantage_type": "group_mean_std",
                              "weight_sync": "ipc", "weight_sync_bucket_mb": 256, "padding_free": False,
                              "use_difficulty_filtering": True, "max_filter_rounds": 2})
    assert picked.loss == DapoLoss(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.4)
    assert isinstance(picked.advantage, GroupMeanStdAdvantage)
    assert picked.weight_sync == IpcSync(weight_sync="ipc", weight_sync_bucket_mb=256)
    assert isinstance(picked.micro_batches, PaddedMicroBatches)
    assert isinstance(picked.filtering, DifficultyFiltering) and picked.filtering.max_filter_rounds == 2
    custom = run_choices(a | {"loss_type": "my_losses:clipped", "epsilon_high": 0.4, "mask_ratio_high": 4.0}).loss
    assert isinstance(custom, CustomLoss) and (custom.epsilon_high, custom.mask_ratio_high) == (0.4, 4.0)
    with pytest.raises(ConfigError, match=r"^weight_sync_bucket_mb applies only with weight_sync = 'auto' or 'nccl' "
                                          r"or 'ipc' \(this run has 'lora'\)"):
        run_choices(a | {"weight_sync": "lora", "weight_sync_bucket_mb": 256})


def test_all_shipped_configs_pass_dry_run(tmp_path):
    configs = sorted((Path(__file__).resolve().parents[1] / "configs" / "vf-rl").glob("*.toml"))
    assert len(configs) >= 7
    for config in configs:
        result = run(["@", str(config), "--dry-run"], tmp_path)
        assert result.returncode == 0, (config.name, result.stderr)
        assert "[Inference]" in result.stdout and "[Trainer]" in result.stdout


def test_deepspeed_config_without_the_package_is_one_clear_error(monkeypatch):
    import importlib.util

    from vf_rl.config.rl_config import RLConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(ValueError, match=r"deepspeed: .*pip install 'vf-rl\[deepspeed\]'"):
        RLConfig(output_dir="/tmp/unused", use_cpu=True, deepspeed="configs/deepspeed/zero3.json")


AGREE_BASE = {"batch_size": 8, "rollouts_per_example": 4, "micro_batch_size": 2, "max_seq_len": 512}
AGREE_REJECT = {
    "group does not divide batch": ({"batch_size": 10, "micro_batch_size": 1},
                                    "batch_size (10) must be divisible by rollouts_per_example (4)"),
    "micro batch does not divide batch": ({"micro_batch_size": 3}, "must be divisible by micro_batch_size * trainer processes"),
    "group of one": ({"rollouts_per_example": 1}, "rollouts_per_example: must be at least 2"),
    "max_tokens == max_seq_len": ({"max_tokens": 512}, "max_tokens (512) must be below max_seq_len (512)"),
    "max_prompt_len over max_seq_len": ({"max_prompt_len": 600}, "max_prompt_len (600) must be below max_seq_len"),
    "negative learning rate": ({"learning_rate": -1e-5}, "learning_rate: must not be negative"),
    "zero temperature": ({"temperature": 0.0}, "temperature: must be positive"),
    "mask ratio bounds": ({"mask_ratio_low": 2.0}, "mask_ratio_low/high"),
    "epsilon bounds": ({"epsilon_low": 1.5}, "epsilon_low/high"),
    "unknown loss": ({"loss_type": "ppo"},
                     "loss_type: expected one of cispo, dapo, grpo, dr_grpo, bnpo, gspo or 'module:function'"),
    "loss function typo": ({"loss_type": "vf_rl.algorithm.loss:cispo_los"}, "loss_type: module 'vf_rl.algorithm.loss' "
                                                                          "has no function 'cispo_los'"),
    "output_dir under /proc": ({"output_dir": "/proc/vf-rl-run"}, "output_dir: cannot write to /proc"),
    "unknown advantage": ({"advantage_type": "std"}, "advantage_type: expected one of group_mean, group_mean_std"),
    "unknown scheduler": ({"lr_scheduler_type": "cosin"}, "unknown scheduler 'cosin' (did you mean 'cosine'?)"),
    "bf16 on the cpu": ({"bf16": True}, "bf16 = true needs a GPU"),
    "unknown weight sync": ({"weight_sync": "disk"}, "weight_sync: expected one of auto, filesystem, nccl, ipc, lora"),
    "lora sync without lora": ({"weight_sync": "lora", "use_lora": False}, "weight_sync = 'lora' needs"),
    "lora sync with modules_to_save": ({"weight_sync": "lora", "lora_modules_to_save": ["lm_head"]},
                                       "cannot send lora_modules_to_save"),
    "weight sync port": ({"weight_sync_port": 70000}, "weight_sync_port: not a port number"),
    "server port": ({"vllm_server_port": 0}, "vllm_server_port: not a port number"),
    "zero generation timeout": ({"generation_timeout": 0.0}, "generation_timeout: must be positive"),
    "zero lora rank": ({"lora_rank": 0}, "lora_rank: must be positive"),
    "watchdog warns after it stops": ({"stall_warning_timeout": 600.0, "stall_timeout": 480.0},
                                      "stall_warning_timeout (600.0) must be below stall_timeout (480.0)"),
    "token budget below max_seq_len": ({"micro_batch_tokens": 100},
                                       "micro_batch_tokens (100) must be at least max_seq_len (512)"),
    "int as str": ({"batch_size": "8"}, "batch_size: expected int, got '8'"),
    "top_p zero": ({"top_p": 0.0}, "top_p: expected 0 < top_p <= 1, got 0.0"),
    "top_k zero": ({"top_k": 0}, "top_k: expected top_k >= 1, or -1 / unset for off"),
    "min_p above one": ({"min_p": 1.5}, "min_p: expected 0 <= min_p <= 1"),
    "repetition penalty zero": ({"repetition_penalty": 0.0}, "repetition_penalty: expected repetition_penalty > 0"),
    "presence penalty out of range": ({"presence_penalty": 3.0}, "presence_penalty: expected -2 <= presence_penalty <= 2"),
    "frequency penalty out of range": ({"frequency_penalty": -2.5}, "frequency_penalty: expected -2 <="),
    "lora alpha zero": ({"lora_alpha": 0.0}, "lora_alpha: expected lora_alpha > 0"),
    "lora dropout one": ({"lora_dropout": 1.0}, "lora_dropout: expected 0 <= lora_dropout < 1"),
    "lora targets empty": ({"lora_target_modules": []}, "lora_target_modules: expected \"all-linear\""),
    "lora modules_to_save not names": ({"lora_modules_to_save": [""]}, "lora_modules_to_save: expected a list"),
    "report_to unsupported": ({"report_to": "tensorboard"}, "report_to: expected one of none, wandb"),
    "output_dir under a file": ({"output_dir": "/proc/version/run"}, "output_dir: /proc/version is a file"),
    "negative grad norm": ({"max_grad_norm": -1.0}, "max_grad_norm: expected max_grad_norm >= 0"),
    "save steps zero": ({"save_steps": 0}, "save_steps: expected save_steps > 0"),
    "eval examples zero": ({"num_eval_examples": 0}, "num_eval_examples: expected num_eval_examples > 0, or -1"),
    "int as bool": ({"use_lora": 1}, "use_lora: expected bool, got 1"),
    # the recipe keys and the older key names
    "negative difficulty threshold": ({"use_difficulty_filtering": True, "difficulty_threshold": -0.1},
                                      "difficulty_threshold: must not be negative"),
    "oversampling below 1": ({"oversampling_factor": 0.5}, "oversampling_factor: must be at least 1"),
    "zero filter rounds": ({"max_filter_rounds": 0}, "max_filter_rounds: must be positive"),
    "reward bound without filtering": ({"difficulty_max_reward": 0.9},
                                       "difficulty_max_reward applies only with"),
    # a key of a choice not taken would be ignored
    "dapo's clip with cispo": ({"epsilon_high": 0.4},
                               "loss_type = 'dapo' or 'grpo' or 'dr_grpo' or 'bnpo' or 'gspo' (this run has 'cispo')"),
    "cispo's mask with dapo": ({"loss_type": "dapo", "mask_ratio_high": 4.0}, "mask_ratio_high applies only with"),
    "token budget without padding_free": ({"padding_free": False, "micro_batch_tokens": 4096},
                                          "padding_free = true (this run has false)"),
    "nccl port with filesystem sync": ({"weight_sync": "filesystem", "weight_sync_port": 29600},
                                       "weight_sync = 'auto' or 'nccl' (this run has 'filesystem')"),
    "reward bounds crossed": ({"use_difficulty_filtering": True, "difficulty_min_reward": 0.5,
                               "difficulty_max_reward": 0.5}, "difficulty_min_reward (0.5) must be below"),
    "negative beta": ({"beta": -0.1}, "beta: must not be negative"),
    "zero off-policy steps": ({"max_off_policy_steps": 0}, "max_off_policy_steps: must be at least 1"),
    "old and new name together": ({"num_generations": 4}, "num_generations is the older name of"),
    "num_iterations": ({"num_iterations": 2}, "num_iterations: not supported"),
    "per_device_train_batch_size": ({"per_device_train_batch_size": 4},
                                    "per_device_train_batch_size: use"),
    "gradient_accumulation_steps": ({"gradient_accumulation_steps": 4}, "gradient_accumulation_steps: use"),
    "num_batches_ahead mapped then checked": ({"num_batches_ahead": 0}, "max_off_policy_steps: must be at least 1"),
    "offloading without checkpointing": ({"activation_offloading": True},
                                         "activation_offloading = true needs"),
    "tiled MLP with LoRA dropout": ({"tiled_mlp": True, "use_lora": True, "lora_dropout": 0.05},
                                    "tiled_mlp = true needs"),
    "CUDA graphs with checkpointed layers": ({"torch_compile_mode": "reduce-overhead", "gradient_checkpointing": True},
                                            "torch_compile_mode = 'reduce-overhead' (CUDA graphs of the decoder layers) "
                                            "does not combine"),
    "CUDA graphs with padded micro batches": ({"torch_compile_mode": "max-autotune", "padding_free": False},
                                              "torch_compile_mode = 'max-autotune' (CUDA graphs of the decoder layers) "
                                              "needs"),
}
AGREE_ACCEPT = {
    "defaults": {},
    "max_tokens below max_seq_len": {"max_tokens": 511},
    "padded micro batches": {"padding_free": False},
    "token budget": {"micro_batch_tokens": 4096},
    "dapo, grpo advantage": {"loss_type": "dapo", "advantage_type": "group_mean_std", "epsilon_high": 0.4},
    "own functions": {"loss_type": "vf_rl.algorithm.loss:cispo_loss",
                      "advantage_type": "vf_rl.algorithm.advantage:group_mean_std"},
    "own loss reads any loss key": {"loss_type": "vf_rl.algorithm.loss:dapo_loss", "epsilon_high": 0.4,
                                    "mask_ratio_high": 4.0},
    "a choice's keys at their defaults": {"loss_type": "dapo", "mask_ratio_low": 0.125},
    "recipe keys": {"use_difficulty_filtering": True, "difficulty_min_reward": 0.0, "difficulty_max_reward": 1.0,
                    "oversampling_factor": 1.5, "beta": 0.04, "max_off_policy_steps": 2},
    "offloaded checkpoints": {"gradient_checkpointing": True, "activation_offloading": True},
    "tiled MLP with LoRA": {"tiled_mlp": True, "use_lora": True},
    "compile mode without CUDA graphs": {"torch_compile_mode": "max-autotune-no-cudagraphs"},
    "CUDA graphs of the decoder layers": {"torch_compile_mode": "reduce-overhead"},
    "older names mapped": {"num_batches_ahead": 2, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1},
    "TRL's loss types": {"loss_type": "gspo", "epsilon_low": 3e-4, "epsilon_high": 4e-4},
}


def both_paths(args: dict, tmp_path: Path) -> tuple[Exception | None, Exception | None]:
    """``args`` through the TOML path (load_config) and the Python path (RLConfig): the error each raised."""
    import tomli_w

    from vf_rl.config.rl_config import RLConfig
    from vf_rl.config.schema import load_config

    path = tmp_path / "agree.toml"
    path.write_text(tomli_w.dumps({"model": "Qwen/Qwen3-4B-Instruct-2507", "env": {"id": "reverse-text"},
                                   "inference": {"gpus": 0}, "trainer": {"gpus": 0, "args": args}}))
    errors = []
    python_args = {"output_dir": str(tmp_path / "out"), "report_to": "none", **args}
    for attempt in (lambda: load_config(path), lambda: RLConfig(use_cpu=True, **python_args)):
        try:
            attempt()
            errors.append(None)
        except ValueError as exc:
            errors.append(exc)
    return errors[0], errors[1]


@pytest.mark.parametrize("case", list(AGREE_REJECT))
def test_toml_and_python_reject_alike(case, tmp_path):
    """The same rules (config/rules.py) guard the TOML file and RLConfig: same case, same message."""
    extra, needle = AGREE_REJECT[case]
    toml_error, python_error = both_paths({**AGREE_BASE, **extra}, tmp_path)
    assert toml_error is not None and python_error is not None, (toml_error, python_error)
    assert f"trainer.args.{needle.split()[0]}" in str(toml_error) or needle in str(toml_error)
    assert needle in str(toml_error), str(toml_error)
    assert needle in str(python_error), str(python_error)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", list(AGREE_ACCEPT))
def test_toml_and_python_accept_alike(case, tmp_path):
    assert both_paths({**AGREE_BASE, **AGREE_ACCEPT[case]}, tmp_path) == (None, None)


@pytest.mark.parametrize("line, needles", [
    ("enforce_eagr = true", ("inference.args.enforce_eagr: not an option of `vllm serve`", "did you mean 'enforce_eager'")),
    ('dtype = "float64"', ("inference.args.dtype: 'float64' is not one of", "float32")),
])
def test_inference_args_are_checked_against_vllms_own_parser(tmp_path, line, needles):
    """vf-rl (and --dry-run) read the installed vLLM's `vllm serve` options (cached per version)."""
    path = tmp_path / "flags.toml"
    path.write_text(edit("enforce_eager = true", f"enforce_eager = true\n{line}").replace(
        "[inference]\ngpus = 1", "[inference]\ngpus = 0").replace("[trainer]\ngpus = 1", "[trainer]\ngpus = 0"))
    for extra in (["--dry-run"], []):
        assert_one_line_error(run(["@", str(path), *extra], tmp_path), str(path), *needles)
    assert list(tmp_path.iterdir()) == [path]


def test_common_inference_args_are_checked_without_reading_vllms_parser(monkeypatch):
    """A config that sets only common ``vllm serve`` options (and what vf-rl derives) does not wait
    for the subprocess that reads vLLM's parser: each of them is an option of the installed vLLM
    with no fixed choices, so the parser could reject none of their values."""
    from vf_rl.config import vllm_flags

    options = vllm_flags.serve_options()  # the installed vLLM's own parser (cached per version)
    assert options is not None
    for key in vllm_flags.COMMON_OPTIONS:
        flag = "--" + key.replace("_", "-")
        assert flag in options and options[flag]["choices"] is None, flag

    def no_read():
        raise AssertionError("read vLLM's parser")

    monkeypatch.setattr(vllm_flags, "serve_options", no_read)
    assert vllm_flags.check_inference_args({"max_model_len": 1536, "gpu_memory_utilization": 0.3,
                                            "api_server_count": 4, "enforce_eager": True,
                                            "host": "127.0.0.1", "port": 8000}) is True
    with pytest.raises(AssertionError, match="read vLLM's parser"):  # any other key is checked by the parser
        vllm_flags.check_inference_args({"max_model_len": 1536, "dtype": "bfloat16"})


def test_older_key_names_map_to_the_current_ones(tmp_path):
    """``num_generations`` and ``num_batches_ahead`` (the seeds' names) set ``rollouts_per_example``
    and ``max_off_policy_steps`` on both paths."""
    import tomli_w

    from vf_rl.config.rl_config import RLConfig
    from vf_rl.config.schema import load_config

    old = {"batch_size": 8, "micro_batch_size": 2, "max_seq_len": 512, "num_generations": 4, "num_batches_ahead": 2}
    path = tmp_path / "old.toml"
    path.write_text(tomli_w.dumps({"model": "Qwen/Qwen3-4B-Instruct-2507", "env": {"id": "reverse-text"},
                                   "inference": {"gpus": 0}, "trainer": {"gpus": 0, "args": old}}))
    resolved = load_config(path).trainer.args
    args = RLConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", **old)
    assert (resolved["rollouts_per_example"], resolved["max_off_policy_steps"]) == (4, 2)
    assert (args.rollouts_per_example, args.max_off_policy_steps) == (4, 2)


def test_trl_names_point_to_keys_of_vf_rl():
    """Each TRL name of ``args.TRL_NAMES`` is no key here, and names a [trainer.args] key or an
    option of the installed ``vllm serve``."""
    from vf_rl.config import vllm_flags
    from vf_rl.config.args import TRL_NAMES
    from vf_rl.config.training_arguments import training_arguments_types

    options = vllm_flags.serve_options()
    for trl, ours in TRL_NAMES.items():
        assert trl not in rl_fields() and trl not in training_arguments_types(), trl
        table, _, key = ours.rpartition(".")
        assert (key in rl_fields()) if not table else (table == "inference.args" and "--" + key.replace("_", "-") in options)


def test_env_id_may_name_a_submodule_and_a_factory(tmp_path):
    """`[env] id = "package.module:function"` passes --dry-run, and [env.args] are checked against
    that function's parameters."""
    good = BASE.replace('id = "reverse-text"\n', 'id = "vf_rl.environments.reverse_text:load_environment"\n'
                        '[env.args]\nfew_shot = 2\n')
    path = tmp_path / "factory.toml"
    path.write_text(good)
    result = run(["@", str(path), "--dry-run"], tmp_path)
    assert result.returncode == 0, result.stderr
    path.write_text(good.replace("few_shot = 2", "few_shots = 2"))
    assert_one_line_error(run(["@", str(path), "--dry-run"], tmp_path), "env.args.few_shots", "did you mean 'few_shot'")


def test_cached_json_computes_once_skips_none_and_replaces_a_broken_file(tmp_path, monkeypatch):
    from vf_rl.config.cache import cached_json

    monkeypatch.setenv("VF_RL_CACHE", str(tmp_path / "c"))
    calls = []

    def compute():
        calls.append(1)
        return {"a": [1, "x"]}

    assert cached_json("fact-1", compute) == {"a": [1, "x"]} == cached_json("fact-1", compute)
    assert len(calls) == 1 and sorted(p.name for p in (tmp_path / "c").iterdir()) == ["fact-1.json"]
    assert cached_json("fact-2", lambda: None) is None and not (tmp_path / "c" / "fact-2.json").exists()
    (tmp_path / "c" / "fact-1.json").write_text('{"a": [1,')  # half a file, from elsewhere
    assert cached_json("fact-1", compute) == {"a": [1, "x"]} and len(calls) == 2
    assert json.loads((tmp_path / "c" / "fact-1.json").read_text()) == {"a": [1, "x"]}


LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}


def test_shared_split_follows_the_model_and_the_sequences():
    from vf_rl.config.memory import GIB, ModelShape, inference_bytes_needed, shared_memory_utilization

    big = ModelShape.from_config(LLAMA_8B)
    small = ModelShape.from_config({"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
                                    "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
                                    "vocab_size": 49152, "tie_word_embeddings": True})  # SmolLM2-135M
    # 8B: 16 GB of bf16 weights and 128 KiB of KV cache per token
    assert inference_bytes_needed(big, 0) > 2 * big.params > 14.9 * GIB
    assert inference_bytes_needed(big, 1000) - inference_bytes_needed(big, 0) == 1000 * 4 * 32 * 1024
    split = [shared_memory_utilization(big, {"batch_size": b, "max_seq_len": 8704}) for b in (8, 16, 32)]
    assert 0.3 < split[0] < split[1] < split[2] <= 0.9, split
    assert shared_memory_utilization(big, {"batch_size": 8, "max_seq_len": 8704, "max_off_policy_steps": 2}) == split[1]
    assert shared_memory_utilization(big, {"batch_size": 512, "max_seq_len": 32768}) == 0.9  # capped: the trainer's turn
    assert shared_memory_utilization(small, {"batch_size": 128, "max_seq_len": 1024}) == 0.3  # the measured floor
    assert shared_memory_utilization(big, {"batch_size": 8, "max_seq_len": 8704}, gpu_bytes=150 * GIB) < split[0]


def test_shared_gpu_split_is_derived_from_a_local_models_config(tmp_path, monkeypatch):
    from vf_rl.config.schema import load_config

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: an 80 GB GPU is assumed
    model = tmp_path / "llama-8b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_8B))
    text = edit('"Qwen/Qwen3-4B-Instruct-2507"', json.dumps(str(model))).replace(
        "[inference]\ngpus = 1", "[inference]\ngpus = 1\nshared = true").replace(
        "max_seq_len = 512", "max_seq_len = 8704")
    path = tmp_path / "shared.toml"
    path.write_text(text.replace("batch_size = 32", "batch_size = 16"))
    config = load_config(path)
    assert config.inference.args["gpu_memory_utilization"] == 0.51
    assert "KV cache" in config._origins["inference.args.gpu_memory_utilization"]
    path.write_text(text.replace("[inference.args]\n", "[inference.args]\ngpu_memory_utilization = 0.45\n"))
    config = load_config(path)
    assert config.inference.args["gpu_memory_utilization"] == 0.45
    assert config._origins["inference.args.gpu_memory_utilization"] == "config"


def test_a_gpu_server_gets_an_api_server_per_four_cores(tmp_path, monkeypatch):
    """vf-vllm on a GPU runs vLLM's ``api_server_count`` API-server processes (one per 4 cores, 1-4),
    unless the file sets it, the server runs on the CPU, or LoRA adapters are served (vLLM keeps a
    loaded adapter in one API server's state)."""
    from vf_rl.config import schema, vllm_flags
    from vf_rl.config.schema import load_config

    assert [vllm_flags.api_servers(c) for c in (1, 4, 7, 8, 15, 16, 64)] == [1, 1, 1, 2, 3, 4, 4]
    monkeypatch.setattr(schema, "api_servers", lambda: 3)
    path = tmp_path / "c.toml"
    path.write_text(BASE)
    config = load_config(path)
    assert config.inference.args["api_server_count"] == 3
    assert config._origins["inference.args.api_server_count"].startswith("derived: 1 API-server process per 4")
    path.write_text(edit("enforce_eager = true", "enforce_eager = true\napi_server_count = 1"))
    config = load_config(path)
    assert config.inference.args["api_server_count"] == 1 and config._origins["inference.args.api_server_count"] == "config"
    path.write_text(with_arg('weight_sync = "lora"'))
    assert "api_server_count" not in load_config(path).inference.args
    path.write_text(BASE.replace("gpus = 1", "gpus = 0"))
    assert "api_server_count" not in load_config(path).inference.args


def test_one_trainer_gpu_records_its_layers_by_default_where_it_fits(tmp_path, monkeypatch, model_dir):
    """``torch_compile_mode`` left unset: ``"reduce-overhead"`` (the compiled layers recorded as CUDA
    graphs) with one trainer GPU, packed micro batches and neither gradient checkpointing nor tiled
    MLPs, said in the origins; the per-layer compile with two trainer processes, those keys, an
    explicit mode or no GPU, and where the recording's memory estimate does not fit the GPU."""
    from vf_rl.config.defaults import resolve_trainer_args
    from vf_rl.config.schema import load_config

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: an 80 GB GPU is assumed
    small = edit('"Qwen/Qwen3-4B-Instruct-2507"', json.dumps(str(model_dir)))  # SmolLM2-135M

    def mode(text: str, name: str = "c.toml"):
        path = tmp_path / name
        path.write_text(text)
        config = load_config(path)
        return config.trainer.args.get("torch_compile_mode"), config._origins.get("trainer.args.torch_compile_mode")

    got, why = mode(small)
    assert got == "reduce-overhead" and why.startswith("derived: 'reduce-overhead'"), (got, why)
    two = small.replace("[trainer]\ngpus = 1", "[trainer]\ngpus = 2")
    assert mode(two)[0] is None
    for line in ("gradient_checkpointing = true", "tiled_mlp = true", "padding_free = false", "torch_compile = false"):
        assert mode(small.replace("batch_size = 32", f"batch_size = 32\n{line}"))[0] is None, line
    assert mode(small.replace("batch_size = 32", 'batch_size = 32\ntorch_compile_mode = "default"')) == (
        "default", "config")
    assert mode(small.replace("[trainer]\ngpus = 1", "[trainer]\ngpus = 0").replace(
        "[inference]\ngpus = 1", "[inference]\ngpus = 0"))[0] is None
    # an 8B model's LoRA at 4 x 8k tokens per pass: with the recording's second copy of a pass's
    # activations the estimate does not fit on 80 GB, and the per-layer compile is the default
    model = tmp_path / "llama-8b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_8B))
    big = edit('"Qwen/Qwen3-4B-Instruct-2507"', json.dumps(str(model))).replace(
        "max_seq_len = 512", "max_seq_len = 8192").replace("batch_size = 32", "batch_size = 32\nuse_lora = true")
    got, why = mode(big, "big.toml")
    assert got is None and why.startswith("default (recorded layers' memory estimate does not fit"), (got, why)
    # RLConfig's path derives by the same rule (the trainer processes from WORLD_SIZE there)
    assert resolve_trainer_args({}, True, 1)["torch_compile_mode"] == "reduce-overhead"
    assert resolve_trainer_args({"torch_compile_backend": "inductor"}, True, 1)["torch_compile_mode"] == "reduce-overhead"
    assert resolve_trainer_args({"torch_compile_backend": "aot_eager"}, True, 1).get("torch_compile_mode") is None
    assert resolve_trainer_args({}, True, 2).get("torch_compile_mode") is None
    assert resolve_trainer_args({}, False, 1).get("torch_compile_mode") is None


@pytest.mark.parametrize("kwargs, message", [
    ({"max_completion_length": 128}, "RLConfig: unknown argument 'max_completion_length' (TRL's name: here it is max_tokens)"),
    ({"max_prompt_length": 64}, "RLConfig: unknown argument 'max_prompt_length' (TRL's name: here it is max_prompt_len)"),
    ({"learning_rat": 1e-5}, "RLConfig: unknown argument 'learning_rat' (did you mean 'learning_rate'?)"),
])
def test_rlconfig_from_python_gives_the_toml_paths_hints(kwargs, message, tmp_path):
    """A TRL user's key in ``RLConfig(...)`` names vf-rl's key, as in a TOML file; known keys still build."""
    from vf_rl import RLConfig

    with pytest.raises(TypeError) as info:
        RLConfig(output_dir=str(tmp_path), **kwargs)
    assert str(info.value) == message
    assert RLConfig(output_dir=str(tmp_path), max_tokens=64, max_prompt_len=32).max_tokens == 64
