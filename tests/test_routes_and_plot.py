"""The weight-update routes' shared secret (with a stand-in engine: the real-server tests cover
the engine side), and `vf-rl plot`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from vf_rl.config.schema import load_config
from vf_rl.inference.routes import SECRET_HEADER, weight_sync_routes
from vf_rl.inference.server import server_argv
from vf_rl.launcher.launch import build_commands


class RecordingEngine:
    """Stands in for vLLM's engine client (no GPU/CPU engine needed to test the auth logic)."""

    def __init__(self):
        self.calls = []

    async def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")


@pytest.fixture
def app():
    app = FastAPI()
    app.middleware("http")(weight_sync_routes)
    app.state.engine_client = RecordingEngine()

    @app.get("/v1/models")
    def models():
        return {"data": []}

    return app


def test_routes_need_the_secret_when_one_is_set(app, monkeypatch):
    client = TestClient(app)
    monkeypatch.setenv("VF_RL_WEIGHT_SECRET", "s3cret")
    assert client.post("/reset_prefix_cache").status_code == 401
    assert client.post("/reset_prefix_cache", headers={SECRET_HEADER: "wrong"}).status_code == 401
    assert client.post("/reset_prefix_cache", headers={SECRET_HEADER: "s3cret"}).json() == {"status": "ok"}
    assert app.state.engine_client.calls == ["reset_prefix_cache"]
    assert client.get("/v1/models").status_code == 200  # vLLM's own routes are untouched
    monkeypatch.delenv("VF_RL_WEIGHT_SECRET")
    assert client.post("/reset_prefix_cache").status_code == 200  # loopback default: no secret


def test_the_secret_can_come_from_a_file(app, monkeypatch, tmp_path):
    from vf_rl.inference.routes import weight_secret

    client = TestClient(app)
    (tmp_path / "secret").write_text("from-a-file\n")
    monkeypatch.delenv("VF_RL_WEIGHT_SECRET", raising=False)
    monkeypatch.setenv("VF_RL_WEIGHT_SECRET_FILE", str(tmp_path / "secret"))
    assert weight_secret() == "from-a-file"
    assert client.post("/reset_prefix_cache").status_code == 401
    assert client.post("/reset_prefix_cache", headers={SECRET_HEADER: "from-a-file"}).status_code == 200
    monkeypatch.setenv("VF_RL_WEIGHT_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="VF_RL_WEIGHT_SECRET_FILE: .*missing is missing or empty"):
        weight_secret()


def test_beyond_loopback_both_panes_share_a_generated_secret(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('''model = "Qwen/Qwen3-0.6B"
[env]
id = "reverse-text"
[inference]
gpus = 1
[inference.args]
host = "0.0.0.0"
[trainer]
gpus = 1
''')
    inference, trainer = build_commands(load_config(path), path, ["0", "1"])
    secret = inference.env["VF_RL_WEIGHT_SECRET"]
    assert len(secret) >= 32 and trainer.env["VF_RL_WEIGHT_SECRET"] == secret
    loopback = tmp_path / "l.toml"
    loopback.write_text(path.read_text().replace('host = "0.0.0.0"', ""))
    config = load_config(loopback)
    inference, trainer = build_commands(config, loopback, ["0", "1"])
    assert "VF_RL_WEIGHT_SECRET" not in inference.env
    argv = server_argv(config)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # the trainer's resolved host
    dry = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "@", str(path), "--dry-run"],
                         capture_output=True, text=True, env={"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin:/bin"})
    assert "VF_RL_WEIGHT_SECRET='<generated>'" in dry.stdout.replace("=<generated>", "='<generated>'")
    assert secret not in dry.stdout


def test_plot_command(tmp_path):
    records = [{"step": s, "reward": 0.1 * s, "entropy": 2.0, "importance_ratio": 1.0, "mismatch_kl": 0.01,
                "timing/train_s": 3.0, "timing/wait_s": 0.5, "timing/sync_s": 0.2, "timing/generation_s": 2.0}
               for s in range(1, 6)] + [{"step": 0, "eval/reward": 0.05}, {"step": 5, "eval/reward": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "plot", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    png = tmp_path / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    missing = subprocess.run([sys.executable, "-m", "vf_rl.launcher.main", "plot", str(tmp_path / "nope")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "metrics.jsonl not found" in missing.stderr
