"""A weight-broadcast group between the trainer (rank 0) and the vLLM workers (ranks 1..N).

Built from torch's own c10d pieces without ``init_process_group``: a ``TCPStore`` hosted by
the trainer and a standalone ``ProcessGroupNCCL`` (GPUs) or ``ProcessGroupGloo`` (CPU, used
by the tests). vLLM's workers keep their own default process group untouched. The trainer
picks a free port for the store unless one is configured.
"""

from __future__ import annotations

import datetime
import re
import socket
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from vf_rl.watchdog import Limits, Look, Stalled, Watch

STORE_PREFIX = "vf-rl-weights"


def device_uuid(device: torch.device) -> str:
    """The UUID of ``device`` if it is a GPU, else ``"cpu"``: the trainer and vLLM's workers
    compare them to tell whether they share a GPU (NCCL cannot join two ranks on one GPU)."""
    if device.type != "cuda":
        return "cpu"
    return str(torch.cuda.get_device_properties(device).uuid)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now at ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BroadcastGroup:
    """One member of the weight-broadcast group.

    Args:
        host, port: the trainer's ``TCPStore`` (rank 0 hosts it).
        rank: 0 for the trainer, 1.. for vLLM workers.
        world_size: 1 + the number of vLLM workers.
        backend: ``"nccl"`` (tensors on this process's CUDA device) or ``"gloo"`` (CPU).
        timeout_s: seconds to wait for the others to join, and for each broadcast.
        warning_s: a receiving member (a vLLM worker) that waits this long for a broadcast prints
            the watchdog's line (``vf_rl.watchdog``; ``None``: not watched); ``timeout_s`` ends the wait.
    Raises:
        ValueError: unknown backend.
        RuntimeError / DistStoreError: the others did not join within ``timeout_s``.
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float = 300.0,
                 device: torch.device | None = None, warning_s: float | None = None):
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.timeout_s, self.warning_s = timeout_s, warning_s
        self.device = device or (torch.device("cuda", torch.cuda.current_device()) if backend == "nccl"
                                 else torch.device("cpu"))
        self.store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout, wait_for_workers=False)
        prefixed = dist.PrefixStore(STORE_PREFIX, self.store)
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout  # a lost peer aborts after timeout_s instead of hanging
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        else:
            self.group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor, failed: Callable[[], BaseException | None] | None = None,
                  what: str | None = None) -> None:
        """Broadcast ``tensor`` in place from rank 0 to every member (blocks until done).

        Args:
            failed: polled (every millisecond) while the broadcast is in flight; when it returns an
                error (a member that will never join, e.g. a vLLM worker out of memory), the group
                is aborted and that error raised at once, not after the group's timeout.
            what: on a receiving member with ``warning_s``, what it waits for ("weight bucket 2/5"):
                the wait is watched (``vf_rl.watchdog``: one line after ``warning_s``, ``Stalled``
                at ``timeout_s``).
        Raises:
            RuntimeError: ``failed`` returned an error (chained from it); the group is closed.
            Stalled: the watched wait reached ``timeout_s`` (the watch's stop, or the group's own
                timeout, whichever came first); the group is closed.
        """
        options = dist.BroadcastOptions()
        options.rootRank = 0
        work = self.group.broadcast([tensor], options)
        watch = None
        if what is not None and self.warning_s is not None and self.rank != 0:
            watch = Watch(f"vf-vllm's worker (rank {self.rank})", "the trainer", what,
                          lambda: Look(None, f"the trainer sends nothing (its pane says why); the broadcast group "
                                             f"gives up after timeout_s = {self.timeout_s:.0f} s"),
                          Limits(min(self.warning_s, self.timeout_s / 2), self.timeout_s), period_s=60.0,
                          ending="giving up this weight update")
        while (failed is not None or watch is not None) and not work.is_completed():
            if failed is not None and (error := failed()) is not None:
                self.close()
                raise RuntimeError(f"weight broadcast abandoned, a member failed: {error}") from error
            if watch is not None:
                try:
                    watch.check()
                except Stalled:
                    self.close()
                    raise
            time.sleep(0.001)
        try:
            work.wait()
        except Exception as exc:  # the group's own timeout can end a watched wait first: the same stop
            if watch is None or not re.search(r"(?i)timed? ?out", str(exc)):
                raise
            self.close()
            raise Stalled(watch.line(stopping=True)) from exc
        if self.backend == "nccl":
            torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        """Leave the group without waiting for the other members.

        ``abort`` rather than ``shutdown``: a graceful NCCL shutdown waits for the peers, and
        the vLLM workers keep their side open for the server's lifetime, so the trainer would
        hang at exit with ``shutdown``."""
        abort = getattr(self.group, "abort", None)
        if abort is not None:
            try:
                abort()
            except Exception:  # best effort: the peer may be gone already
                pass
        self.group = None
