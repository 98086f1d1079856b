"""Weight buckets: many named tensors packed into a few flat buffers, so a weight update is a
handful of large collective broadcasts instead of one message per tensor.

The trainer plans (:func:`plan_buckets`) and packs (:func:`pack_buckets`), sends each bucket's metadata as JSON over HTTP and
broadcasts each buffer; every vLLM worker allocates the same buffers, receives them and
unpacks them (:func:`unpack_bucket`) into views. Used by the ``nccl`` weight-sync transport, and
by ``ipc``, whose buffers stay on the trainer's GPU and are opened by the workers in place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

DTYPES = {str(d).removeprefix("torch."): d for d in (torch.bfloat16, torch.float16, torch.float32, torch.float64)}


@dataclass
class Bucket:
    """One flat buffer's worth of tensors, all of one dtype.

    Attributes:
        dtype: dtype name (``"bfloat16"``, ``"float16"``, ``"float32"``, ``"float64"``).
        tensors: ``(name, shape, offset)`` per tensor; ``offset`` in elements from the start
            of the buffer.
        numel: elements in the buffer.
    """

    dtype: str
    tensors: list[tuple[str, list[int], int]] = field(default_factory=list)
    numel: int = 0

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "numel": self.numel, "tensors": [list(t) for t in self.tensors]}

    @classmethod
    def from_json(cls, data: dict) -> "Bucket":
        """Raises ``ValueError`` on an unknown dtype or inconsistent offsets."""
        if data.get("dtype") not in DTYPES:
            raise ValueError(f"bucket dtype must be one of {sorted(DTYPES)}, got {data.get('dtype')!r}")
        bucket = cls(data["dtype"], [(str(n), [int(s) for s in shape], int(o)) for n, shape, o in data["tensors"]],
                     int(data["numel"]))
        end = 0
        for name, shape, offset in bucket.tensors:
            if offset != end:
                raise ValueError(f"bucket tensor {name}: offset {offset}, expected {end}")
            end += math.prod(shape)
        if end != bucket.numel:
            raise ValueError(f"bucket numel {bucket.numel} != sum of its tensors {end}")
        return bucket


def plan_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    """Group tensors into buckets of at most ``bucket_bytes`` bytes per dtype, in the given
    order. A tensor larger than ``bucket_bytes`` gets a bucket of its own.

    Args:
        named_tensors: ``(name, tensor)`` pairs; tensors of any device, dtypes in ``DTYPES``.
        bucket_bytes: the largest buffer to build (bytes, > 0).
    Raises:
        ValueError: ``bucket_bytes`` not positive, or a tensor of an unsupported dtype.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    open_buckets: dict[str, Bucket] = {}
    done: list[Bucket] = []
    for name, tensor in named_tensors:
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {tensor.dtype} cannot be sent (expected one of {sorted(DTYPES)})")
        size = tensor.numel() * tensor.element_size()
        bucket = open_buckets.get(dtype)
        if bucket is not None and bucket.numel and (bucket.numel * tensor.element_size() + size > bucket_bytes):
            done.append(bucket)
            bucket = None
        if bucket is None:
            bucket = open_buckets[dtype] = Bucket(dtype)
        bucket.tensors.append((name, list(tensor.shape), bucket.numel))
        bucket.numel += tensor.numel()
    return done + [b for b in open_buckets.values() if b.numel]


def empty_buffers(buckets: list[Bucket], device: torch.device) -> list[torch.Tensor]:
    """One uninitialized flat buffer per bucket on ``device`` (1-D, ``bucket.numel`` elements of
    its dtype), for :func:`pack_buckets`."""
    return [torch.empty(b.numel, dtype=DTYPES[b.dtype], device=device) for b in buckets]


def pack_buckets(buckets: list[Bucket], named_tensors: Iterable[tuple[str, torch.Tensor]],
                 out: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copy each tensor of ``named_tensors`` into its place in the flat buffers ``out`` (one per
    bucket: 1-D, ``bucket.numel`` elements of its dtype), as the tensors arrive: a stream of
    tensors computed one at a time (``weights.merged_tensors``) never needs to be held whole.

    Raises:
        ValueError: a tensor the plan lacks, or one of a different size, or a planned tensor
            that did not arrive.
    """
    places = {name: (i, offset, math.prod(shape)) for i, bucket in enumerate(buckets)
              for name, shape, offset in bucket.tensors}
    for name, tensor in named_tensors:
        if name not in places:
            raise ValueError(f"{name}: not in the bucket plan")
        i, offset, numel = places.pop(name)
        if tensor.numel() != numel:
            raise ValueError(f"{name}: {tensor.numel()} elements, the bucket plan has {numel}")
        out[i][offset:offset + numel].copy_(tensor.reshape(-1))
    if places:
        raise ValueError(f"{len(places)} planned tensors did not arrive (the first: {next(iter(places))})")
    return out


def unpack_bucket(bucket: Bucket, buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views of ``buffer`` (1-D, ``bucket.numel`` elements) shaped as the bucket's tensors."""
    return [(name, buffer[offset:offset + math.prod(shape)].view(shape)) for name, shape, offset in bucket.tensors]
