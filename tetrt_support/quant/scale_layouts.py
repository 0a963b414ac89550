"""TransformerEngine's storage layouts of block scales: padding, GEMM swizzling, GEMM-ready blockwise.

The one place that maps the numerics' COMPACT scales (one entry per block, row-major) to the
buffers TE allocates: MXFP8/NVFP4 padding, cuBLAS's swizzled layout (``optimize_for_gemm``)
and FP8 blockwise's GEMM-ready layout. Padding is zero here (unspecified in TE): compare the
valid region. The layouts: ``docs/architecture.md`` ("Module notes", scale layouts).
"""

from __future__ import annotations

import torch

#: cuBLAS's block-scaling tile: 128 rows of scales by 4 scale columns.
SWIZZLE_TILE_ROWS = 128
SWIZZLE_TILE_COLS = 4


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


def pad_to(scales: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``scales`` (r, c) zero-padded at the bottom/right to (rows, cols) (r <= rows, c <= cols)."""
    r, c = scales.shape
    if r > rows or c > cols:
        raise ValueError(f"pad_to: scales of shape {tuple(scales.shape)} do not fit in ({rows}, {cols})")
    out = torch.zeros((rows, cols), dtype=scales.dtype, device=scales.device)
    out[:r, :c] = scales
    return out


def _byte_view(scales: torch.Tensor) -> torch.Tensor:
    return scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales


def swizzle(padded: torch.Tensor) -> torch.Tensor:
    """A (128a, 4b) scale matrix in cuBLAS's tiled layout, same shape and dtype (pure permutation)."""
    rows, cols = padded.shape
    if rows % SWIZZLE_TILE_ROWS or cols % SWIZZLE_TILE_COLS:
        raise ValueError(f"swizzle: needs a multiple of (128, 4), got {tuple(padded.shape)}")
    tiles = padded.reshape(rows // 128, 4, 32, cols // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().reshape(rows, cols)


def unswizzle(swizzled: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`swizzle`."""
    rows, cols = swizzled.shape
    tiles = swizzled.reshape(rows // 128, cols // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().reshape(rows, cols)


# ----------------------------------------------------------- MXFP8 and NVFP4
def microscale_padded_shape(compact_shape: tuple[int, int], along_rows: bool) -> tuple[int, int]:
    """TE's allocated shape for compact scales: (128, 4) multiples, or (4, 128) for scales
    whose blocks run along the rows (MXFP8 column-wise)."""
    r, c = compact_shape
    return (round_up(r, 4), round_up(c, 128)) if along_rows else (round_up(r, 128), round_up(c, 4))


def store_microscales(compact: torch.Tensor, *, along_rows: bool, swizzled: bool) -> torch.Tensor:
    """Compact MXFP8/NVFP4 scales -> TE's buffer (padded with zeros; swizzled if asked).

    Where the shape needs no padding and no swizzle, the compact scales already are TE's
    buffer and are kept as they are (a quantize kernel's fresh output): a zero fill and a
    device copy per layout less on every quantize."""
    padded = microscale_padded_shape(tuple(compact.shape), along_rows)
    if not swizzled and padded == tuple(compact.shape):
        return compact.contiguous()
    raw = pad_to(_byte_view(compact.contiguous()), *padded)
    if swizzled:
        raw = swizzle(raw.t().contiguous()).reshape(raw.shape) if along_rows else swizzle(raw)
    return raw.view(compact.dtype)


def load_microscales(
    buffer: torch.Tensor, compact_shape: tuple[int, int], *, along_rows: bool, swizzled: bool
) -> torch.Tensor:
    """TE's buffer -> the compact (valid-region) scales, the inverse of :func:`store_microscales`."""
    expected = microscale_padded_shape(compact_shape, along_rows)
    if tuple(buffer.shape) != expected:
        raise ValueError(f"scale buffer has shape {tuple(buffer.shape)}, TE's layout for {compact_shape} is {expected}")
    raw = _byte_view(buffer)
    if swizzled:
        if along_rows:
            raw = unswizzle(raw.reshape(expected[1], expected[0])).t()
        else:
            raw = unswizzle(raw)
    r, c = compact_shape
    return raw[:r, :c].contiguous().view(buffer.dtype)


# --------------------------------------------------------------- FP8 blockwise
def blockwise_padded_shape(compact_shape: tuple[int, int], block_scaling_dim: int) -> tuple[int, int]:
    """TE's GEMM-ready scale shape for compact (row blocks, column blocks) scales."""
    r, c = compact_shape
    return (c, round_up(r, 4)) if block_scaling_dim == 1 else (r, round_up(c, 4))


def store_blockwise_scales(compact: torch.Tensor, block_scaling_dim: int) -> torch.Tensor:
    """Compact (M/br, K/bc) fp32 scales -> TE's GEMM-ready buffer (1x128: transposed)."""
    oriented = compact.t() if block_scaling_dim == 1 else compact
    return pad_to(oriented, *blockwise_padded_shape(tuple(compact.shape), block_scaling_dim))


def load_blockwise_scales(buffer: torch.Tensor, compact_shape: tuple[int, int], block_scaling_dim: int) -> torch.Tensor:
    """TE's GEMM-ready buffer -> compact (M/br, K/bc) scales."""
    expected = blockwise_padded_shape(compact_shape, block_scaling_dim)
    if tuple(buffer.shape) != expected:
        raise ValueError(f"scale buffer has shape {tuple(buffer.shape)}, TE's layout for {compact_shape} is {expected}")
    r, c = compact_shape
    if block_scaling_dim == 1:
        return buffer[:c, :r].t().contiguous()
    return buffer[:r, :c].contiguous()
