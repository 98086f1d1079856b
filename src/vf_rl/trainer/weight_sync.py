"""Weight sync: how the trainer's new weights reach the vLLM server after each step.

Transports (``weight_sync`` in ``[trainer.args]``):

``filesystem``
    LoRA merged in, one safetensors file written to ``<output_dir>/weights``, the server
    reloads it (``POST /update_weights``). Works everywhere (CPU, one shared GPU, several).
``nccl``
    The trainer (rank 0) and every vLLM worker form a broadcast group (``communicator.py``);
    each update broadcasts the merged weights GPU to GPU in a few flat buckets of at most
    ``weight_sync_bucket_mb`` (``buckets.py``), announced by one ``POST
    /update_weights_broadcast``. Needs the trainer and the server on different GPUs.
``lora``
    Only the adapter moves: saved with peft and hot-loaded into vLLM's LoRA support
    (``POST /v1/load_lora_adapter``, ``load_inplace``); rollouts then ask for the adapter by
    name. Needs ``use_lora`` and a server started with ``--enable-lora`` (``vf-rl`` adds it).
``auto`` (default)
    ``nccl`` when the trainer and every vLLM worker are on different GPUs of this machine,
    ``filesystem`` otherwise (CPU, a GPU shared with the server, a server on another host).
    ``lora`` is never picked by itself: serving an unmerged adapter slows generation (figures
    for each transport in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from vf_rl.config.rules import WEIGHT_SYNC_CHOICES as CHOICES
from vf_rl.inference.buckets import pack_bucket, plan_buckets
from vf_rl.inference.client import InferenceClient

from .weights import export_weights, merged_state_dict

LORA_NAME = "vf-rl-lora"


def resolve_weight_sync(requested: str, trainer_device: str, server_devices: list[str],
                        server_is_local: bool = True) -> str:
    """The transport to use, given where the trainer and the server's workers actually run
    (``config/rules.py`` has already checked the rules that need no devices).

    Args:
        requested: one of ``CHOICES``.
        trainer_device: the trainer's GPU UUID, or ``"cpu"``.
        server_devices: one GPU UUID (or ``"cpu"``) per vLLM worker.
        server_is_local: the server listens on this machine's loopback address (the NCCL group
            is formed there).
    Raises:
        ValueError: a transport that cannot work in this setup (one line, naming the key).
    """
    if requested not in CHOICES:
        raise ValueError(f"weight_sync: expected one of {', '.join(CHOICES)}, got {requested!r}")
    on_cpu = trainer_device == "cpu" or "cpu" in server_devices
    shared = trainer_device in server_devices
    if requested == "auto":
        return "nccl" if server_is_local and not on_cpu and not shared else "filesystem"
    if requested == "nccl" and on_cpu:
        raise ValueError("weight_sync = 'nccl' needs the trainer and the vLLM server on GPUs; use 'filesystem'")
    if requested == "nccl" and shared:
        raise ValueError("weight_sync = 'nccl' cannot connect two ranks on one GPU, and the trainer shares a GPU with "
                         "the vLLM server; use 'filesystem' or 'lora'")
    return requested


class FilesystemSync:
    """Merged weights through a safetensors file the server reads (same machine or shared
    filesystem)."""

    def __init__(self, client: InferenceClient, directory: Path):
        self.client, self.directory = client, Path(directory)

    def push(self, model: torch.nn.Module) -> None:
        path = export_weights(model, self.directory)
        self.client.update_weights(str(path.resolve()))

    def close(self) -> None:
        pass


class BroadcastSync:
    """Merged weights broadcast from the trainer's device to every vLLM worker.

    Args:
        client: the server's client.
        device: where the trainer's weights live (the broadcast buffers are built there).
        backend: ``"nccl"`` (GPUs) or ``"gloo"`` (CPU; for tests).
        host: address of this machine that the vLLM workers can reach.
        port: the group's TCPStore port (0: a free one).
        bucket_bytes: largest flat buffer per broadcast (bytes).
        timeout_s: seconds to form the group and for each update.
    Raises:
        RuntimeError: the server could not join (its error message).
    """

    def __init__(self, client: InferenceClient, device: torch.device, backend: str = "nccl", host: str = "127.0.0.1",
                 port: int = 0, bucket_bytes: int = 1 << 30, timeout_s: float = 300.0):
        from vf_rl.inference.communicator import BroadcastGroup, free_port

        self.client, self.bucket_bytes = client, bucket_bytes
        workers = client.weight_sync_info()["workers"]
        port = port or free_port(host)
        world_size = 1 + workers
        # the server answers each HTTP call only once our side of the collective has run, so
        # the calls go out from a background thread
        self.http = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vf-rl-weight-sync")
        joined = self.http.submit(client.init_broadcast, host, port, world_size, backend, timeout_s)
        self.group = BroadcastGroup(host, port, 0, world_size, backend, timeout_s, device=device)
        joined.result()
        self.buckets_sent = 0

    def push(self, model: torch.nn.Module) -> None:
        tensors = merged_state_dict(model, device=None)
        buckets = plan_buckets(tensors.items(), self.bucket_bytes)
        received = self.http.submit(self.client.update_weights_broadcast, [b.to_json() for b in buckets])
        for bucket in buckets:
            self.group.broadcast(pack_bucket(bucket, tensors).to(self.group.device))
        received.result()
        self.buckets_sent = len(buckets)

    def close(self) -> None:
        self.group.close()
        self.http.shutdown(wait=False)


class LoraSync:
    """Only the LoRA adapter: saved with peft, hot-loaded into vLLM as ``LORA_NAME``."""

    def __init__(self, client: InferenceClient, directory: Path):
        self.client, self.directory = client, Path(directory)

    def push(self, model: torch.nn.Module) -> None:
        final = self.directory / "lora"
        staging = self.directory / ".lora-tmp"
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(str(staging))
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        self.client.load_lora_adapter(LORA_NAME, str(final.resolve()))

    def close(self) -> None:
        pass


def make_weight_sync(kind: str, client: InferenceClient, output_dir: Path, device: torch.device, port: int = 0,
                     bucket_mb: int = 1024, timeout_s: float = 300.0):
    """The transport object for a resolved ``kind`` (not ``auto``)."""
    start = time.perf_counter()
    if kind == "filesystem":
        return FilesystemSync(client, Path(output_dir) / "weights")
    if kind == "lora":
        return LoraSync(client, Path(output_dir) / "weights")
    if kind == "nccl":
        sync = BroadcastSync(client, device, "nccl", port=port, bucket_bytes=bucket_mb << 20, timeout_s=timeout_s)
        print(f"Weight sync: NCCL group with the server formed in {time.perf_counter() - start:.1f} s", flush=True)
        return sync
    raise ValueError(f"weight_sync: unknown transport {kind!r}")
