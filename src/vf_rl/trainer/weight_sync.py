"""Weight sync: how the trainer's new weights reach the vLLM server after each step.

Transports (``weight_sync`` in ``[trainer.args]``):

``filesystem``
    LoRA merged in, one safetensors file written to ``<output_dir>/weights``, the server
    reloads it (``POST /update_weights``). Works everywhere (CPU, one shared GPU, several).
    The file is deleted when the transport closes (at the end of the run).
``nccl``
    The trainer (rank 0) and every vLLM worker form a broadcast group (``communicator.py``);
    each update broadcasts the merged weights GPU to GPU in a few flat buckets of at most
    ``weight_sync_bucket_mb`` (``buckets.py``), announced by one ``POST
    /update_weights_broadcast``. Needs the trainer and the server on different GPUs.
``ipc``
    The trainer shares a GPU with the server (``[inference] shared = true``): the merged weights
    are packed into flat buffers on that GPU, which each vLLM worker opens once through CUDA IPC
    (``ipc.py``) and copies from at every update, announced by one ``POST
    /update_weights_ipc``. No host copy, no file. The buffers (one copy of the weights, in
    buckets of at most ``weight_sync_bucket_mb``) stay allocated for the whole run.
``lora``
    Only the adapter moves: saved with peft and hot-loaded into vLLM's LoRA support
    (``POST /v1/load_lora_adapter``, ``load_inplace``); rollouts then ask for the adapter by
    name. Needs ``use_lora`` and a server started with ``--enable-lora`` (``vf-rl`` adds it).
``auto`` (default)
    ``nccl`` when the trainer and every vLLM worker are on different GPUs of this machine,
    ``ipc`` when they are all on the trainer's GPU, ``filesystem`` otherwise (CPU, a server on
    another host, a mix): ``config.rules.choose_weight_sync``.
    ``lora`` is never picked by itself: serving an unmerged adapter slows generation (figures
    for each transport in docs/benchmarks.md).

An update can overlap the next training step (:meth:`_Transport.push_async`): the weights are
snapshotted on the trainer's stream, then sent from a background thread on a side stream while
the trainer goes on; the next batch starts generating once the update is in. The trainer does
this for ``nccl`` and ``ipc`` (``overlaps``), whose snapshot is a cheap copy on the GPU.

Every wait for a push (``push``, :meth:`_Transport.wait`) is watched (``vf_rl.watchdog``): a push
that the servers do not answer within ``stall_warning_timeout`` seconds is named in one line with
each server's state (vLLM's ``/metrics``), and past ``stall_timeout`` it raises ``Stalled``. The
sending thread is a daemon, so a push stuck on a stopped server never holds up the trainer's exit.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from concurrent.futures import Future
from pathlib import Path

import torch

from vf_rl.config.rules import choose_weight_sync
from vf_rl.inference.buckets import empty_buffers, pack_buckets, plan_buckets
from vf_rl.inference.client import SERVER_LOST, InferenceClient, server_load
from vf_rl.inference.communicator import device_uuid
from vf_rl.trainer.weights import export_weights, merged_tensors
from vf_rl.watchdog import Limits, Look, Stalled, Watch, in_daemon, wait_watched

LORA_NAME = "vf-rl-lora"


def _clients(client) -> list[InferenceClient]:
    return list(client) if isinstance(client, (list, tuple)) else [client]


def _each(clients: list[InferenceClient], call) -> list[int]:
    """``call(client)`` for every server that answers ``/health``, at the same time; the indices
    of the servers it reached. A server that is down is skipped (it gets the weights at the
    first sync after it comes back, before any rollout is sent to it)."""
    alive = [i for i, c in enumerate(clients) if len(clients) == 1 or c.is_healthy()]
    if len(alive) == 1:
        call(clients[alive[0]])
    for future in [in_daemon(lambda i=i: call(clients[i])) for i in alive] if len(alive) > 1 else []:
        future.result()
    return alive


class _Transport:
    """What every transport offers: ``push`` (blocking), ``push_async`` and ``wait``.

    Attributes:
        last_push_s: seconds the last push took from snapshot to the servers' answer.
        limits: the watchdog's limits for a wait on a push (``None``: not watched).
    """

    overlaps = False  # worth overlapping with training: the snapshot is a quick copy on the GPU
    last_push_s = 0.0
    limits: Limits | None = None
    clients: list[InferenceClient] = []
    _pushes = 0  # pushes started
    _last: Future | None = None  # the latest push's future: a push starts once the one before is done
    _abandoned = False  # a wait on a push stalled (Stalled raised): close() does not wait for it
    _side_stream = None  # the CUDA stream of push_async's sends

    def push(self, model: torch.nn.Module, step: int | None = None) -> list[int]:
        """Send the model's current weights (those after optimizer step ``step``, for the
        watchdog's line); returns the indices of the servers that got them.

        Raises:
            Stalled: the servers did not answer within ``stall_timeout`` s (``wait``).
        """
        return self.wait(self.push_async(model, step))

    def wait(self, pushing: Future) -> list[int]:
        """The result of a push (``push_async``'s future), watched (see the module docstring).

        Raises:
            Stalled: no answer within ``stall_timeout`` s; the push is abandoned (``close`` does
                not wait for it). Whatever the push raised.
        """
        before = f" (the push before took {self.last_push_s:.1f} s)" if self._pushes > 1 else ""
        watch = None if self.limits is None else Watch(
            "the trainer", "vf-vllm", getattr(pushing, "what", "a weight push") + before,
            lambda: Look(None, "; ".join(f"vf-vllm at {c.base_url}: {server_load(c.base_url)}" for c in self.clients)),
            self.limits)
        try:
            return wait_watched(pushing, watch)
        except Stalled:
            self._abandoned = True
            raise

    def push_async(self, model: torch.nn.Module, step: int | None = None) -> Future:
        """Snapshot the weights now and send them in the background.

        The snapshot's GPU work is queued on the caller's current stream, so kernels queued
        after this call (the next step's forward, backward and optimizer step) cannot change
        what is sent. The send runs in a background thread, on a side CUDA stream that waits
        only for the snapshot.

        Returns:
            a ``concurrent.futures.Future`` of the indices of the servers that got the weights
            (its ``result()`` raises what ``push`` would have raised; ``wait`` watches it).
        """
        if self._last is not None and not self._last.done():  # one push at a time (the trainer waits for each anyway)
            self.wait(self._last)
        start = time.perf_counter()
        self._pushes += 1
        snapshot = self._snapshot(model)
        device = getattr(self, "device", None)
        ready = None
        if device is not None and device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(device))
            self._side_stream = self._side_stream or torch.cuda.Stream(device)

        def send():
            try:
                if ready is None:
                    return self._send(snapshot)
                ready.synchronize()  # the snapshot is complete (later kernels are not waited for)
                with torch.cuda.device(device), torch.cuda.stream(self._side_stream):
                    return self._send(snapshot)
            finally:
                self.last_push_s = time.perf_counter() - start

        self._last = in_daemon(send)
        self._last.what = "the push of the " + ("current weights" if step is None else f"weights after step {step}")
        return self._last

    def _snapshot(self, model: torch.nn.Module):
        raise NotImplementedError

    def _send(self, snapshot) -> list[int]:
        raise NotImplementedError

    def close(self) -> None:
        """Wait for a push in flight (not for one the watchdog gave up on)."""
        last, self._last = self._last, None
        if last is not None and not last.done() and not self._abandoned:
            with contextlib.suppress(Exception):  # its error went to whoever waited for it
                self.wait(last)


class FilesystemSync(_Transport):
    """Merged weights as one safetensors file, written once: a server on this machine reads it
    from our disk, a server elsewhere gets it in an HTTP request (``POST /upload_weights``).

    Args:
        client: one server's client, or a list of them.
        upload: send the file over HTTP; default: for servers not on loopback.
    """

    def __init__(self, client, directory: Path, upload: bool | None = None):
        self.clients, self.directory, self.upload = _clients(client), Path(directory), upload

    def _snapshot(self, model: torch.nn.Module) -> str:
        return str(export_weights(model, self.directory).resolve())

    def _send(self, path: str) -> list[int]:
        def send(client: InferenceClient) -> None:
            if self.upload if self.upload is not None else not client.is_local:
                client.upload_weights(path)
            else:
                client.update_weights(path)

        return _each(self.clients, send)

    def close(self) -> None:
        """Wait for a push in flight, then delete the file (the servers hold its weights; a resumed
        run or a reopened transport writes it again at its first push), and the directory when
        nothing else is in it. A run's weights stay in its checkpoints."""
        super().close()
        (self.directory / "model.safetensors").unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty (another transport's files) or already gone
            self.directory.rmdir()


class BroadcastSync(_Transport):
    """Merged weights broadcast from the trainer's device to every vLLM worker of every server
    (one group: the trainer is rank 0, server ``k``'s workers follow those of servers ``< k``).

    Args:
        client: one server's client, or a list of them.
        device: where the trainer's weights live (the broadcast buffers are built there).
        backend: ``"nccl"`` (GPUs) or ``"gloo"`` (CPU; for tests).
        host: address of this machine that the vLLM workers can reach.
        port: the group's TCPStore port (0: a free one).
        bucket_bytes: largest flat buffer per broadcast (bytes).
        timeout_s: seconds to form the group and for each update.
        warning_s: a vLLM worker that waits this long for a bucket prints the watchdog's line.
    Raises:
        RuntimeError: a server could not join (its error message).
    """

    def __init__(self, client, device: torch.device, backend: str = "nccl", host: str = "127.0.0.1",
                 port: int = 0, bucket_bytes: int = 1 << 30, timeout_s: float = 300.0,
                 warning_s: float | None = None):
        from vf_rl.inference.communicator import BroadcastGroup, free_port

        self.clients, self.bucket_bytes = _clients(client), bucket_bytes
        workers = [c.weight_sync_info()["workers"] for c in self.clients]
        offsets = [sum(workers[:k]) for k in range(len(workers))]
        port = port or free_port(host)
        world_size = 1 + sum(workers)
        # each server answers its HTTP call only once our side of the collective has run, so the
        # calls go out from background (daemon) threads
        joined = [in_daemon(lambda c=c, offset=offset: c.init_broadcast(host, port, world_size, backend,
                                                                        timeout_s, offset, warning_s))
                  for c, offset in zip(self.clients, offsets)]
        self.group = BroadcastGroup(host, port, 0, world_size, backend, timeout_s, device=device)
        self.device = self.group.device
        for future in joined:
            future.result()
        self.buckets_sent = 0

    overlaps = True
    LOST_ANSWER_S = 10.0  # after a failed broadcast, how long a server has to answer why (its engine died)

    def _snapshot(self, model: torch.nn.Module) -> tuple[list, list[torch.Tensor]]:
        buckets = plan_buckets(merged_tensors(model, merge=False), self.bucket_bytes)
        return buckets, pack_buckets(buckets, merged_tensors(model, device=self.device),
                                     empty_buffers(buckets, self.device))

    def _send(self, snapshot) -> list[int]:
        """All the servers (a broadcast needs every member of the group)."""
        buckets, buffers = snapshot
        announced = [b.to_json() for b in buckets]
        received = [in_daemon(lambda c=c: c.update_weights_broadcast(announced)) for c in self.clients]
        try:
            for buffer in buffers:  # a server that answers while its workers should be receiving has failed
                self.group.broadcast(buffer, failed=lambda: _first_error(received))
        except Exception as exc:  # a member failed, or its process died under the broadcast
            self.group.close()
            lost = _server_lost(received, self.LOST_ANSWER_S)
            if lost is not None:  # the server went down (its engine died): the trainer waits for it (_pushed)
                raise lost from exc
            raise
        for future in received:
            future.result()
        self.buckets_sent = len(buckets)
        return list(range(len(self.clients)))

    def close(self) -> None:
        super().close()
        self.group.close()


def _server_lost(futures: list[Future], wait_s: float) -> BaseException | None:
    """The first of the servers' answers (``futures``, waited for up to ``wait_s`` seconds in
    all) that says the server went away: an error of ``SERVER_LOST`` (its engine died, or the
    connection broke). ``None`` when every answer came and none says so, or none came in time."""
    deadline = time.monotonic() + wait_s
    for future in futures:
        with contextlib.suppress(Exception):  # not done in time: a stopped server is the watchdog's
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        if future.done() and isinstance(future.exception(), SERVER_LOST):
            return future.exception()
    return None


def _first_error(futures: list) -> BaseException | None:
    """The error of the first of ``futures`` that has failed, if any (never blocks)."""
    return next((f.exception() for f in futures if f.done() and f.exception() is not None), None)


class IpcSync(_Transport):
    """Merged weights packed into flat buffers on the trainer's GPU, read in place by every
    vLLM worker on that GPU through CUDA IPC (``ipc.py``). The buffers and their handles are
    made at the first push and reused (a model whose tensor layout changes gets new ones).

    Args:
        client: one server's client, or a list of them (all on the trainer's GPU).
        device: the trainer's CUDA device.
        bucket_bytes: largest flat buffer (bytes).
    """

    overlaps = True

    def __init__(self, client, device: torch.device, bucket_bytes: int = 1 << 30):
        self.clients, self.device, self.bucket_bytes = _clients(client), torch.device(device), bucket_bytes
        self.buckets: list = []
        self.buffers: list[torch.Tensor] = []
        self.handles: list[dict] = []

    def _snapshot(self, model: torch.nn.Module) -> None:
        from vf_rl.inference.ipc import share

        buckets = plan_buckets(merged_tensors(model, merge=False), self.bucket_bytes)
        if [b.to_json() for b in buckets] != [b.to_json() for b in self.buckets]:
            self.buckets = buckets
            self.buffers = empty_buffers(buckets, self.device)
            self.handles = [share(buffer) for buffer in self.buffers]
        pack_buckets(self.buckets, merged_tensors(model, device=self.device), self.buffers)

    def _send(self, snapshot=None) -> list[int]:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the buffers are written before a worker reads them
        announced = [b.to_json() for b in self.buckets]
        return _each(self.clients, lambda c: c.update_weights_ipc(announced, self.handles))


class LoraSync(_Transport):
    """Only the LoRA adapter: saved with peft, hot-loaded into each server as ``LORA_NAME``
    (the servers must be able to read the adapter's directory)."""

    def __init__(self, client, directory: Path):
        self.clients, self.directory = _clients(client), Path(directory)

    def _snapshot(self, model: torch.nn.Module) -> Path:
        final = self.directory / "lora"
        staging = self.directory / ".lora-tmp"
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(str(staging))
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        return final

    def _send(self, final: Path) -> list[int]:
        return _each(self.clients, lambda c: c.load_lora_adapter(LORA_NAME, str(final.resolve())))


def make_weight_sync(kind: str, client, output_dir: Path, device: torch.device, port: int = 0,
                     bucket_mb: int = 1024, timeout_s: float = 300.0, limits: Limits | None = None):
    """The transport object for a resolved ``kind`` (not ``auto``); ``client``: one server's
    client or a list of them; ``limits``: the watchdog's for its pushes (``None``: unwatched)."""
    start = time.perf_counter()
    if kind == "filesystem":
        sync = FilesystemSync(client, Path(output_dir) / "weights")
    elif kind == "lora":
        sync = LoraSync(client, Path(output_dir) / "weights")
    elif kind == "ipc":
        sync = IpcSync(client, device, bucket_bytes=bucket_mb << 20)
    elif kind == "nccl":
        sync = BroadcastSync(client, device, "nccl", port=port, bucket_bytes=bucket_mb << 20, timeout_s=timeout_s,
                             warning_s=limits.warning_s if limits else None)
        print(f"Weight sync: NCCL group with {len(sync.clients)} server(s) formed in "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    else:
        raise ValueError(f"weight_sync: unknown transport {kind!r}")
    sync.limits = limits
    return sync


def open_weight_sync(args, servers: list) -> tuple[object, str]:
    """The run's transport, opened: ``args.weight_sync`` (an ``RLConfig``'s; ``auto`` decided here
    by ``rules.choose_weight_sync``, the one rule the launch also checks the file's layout with)
    applied to the devices the ``servers`` report (their clients). Returns ``(transport, kind)``.

    Raises:
        ConfigError: the asked transport cannot reach these devices.
    """
    devices = [d for server in servers for d in server.weight_sync_info()["devices"]]
    kind = choose_weight_sync(args.weight_sync, device_uuid(args.device), devices,
                              server_is_local=all(server.is_local for server in servers))
    return make_weight_sync(kind, servers, Path(args.output_dir), args.device, args.weight_sync_port,
                            args.weight_sync_bucket_mb, args.vllm_server_timeout, Limits.of(args)), kind
