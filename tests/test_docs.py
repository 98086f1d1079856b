"""The docs site's pages against the code: the configuration reference lists every key a run
accepts, every config in the docs and the README passes ``vf-rl --dry-run``, and every Python
snippet is a file under ``examples/`` that runs here (training one step, or evaluated with vf-eval
against the session's real server)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_vf_eval

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def dry_run(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(config), "--dry-run"],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_configuration_reference_lists_every_key_a_dry_run_shows(tmp_path):
    from transformers import TrainingArguments

    reference = (ROOT / "docs" / "configuration.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_.]+)` \|", reference, re.M))
    result = dry_run(ROOT / "configs" / "vf-rl" / "reverse-text-cpu.toml", tmp_path)
    assert result.returncode == 0, result.stderr
    section, shown = "", set()
    for line in result.stdout.splitlines():
        if m := re.match(r"^\[([a-z_.]+)\]$", line):
            section = m.group(1)
        elif m := re.match(r"^(?:# )?([a-z_]+)(?: = |: unset)", line):
            shown.add(f"{section}.{m.group(1)}" if section else m.group(1))
    trainer_keys = {k for k in shown if k.startswith("trainer.args.")}
    assert len(trainer_keys) > 60  # every RLArgs key is shown, set or unset
    other_training_args = {f.name for f in dataclasses.fields(TrainingArguments)}
    missing = sorted(k for k in trainer_keys if k not in listed and k.split(".")[-1] not in other_training_args)
    assert not missing, f"docs/configuration.md lacks {missing}"
    for key in ("model", "env.id", "inference.gpus", "inference.shared", "trainer.gpus"):
        assert key in listed, key


def toml_configs() -> list[tuple[str, str]]:
    """Every ```toml block of the README and the docs that is a whole config (has ``model``)."""
    found = []
    for page in PAGES:
        for i, block in enumerate(re.findall(r"```toml\n(.*?)```", page.read_text(), re.S)):
            if re.search(r"^model = ", block, re.M):
                found.append((f"{page.name}#{i}", block))
    return found


@pytest.mark.parametrize("name, text", toml_configs(), ids=[n for n, _ in toml_configs()])
def test_every_config_in_the_docs_passes_dry_run(name, text, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(text)
    result = dry_run(config, tmp_path)
    assert result.returncode == 0, (name, result.stderr)


def test_the_docs_have_configs_to_check():
    names = [name for name, _ in toml_configs()]
    assert any(n.startswith("README.md") for n in names) and any(n.startswith("configure.md") for n in names)


def python_snippets() -> list[tuple[str, str]]:
    return [(f"{page.name}#{i}", block) for page in PAGES
            for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))]


# each example a snippet shows, and the test below that runs it
RUN_BY = {"train_reverse_text.py": "test_train_example_runs_a_step", "my_reverse.py": "test_vf_eval_on_the_example_envs",
          "my_reverse_v1.py": "test_vf_eval_on_the_example_envs",
          "guess_number.py": "test_user_envs.py::test_guess_number_rollouts_against_real_server",
          "custom_loss.py": "test_algorithm.py (trains with loss_type = 'custom_loss:gspo_loss')"}


def test_every_python_snippet_is_an_example_that_a_test_runs():
    """A snippet in the docs is the text of a file under examples/ (never a copy that drifts), and
    that file is run by a test."""
    snippets = python_snippets()
    assert len(snippets) >= 5
    examples = {f.name: f.read_text() for f in EXAMPLES.glob("*.py")}
    for name, block in snippets:
        shown_in = [f for f, text in examples.items() if block.strip() in text]
        assert shown_in, f"{name}: a Python snippet that is not the text of a file under examples/"
        assert any(f in RUN_BY for f in shown_in), f"{name}: {shown_in} is run by no test"
    assert set(RUN_BY) <= set(examples)


@pytest.mark.server
def test_train_example_runs_a_step(server, tmp_path, monkeypatch, restore_base_weights):
    """examples/train_reverse_text.py (the README's and docs/python.md's snippet), run as written
    against the session's server; only the port, one step and the output directory change."""
    import vf_rl

    real_config, real_trainer, made = vf_rl.RLConfig, vf_rl.RLTrainer, []

    def config(**kwargs):
        return real_config(**{**kwargs, "vllm_server_port": server.port, "max_steps": 1, "output_dir": str(tmp_path),
                              "report_to": [], "use_cpu": True, "save_steps": 100})

    def trainer(model, **kwargs):
        if Path(model) != Path(server.model):
            pytest.skip(f"VF_RL_CACHE moves the prepared model away from the example's path ({model})")
        made.append(real_trainer(model=model, **kwargs))
        return made[-1]

    monkeypatch.setattr(vf_rl, "RLConfig", config)
    monkeypatch.setattr(vf_rl, "RLTrainer", trainer)
    code = (EXAMPLES / "train_reverse_text.py").read_text()
    exec(compile(code, str(EXAMPLES / "train_reverse_text.py"), "exec"), {"__name__": "__main__"})
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward" in s]
    assert made and len(steps) == 1 and 0.0 <= steps[0]["reward"] <= 1.0
    assert made[0].args.batch_size == 32 and made[0].args.rollouts_per_example == 8  # the example's own sizes


@pytest.mark.server
@pytest.mark.parametrize("env_id,env_args,metric", [
    pytest.param("my-reverse", {}, "reward/lcs_reward_func", marks=pytest.mark.classic),
    ("you/my-reverse-v1", {"agent": {"max_turns": 1}}, "reward/lcs_reward"),
], ids=["classic", "v1"])
def test_vf_eval_on_the_example_envs(server, tmp_path, monkeypatch, env_id, env_args, metric):
    """docs/environments.md's worked examples for verifiers (classic and v1 API), evaluated by the
    ids the page gives, with the module on PYTHONPATH as it says."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "eval.jsonl"
    result = run_vf_eval(server, env_id, env_args, out)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert metric in result.stdout, result.stdout[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 and all(r["completion"][0]["role"] == "assistant" for r in records)


def test_no_module_is_over_450_lines_and_the_core_is_under_1000():
    """The code stays readable top to bottom: every module under src/ at most 450 lines, and the
    algorithm a researcher changes (the training step, the losses, the advantages) at most 1,000
    lines, none of them in the speed machinery (``trainer/speed/``)."""
    src = ROOT / "src" / "vf_rl"
    lines = {path: len(path.read_text().splitlines()) for path in src.rglob("*.py")}
    assert not {str(p.relative_to(src)): n for p, n in lines.items() if n > 450}
    core = [src / "trainer" / "trainer.py", src / "algorithm" / "loss.py", src / "algorithm" / "advantage.py"]
    assert sum(lines[path] for path in core) <= 1000, {str(p.relative_to(src)): lines[p] for p in core}
