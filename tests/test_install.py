"""vf-rl as a user installs it: the README's install command is the one CI runs on the built wheel
(``scripts/test_wheel.sh``), no console script of ours has a name of verifiers', a plain install of
the CPU extra works with nothing removed afterwards (vLLM's CPU build pulls CUDA builds of
torchvision and friends, which vf-rl keeps away from transformers), and a missing extra is named in
one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import tomllib
from conftest import write_cpu_config

ROOT = Path(__file__).resolve().parent.parent
CPU_INSTALL = 'pip install "vf-rl[cpu,verifiers]" --extra-index-url https://download.pytorch.org/whl/cpu'


def test_the_readme_install_command_is_the_one_ci_runs_on_the_wheel():
    readme = (ROOT / "README.md").read_text()
    assert CPU_INSTALL in readme
    script = (ROOT / "scripts" / "test_wheel.sh").read_text()
    assert '"$wheel[cpu,verifiers]"' in script and '--extra-index-url "$TORCH_INDEX"' in script
    assert "TORCH_INDEX=${VF_RL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" in script
    assert "scripts/test_wheel.sh" in (ROOT / "scripts" / "test.sh").read_text()


def test_no_console_script_of_ours_is_one_of_verifiers():
    ours = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    theirs = {e.name for e in distribution("verifiers").entry_points if e.group == "console_scripts"}
    assert "vf-eval" in theirs and not ours & theirs, ours & theirs
    assert {"vf-rl", "vf-train", "vf-vllm", "vf-sft"} <= ours


def test_a_cuda_torchvision_beside_cpu_torch_does_not_break_the_trainer(tmp_path):
    """vLLM's CPU build pulls the CUDA build of torchvision from PyPI (the version it would pull, put
    first on the path here): importing vf-rl hides it, and transformers' Trainer (which imports
    torchvision when it is installed) loads."""
    overlay = tmp_path / "torchvision"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(overlay),
                              "torchvision==0.28.0"], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    assert "+cu" in (overlay / "torchvision" / "version.py").read_text()  # a CUDA build
    code = ("import importlib.util, sys\n"
            "present = importlib.util.find_spec('torchvision') is not None\n"
            "import vf_rl\n"
            "from vf_rl.config.rl_config import RLConfig\n"
            "from transformers import Trainer\n"
            "print(present, importlib.util.find_spec('torchvision') is None)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(overlay), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True"], result.stdout  # installed, and hidden


def test_a_missing_extra_is_one_line_naming_it(tmp_path, model_dir):
    """alphabet-sort without faker (the `envs` extra): `vf-train` says so in one line, exit status 2."""
    hidden = tmp_path / "hide"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\nsys.modules['faker'] = None  # as if not installed\n")
    config = write_cpu_config(tmp_path / "c.toml", model_dir, tmp_path / "run", 8123, env_id="alphabet-sort",
                              env_args={"source": "offline"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "vf_rl.trainer.cli", "@", str(config)], capture_output=True,
                            text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and re.search(r"alphabet-sort environment needs faker.*pip install 'vf-rl\[envs\]'",
                                          errors[0]), result.stderr
