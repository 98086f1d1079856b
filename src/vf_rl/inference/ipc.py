"""CUDA IPC handles as JSON: how the ``ipc`` weight-sync transport lets a vLLM worker on the
trainer's own GPU read the trainer's weight buffers in place, with no copy through the host.

The trainer shares a flat buffer once (:func:`share`: CUDA's ``cudaIpcGetMemHandle`` through
torch's storage sharing, the mechanism ``torch.multiprocessing`` uses to pass CUDA tensors
between processes) and keeps it alive and reuses it for every update; the worker opens the
handle once (:func:`open_shared`) and copies out of it at each update. Only plain values
cross the HTTP request (base64 for the byte handles): nothing is unpickled on the server.
"""

from __future__ import annotations

import base64

import torch

from vf_rl.inference.buckets import DTYPES


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode()


def _unb64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value)


def share(buffer: torch.Tensor) -> dict:
    """The JSON description of a 1-D CUDA tensor that another process on the same GPU can open.

    Args:
        buffer: 1-D, contiguous, on a CUDA device, dtype in ``buckets.DTYPES``; the caller keeps
            it alive (and must not free it) while any process may still read it.
    Returns:
        ``{"handle", "storage_bytes", "storage_offset", "ref_counter", "ref_offset", "event",
        "event_sync", "numel", "dtype"}``: byte handles base64-encoded, sizes in bytes.
    Raises:
        ValueError: not a 1-D contiguous CUDA tensor of a supported dtype.
    """
    dtype = str(buffer.dtype).removeprefix("torch.")
    if buffer.device.type != "cuda" or buffer.dim() != 1 or not buffer.is_contiguous() or dtype not in DTYPES:
        raise ValueError(f"share: expected a 1-D contiguous CUDA tensor of {sorted(DTYPES)}, got "
                         f"{buffer.dtype} {tuple(buffer.shape)} on {buffer.device}")
    (_, handle, storage_bytes, storage_offset, ref_counter, ref_offset, event,
     event_sync) = buffer.untyped_storage()._share_cuda_()
    return {"handle": _b64(handle), "storage_bytes": int(storage_bytes), "storage_offset": int(storage_offset),
            "ref_counter": _b64(ref_counter), "ref_offset": int(ref_offset), "event": _b64(event),
            "event_sync": bool(event_sync), "numel": buffer.numel(), "tensor_offset": buffer.storage_offset(),
            "dtype": dtype}


def open_shared(data: dict, device: torch.device) -> torch.Tensor:
    """Open a buffer described by :func:`share` in this process, on ``device`` (the same
    physical GPU as the sharing process, under this process's device numbering).

    Returns:
        a 1-D tensor that aliases the other process's memory (read it, copy out of it).
    Raises:
        ValueError: unknown dtype. RuntimeError: CUDA cannot open the handle (another GPU, or
        the sharing process has exited).
    """
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if data.get("dtype") not in DTYPES:
        raise ValueError(f"ipc buffer dtype must be one of {sorted(DTYPES)}, got {data.get('dtype')!r}")
    numel = int(data["numel"])
    index = device.index if device.index is not None else torch.cuda.current_device()
    return rebuild_cuda_tensor(torch.Tensor, (numel,), (1,), int(data.get("tensor_offset", 0)),
                               torch.storage.TypedStorage, DTYPES[data["dtype"]], index,
                               _unb64(data["handle"]), int(data["storage_bytes"]), int(data["storage_offset"]),
                               False, _unb64(data["ref_counter"]), int(data["ref_offset"]), _unb64(data["event"]),
                               bool(data["event_sync"]))
