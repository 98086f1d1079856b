"""The sizes a micro batch is padded to for CUDA graphs, which replay one recorded graph per
input shape (``packing.pad_to_buckets``). Without torch: the launcher's memory estimate
(``memory.pass_tokens``) reads them too."""

from __future__ import annotations


def bucket(n: int, floor: int, per_octave: int = 8) -> int:
    """The smallest size ``>= n`` (and ``>= floor``) on a grid of ``per_octave`` steps per
    doubling: a multiple of ``2**e / per_octave`` for the largest power of two ``2**e <= n``. So
    at most ``per_octave`` sizes per doubling, each at most ``1 / per_octave`` of ``2**e`` above
    ``n`` (4097 -> 4608, 3000 -> 3072 with 8 steps)."""
    step = max(1, (1 << (max(n, 1).bit_length() - 1)) // per_octave)
    return max(floor, -(-n // step) * step)
