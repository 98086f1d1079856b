"""vf-vllm fills vLLM's model-info cache beside its own imports (vf_rl.inference.model_info)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vf_rl.inference import model_info

# vLLM's registry with its subprocess hop forbidden: the answer must come from the cache
FROM_CACHE_ONLY = """
from vllm.model_executor.models import registry
def forbidden(fn):
    raise SystemExit("vLLM inspected in a subprocess: its model-info cache was not used")
registry._run_in_subprocess = forbidden
print(registry.ModelRegistry.models["LlamaForCausalLM"].inspect_model_cls().supports_pp)
"""


def _env(cache_root: Path) -> dict[str, str]:
    return {**os.environ, "VLLM_CACHE_ROOT": str(cache_root), "VLLM_TARGET_DEVICE": "cpu"}


def test_architectures_come_from_the_models_config(model_dir, tmp_path):
    assert model_info.architectures(str(model_dir)) == ["LlamaForCausalLM"]
    assert model_info.architectures(str(tmp_path / "missing")) == []
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert model_info.architectures(str(tmp_path)) == []
    (tmp_path / "config.json").write_text("{not json")
    assert model_info.architectures(str(tmp_path)) == []


def test_the_inspection_fills_the_cache_vllm_reads(model_dir, tmp_path, monkeypatch):
    """The inspection's answer is the one vLLM's own registry then reads instead of starting a
    subprocess, and a filled cache starts no inspection."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    assert not model_info.cached(["LlamaForCausalLM"])
    before = subprocess.run([sys.executable, "-c", FROM_CACHE_ONLY], env=_env(tmp_path), capture_output=True,
                            text=True, timeout=300)
    assert before.returncode != 0 and "was not used" in before.stderr  # the check itself can fail
    process = model_info.start(str(model_dir))
    assert process is not None
    model_info.finish(process)
    assert process.returncode == 0
    assert model_info.cached(["LlamaForCausalLM"]) and not model_info.cached(["LlamaForCausalLM", "Qwen2ForCausalLM"])
    after = subprocess.run([sys.executable, "-c", FROM_CACHE_ONLY], env=_env(tmp_path), capture_output=True,
                           text=True, timeout=300)
    assert after.returncode == 0, after.stderr[-2000:]
    assert after.stdout.strip().splitlines()[-1] == "True"
    assert model_info.start(str(model_dir)) is None  # cached: nothing to start


def test_cache_dir_follows_vllms_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert model_info.cache_dir() == tmp_path / "vllm" / "modelinfos"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert model_info.cache_dir() == Path.home() / ".cache" / "vllm" / "modelinfos"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "root"))
    assert model_info.cache_dir() == tmp_path / "root" / "modelinfos"


def _inspections(cache_root: Path) -> list[int]:
    """Processes of vf_rl.inference.model_info started with ``cache_root`` as their VLLM_CACHE_ROOT."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"vf_rl.inference.model_info" in cmdline and f"VLLM_CACHE_ROOT={cache_root}".encode() in environ:
            found.append(int(proc.name))
    return found


def test_a_refused_flag_leaves_no_inspection_running(model_dir, tmp_path):
    result = subprocess.run([sys.executable, "-m", "vf_rl.inference.server", "--model", str(model_dir),
                             "--worker-extension-cls", "x.Y"], env=_env(tmp_path), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0 and "--worker-extension-cls is set by vf-vllm itself" in result.stderr
    assert _inspections(tmp_path) == []


# vf-vllm's main with vLLM's CLI replaced by a probe: was the cache filled before the CLI ran?
CLI_SEES_CACHE = """
import sys
import vllm.entrypoints.cli.main as cli
from vf_rl.inference import server as vllm_server
from vf_rl.inference import model_info
cli.main = lambda: print("cached before vLLM's CLI:", model_info.cached(["LlamaForCausalLM"]))
sys.exit(vllm_server.main(sys.argv[1:]))
"""


def test_vf_vllm_fills_the_cache_before_vllms_cli_runs(model_dir, tmp_path):
    result = subprocess.run([sys.executable, "-c", CLI_SEES_CACHE, "--model", str(model_dir), "--port", "1"],
                            env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cached before vLLM's CLI: True" in result.stdout


def test_vf_vllm_reads_the_served_model_before_the_config_is_resolved(model_dir, tmp_path, monkeypatch):
    """``@ config.toml``: the model comes from the file as it is (the inspection starts before the
    config's checks); a flag or positional model otherwise; an unreadable file gives none."""
    from vf_rl.inference.server import served_model

    config = tmp_path / "c.toml"
    config.write_text(f'model = "{model_dir}"\n[env]\nid = "reverse-text"\n')
    assert served_model(["@", str(config)]) == str(model_dir)
    assert served_model([f"@{config}", "--port", "1"]) == str(model_dir)
    assert served_model(["@", str(tmp_path / "missing.toml")]) is None
    (tmp_path / "bad.toml").write_text("model = [")
    assert served_model(["@", str(tmp_path / "bad.toml")]) is None
    assert served_model(["--port", "1", "--model", "m"]) == "m" and served_model(["m", "--port", "1"]) == "m"
    monkeypatch.setenv("HOME", str(model_dir.parent))
    assert model_info.architectures(f"~/{model_dir.name}") == ["LlamaForCausalLM"]


def test_vf_vllm_at_a_config_fills_the_cache_before_vllms_cli_runs(model_dir, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'model = "{model_dir}"\n[env]\nid = "reverse-text"\n[inference]\ngpus = 0\n'
                      '[trainer]\ngpus = 0\n[trainer.args]\nmax_tokens = 64\nmax_seq_len = 512\n')
    result = subprocess.run([sys.executable, "-c", CLI_SEES_CACHE, "@", str(config)],
                            env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cached before vLLM's CLI: True" in result.stdout
