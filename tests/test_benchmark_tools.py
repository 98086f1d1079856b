"""benchmarks/cpu_ab.py: a variant can run the vf_rl of another git revision (old code vs new in one run);
benchmarks/gemm_ceiling.py: the matmuls it times are the model's own."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the git repository (not an export)")


def _cpu_ab():
    spec = importlib.util.spec_from_file_location("cpu_ab", REPO / "benchmarks" / "cpu_ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rev_variant_imports_that_revisions_vf_rl(tmp_path):
    cpu_ab = _cpu_ab()
    src = cpu_ab.checkout_src("HEAD", tmp_path / "rev")
    assert (src / "vf_rl" / "__init__.py").is_file()
    # The variant's processes get src first on PYTHONPATH: vf_rl must come from there, not the installed package.
    out = subprocess.run([sys.executable, "-c", "import vf_rl; print(vf_rl.__file__)"], capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    assert Path(out.stdout.strip()).resolve() == (src / "vf_rl" / "__init__.py").resolve()


def test_bad_revision_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="not a git revision"):
        _cpu_ab().checkout_src("no-such-revision-xyz", tmp_path / "rev")
    assert not (tmp_path / "rev").exists()


def _gemm_ceiling():
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gemm_ceiling", REPO / "benchmarks" / "gemm_ceiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("config", ["smollm2-135m", "llama-1b", "qwen2-0.5b"])
def test_gemm_ceiling_counts_the_models_own_matmuls(config):
    """benchmarks/gemm_ceiling.py's products of one pass: a decoder layer's sum to 6 x tokens x its
    linear weights (forward, dX, dW) with full weights, 4 x without dW plus the adapters' 6 x with
    LoRA; the LM head's to 6 (or 4) x completion tokens x vocab x hidden; the layer's weights read
    from the transformers model that trainer_step.py builds for that config."""
    import torch
    import transformers

    gc = _gemm_ceiling()
    cfg = gc.MODEL_CONFIGS[config]
    one_layer = {**{k: v for k, v in cfg.items() if k != "arch"}, "num_hidden_layers": 1}
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[cfg["arch"]]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config_class(**one_layer))
    linears = [m for m in model.model.layers[0].modules() if isinstance(m, torch.nn.Linear)]
    layer_weights = sum(m.weight.numel() for m in linears)
    tokens, head_tokens, rank = 4096, 2048, 16

    def flop(rows, head: bool) -> int:
        return sum(2 * m * k * n for name, m, k, n in rows if name.startswith("head") == head)

    full = gc.products(cfg, tokens, head_tokens, None)
    assert flop(full, False) == 6 * tokens * layer_weights
    assert flop(full, True) == 6 * head_tokens * cfg["vocab_size"] * cfg["hidden_size"]
    lora = gc.products(cfg, tokens, head_tokens, rank)
    adapters = sum(rank * (m.in_features + m.out_features) for m in linears)
    assert flop(lora, False) == 4 * tokens * layer_weights + 6 * tokens * adapters
    assert flop(lora, True) == 4 * head_tokens * cfg["vocab_size"] * cfg["hidden_size"]
    assert not any(name.endswith("dW") for name, *_ in lora)
