"""The uniform draws of NVFP4's stochastic rounding: Philox4x32-10, counted per element.

As in TE, the draws are made in the kernel, not stored. One 64-bit seed per layout is drawn
from the caller's generator (``torch.randint`` on the tensor's device, so a CUDA-graph replay
draws a fresh one); element ``i`` of the row-major matrix gets word ``i % 4`` of
``Philox4x32-10(counter=(i // 4, 0, 0, 0), key=(seed low, seed high))`` as
``(word >> 8) * 2**-24``, exact in fp32 and in ``[0, 1)``. :func:`uniform` is the numpy
reference (checked against the published known-answer vectors); the Triton kernel makes the
same words, so the bytes follow from the generator's state (not equal to TE's).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["KEY_BUMPS", "MULTIPLIERS", "ROUNDS", "draw_seed", "philox4x32", "uniform"]

#: Philox4x32's round multipliers and Weyl key increments (Salmon et al., SC 2011)
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
KEY_BUMPS = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
_LOW32 = np.uint64(0xFFFFFFFF)


def philox4x32(counter: tuple[np.ndarray, ...], key: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """The four output words (uint64 arrays holding 32-bit values) of Philox4x32-10."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & _LOW32 for c in counter)
    k0, k1 = np.uint64(key[0] & 0xFFFFFFFF), np.uint64(key[1] & 0xFFFFFFFF)
    m0, m1 = np.uint64(MULTIPLIERS[0]), np.uint64(MULTIPLIERS[1])
    for _ in range(ROUNDS):
        p0, p1 = m0 * c0, m1 * c2  # 32 x 32 -> 64 bits, exact in uint64
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _LOW32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _LOW32
        k0 = (k0 + np.uint64(KEY_BUMPS[0])) & _LOW32
        k1 = (k1 + np.uint64(KEY_BUMPS[1])) & _LOW32
    return c0, c1, c2, c3


def draw_seed(generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """One int64 seed, a (1,) tensor on ``device``, from ``generator`` (torch's default when None)."""
    return torch.randint(0, 2**63 - 1, (1,), generator=generator, device=device, dtype=torch.int64)


def uniform(seed: int | torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The (R, C) fp32 draws of a row-major matrix for ``seed`` (C a multiple of 4), on the CPU."""
    rows, cols = (int(s) for s in shape)
    if cols % 4:
        raise ValueError(f"philox.uniform: the row length ({cols}) must be a multiple of 4 (one Philox call per 4)")
    seed = int(seed.item() if isinstance(seed, torch.Tensor) else seed)
    quads = np.arange(rows * cols // 4, dtype=np.uint64)
    zero = np.zeros_like(quads)
    words = philox4x32((quads & _LOW32, quads >> np.uint64(32), zero, zero), (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    interleaved = np.stack(words, axis=-1).reshape(rows, cols)  # element 4q + j is word j of quad q
    return torch.from_numpy((interleaved >> np.uint64(8)).astype(np.float32) * np.float32(2.0**-24))
