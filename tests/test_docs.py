"""The docs site's pages against the code: the configuration reference lists every key a run
accepts, and every config in the docs and the README passes ``vf-rl --dry-run``."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def dry_run(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vf_rl.cli.launch", "@", str(config), "--dry-run"],
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
    assert any(n.startswith("README.md") for n in names) and any(n.startswith("configuration.md") for n in names)
