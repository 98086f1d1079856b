"""What a config says about where the run's processes go: every trainer key with its default, the
devices the trainer and the server run on, and whether the servers are on this machine."""

from __future__ import annotations

from typing import Any

from vf_rl.config.args import rl_fields

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def trainer_values(config) -> dict[str, Any]:
    """Every vf-rl trainer key of a resolved config (a ``VfRlConfig``), the ``None`` ones (not in a TOML file) included."""
    return {**{name: f.default for name, f in rl_fields().items()}, **config.trainer.args}


def layout_devices(config, a: dict[str, Any]) -> tuple[str, list[str], bool]:
    """The file's GPU layout as ``rules.choose_weight_sync`` takes it: the trainer's device,
    the server workers' devices (named by side; ``"cpu"`` with no GPU), and whether every server
    is on this machine (``a``: the trainer arguments)."""
    trainer = "gpu-trainer" if config.trainer.gpus else "cpu"
    server = "cpu" if not config.inference.gpus else trainer if config.inference.shared else "gpu-inference"
    urls = a["vllm_server_urls"] or [f"http://{a['vllm_server_host']}:0"]
    local = all(str(u).split("://", 1)[-1].rsplit(":", 1)[0].strip("[]") in LOOPBACK for u in urls)
    return trainer, [server], local
