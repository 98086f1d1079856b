"""`vf-rl prepare-model` writes the model's own special tokens (the GGUF file's metadata) under every
transformers version it runs with: SmolLM2-135M-Instruct's eos and pad are `<|im_end|>`, its bos
`<|im_start|>`, in the tokenizer and in the model's and the generation config. transformers 5.17
infers eos as `<|im_start|>` and no pad token from the same file (a TRL side then cannot pad)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXPECTED = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}
EXPECTED_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}

# older transformers the requirements allow (the lowest, and one that infers other tokens), with the hub
# client and tokenizers each needs, beside the venv's
OLDER = {"4.56.2": ["transformers==4.56.2", "huggingface-hub>=0.34,<1", "tokenizers>=0.22,<=0.23.0"],
         "5.17.0": ["transformers==5.17.0", "huggingface-hub>=1.5,<2"]}


def assert_special_tokens(model: Path) -> None:
    tokenizer = json.loads((model / "tokenizer_config.json").read_text())
    assert {k: tokenizer.get(k) for k in EXPECTED} == EXPECTED
    for name in ("config.json", "generation_config.json"):
        config = json.loads((model / name).read_text())
        assert {k: config.get(k) for k in EXPECTED_IDS} == EXPECTED_IDS, name
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(model)
    assert loaded.eos_token == loaded.pad_token == "<|im_end|>" and loaded.pad_token_id == 2


def test_the_prepared_model_has_its_own_special_tokens(model_dir):
    """The venv's transformers (the session's model, prepared by ``vf-rl prepare-model``)."""
    assert_special_tokens(model_dir)


# 5.17.0 (the version whose inferred tokens were wrong) in the default tier, the lowest allowed in the slow one
@pytest.mark.parametrize("version", [pytest.param(v, marks=pytest.mark.slow) if v.startswith("4.") else v for v in sorted(OLDER)])
def test_prepare_model_under_an_older_transformers(version, tmp_path):
    """``vf-rl prepare-model`` run with an older transformers first on the path writes the same tokens."""
    overlay = tmp_path / f"transformers-{version}"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(overlay),
                              *OLDER[version]], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(overlay), os.environ.get("PYTHONPATH")]))}
    probe = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                           capture_output=True, text=True, env=env)
    assert probe.stdout.strip() == version, probe.stderr[-2000:]
    out = tmp_path / "model"
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "prepare-model", "--out", str(out)],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert json.loads((out / "generation_config.json").read_text())["transformers_version"] == version
    assert_special_tokens(out)
