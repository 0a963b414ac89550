"""FP8 current scaling and FP8 blockwise scaling as Triton kernels (twins of ``numerics``).

Current scaling needs the whole tensor's amax before the first element can be cast, so it
is two passes: :func:`~._common.tensor_amax_bits` (one read), then one cast pass that reads
each (BM x BK) tile once and writes both the row-wise data and its transpose from the
same registers; program (0, 0) also writes ``scale_inv``. Blockwise scaling needs no
global reduction: one pass over 128 x 128 tiles computes the row-wise (1 x 128) and the
column-wise (1 x 128 blocks of x^T) scales of the tile, or its one 128 x 128 scale, and
writes both layouts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tetrt_support.quant.kernels._common import (
    FP32_MAX,
    TL_FP8,
    Launcher,
    bits_to_float,
    block_amax,
    clamp_before_dual_store,
    fp8_out,
    load_rows,
    reciprocal,
    saturating_fp8_cast,
    scale_from_amax,
    software_casts,
    tensor_amax_bits,
    tile_configs,
)


# ----------------------------------------------------------------- current scaling
@triton.jit
def _current_scaling_cast_kernel(
    x_ptr, amax_bits_ptr, data_ptr, transpose_ptr, scale_inv_ptr, M, K, stride_xm,
    MAX_VALUE: tl.constexpr, POWER_OF_2: tl.constexpr, EPSILON: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, OUT_DTYPE: tl.constexpr,
    SOFTWARE: tl.constexpr, E4M3: tl.constexpr, CLAMP: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    amax = bits_to_float(tl.load(amax_bits_ptr))
    scale = scale_from_amax(amax, MAX_VALUE, POWER_OF_2, EPSILON, 3.4028234663852886e38)
    if (pid_m == 0) & (pid_k == 0):
        tl.store(scale_inv_ptr, reciprocal(scale))
    offs_m = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    offs_k = (pid_k * BK + tl.arange(0, BK)).to(tl.int64)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    q = saturating_fp8_cast(x * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, CLAMP)
    if ROWWISE:
        tl.store(data_ptr + offs_m[:, None] * K + offs_k[None, :], q, mask=mask)
    if COLUMNWISE:
        tl.store(transpose_ptr + offs_k[:, None] * M + offs_m[None, :], tl.trans(q), mask=tl.trans(mask))


_CURRENT_CAST = Launcher(
    _current_scaling_cast_kernel,
    tile_configs([(64, 128, 4), (128, 128, 8), (64, 64, 4), (32, 128, 4)]),
    key=["M", "K", "ROWWISE", "COLUMNWISE"], fixed={"BM": 64, "BK": 128},
)


def current_scaling_quantize(
    x2d: torch.Tensor,
    fp8_dtype: torch.dtype,
    *,
    force_pow_2_scales: bool = False,
    amax_epsilon: float = 0.0,
    tensor_amax: torch.Tensor | None = None,
    rowwise: bool = True,
    columnwise: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``(data (M, K) | None, transpose (K, M) | None, scale_inv (1,), amax (1,))``.

    ``data``, ``scale_inv`` and ``amax`` are ``numerics.float8_current_scaling_quantize``'s
    outputs bit for bit; ``transpose`` is ``data.t().contiguous()``, written in the same pass.
    """
    if x2d.dim() != 2 or x2d.stride(1) != 1:
        raise ValueError(f"current_scaling_quantize: expected a 2-D row-major tensor, got shape {tuple(x2d.shape)} "
                         f"strides {x2d.stride()}")
    m, k = x2d.shape
    if tensor_amax is None:
        amax_bits = tensor_amax_bits(x2d if x2d.is_contiguous() else x2d.contiguous())
    else:
        amax_bits = tensor_amax.detach().float().reshape(1).contiguous().view(torch.int32)
    dev = x2d.device
    data = torch.empty((m, k), dtype=fp8_dtype, device=dev) if rowwise else None
    transpose = torch.empty((k, m), dtype=fp8_dtype, device=dev) if columnwise else None
    scale_inv = torch.empty(1, dtype=torch.float32, device=dev)
    def grid(meta: dict[str, int]) -> tuple[int, int]:
        return (max(1, triton.cdiv(m, meta["BM"])), max(1, triton.cdiv(k, meta["BK"])))

    _CURRENT_CAST(
        grid, x2d, amax_bits, fp8_out(data) if rowwise else scale_inv, fp8_out(transpose) if columnwise else scale_inv, scale_inv,
        m, k, x2d.stride(0),
        MAX_VALUE=float(torch.finfo(fp8_dtype).max), POWER_OF_2=bool(force_pow_2_scales), EPSILON=float(amax_epsilon),
        ROWWISE=rowwise, COLUMNWISE=columnwise, OUT_DTYPE=TL_FP8[fp8_dtype], SOFTWARE=software_casts(),
        E4M3=fp8_dtype == torch.float8_e4m3fn, CLAMP=clamp_before_dual_store(x2d),
    )
    return data, transpose, scale_inv, amax_bits.view(torch.float32)


# ------------------------------------------------------------------------ blockwise
@triton.jit
def _one_row_in_eight(x_ptr, first, r: tl.constexpr, offs_c, mask_c, M, stride_xm, ROWS: tl.constexpr):
    """``[c, a] = x[first + 8 a + r, offs_c[c]]`` (a < ROWS / 8) as fp32, 0 outside x."""
    offs_t = (first + tl.arange(0, ROWS // 8) * 8 + r).to(tl.int64)
    mask = mask_c[:, None] & (offs_t[None, :] < M)
    return tl.load(x_ptr + offs_t[None, :] * stride_xm + offs_c[:, None], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _load_in_eighths(x_ptr, first, offs_c, mask_c, M, stride_xm, ROWS: tl.constexpr):
    """Rows first .. first + ROWS of x at columns ``offs_c`` as eight (C, ROWS / 8) parts,
    part r holding rows first + 8 a + r. The eight loads share one layout, so each thread
    holds eight consecutive rows of its columns, which a transposed store needs
    (:func:`_store_transposed`)."""
    return (_one_row_in_eight(x_ptr, first, 0, offs_c, mask_c, M, stride_xm, ROWS),
            _one_row_in_eight(x_ptr, first, 1, offs_c, mask_c, M, stride_xm, ROWS),
            _one_row_in_eight(x_ptr, first, 2, offs_c, mask_c, M, stride_xm, ROWS),
            _one_row_in_eight(x_ptr, first, 3, offs_c, mask_c, M, stride_xm, ROWS),
            _one_row_in_eight(x_ptr, first, 4, offs_c, mask_c, M, stride_xm, ROWS),
            _one_row_in_eight(x_ptr, first, 5, offs_c, mask_c, M, stride_xm, ROWS),
            _one_row_in_eight(x_ptr, first, 6, offs_c, mask_c, M, stride_xm, ROWS),
            _one_row_in_eight(x_ptr, first, 7, offs_c, mask_c, M, stride_xm, ROWS))


@triton.jit
def _cast_eighths(x0, x1, x2, x3, x4, x5, x6, x7, scale, MAX_VALUE: tl.constexpr, OUT_DTYPE: tl.constexpr,
                  SOFTWARE: tl.constexpr, E4M3: tl.constexpr):
    """:func:`saturating_fp8_cast` of each part times ``scale``. Each cast is stored once (no
    explicit clamp: that is for kernels storing one cast tile both ways)."""
    return (saturating_fp8_cast(x0 * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False),
            saturating_fp8_cast(x1 * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False),
            saturating_fp8_cast(x2 * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False),
            saturating_fp8_cast(x3 * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False),
            saturating_fp8_cast(x4 * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False),
            saturating_fp8_cast(x5 * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False),
            saturating_fp8_cast(x6 * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False),
            saturating_fp8_cast(x7 * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False))


@triton.jit
def _store_transposed(out_ptr, q0, q1, q2, q3, q4, q5, q6, q7, first, offs_c, mask_c, M, ROWS: tl.constexpr):
    """The eight parts of :func:`_load_in_eighths`, cast, stored transposed into a row-major
    (K, M) buffer: ``out[c, first + t]``.

    tl.join packs each thread's eight rows of a column in its registers, so the layout
    change before the store moves 8-byte words through shared memory; tl.trans of a cast
    (ROWS, C) tile moved single bytes (st.shared.b8), 64 per thread and 128 x 64 slab."""
    q = tl.join(tl.join(tl.join(q0, q1), tl.join(q2, q3)), tl.join(tl.join(q4, q5), tl.join(q6, q7)))
    # q[c, a, k, i, h] is row 8a + 4h + 2i + k: reorder to [c, 8a + 4h + 2i + k]
    q = tl.reshape(tl.permute(q, (0, 1, 4, 3, 2)), (q0.shape[0], ROWS))
    offs_t = (first + tl.arange(0, ROWS)).to(tl.int64)
    tl.store(out_ptr + offs_c[:, None] * M + offs_t[None, :], q, mask=mask_c[:, None] & (offs_t[None, :] < M))


@triton.jit
def _blockwise_kernel(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr, M, K, stride_xm,
    stride_rs0, stride_rs1, stride_cs0, stride_cs1,
    MAX_VALUE: tl.constexpr, POWER_OF_2: tl.constexpr, EPSILON: tl.constexpr, VALUE_FOR_INF: tl.constexpr,
    TWO_D: tl.constexpr, ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, OUT_DTYPE: tl.constexpr,
    SOFTWARE: tl.constexpr, E4M3: tl.constexpr, CLAMP: tl.constexpr, B: tl.constexpr, SLAB_1: tl.constexpr,
    SLAB_2: tl.constexpr,
):
    """One B x B tile (B = 128) of x, read in slabs (few registers live).

    Row-wise layout: data (M, K), scales over 1 x B (or B x B) blocks at [m, k // B] (or
    [m // B, k // B]). Column-wise: the same recipe on x^T, data (K, M), scales at
    [k, m // B] (or [k // B, m // B]).

    1 x B blocks: the two layouts share no arithmetic, so with both a tile has two programs,
    side by side in the launch order (grid axis 0), one per layout; the second reads the
    tile from L2. The row-wise program walks SLAB_1-row slabs (each row's block lies in
    its slab); the column-wise one walks B x SLAB_2 column slabs (each column's block
    lies in its slab), each loaded as eight parts of one row in eight, and stores them
    transposed with 8-byte words (:func:`_store_transposed`). One program doing both held
    the column-wise slab's registers while it did the row-wise work, at a quarter occupancy.

    B x B blocks (one scale per tile, both layouts the same bytes, the column-wise one
    transposed): a running elementwise maximum over SLAB_1-row slabs, one reduction,
    then the cast in SLAB_2-row slabs (from L2), each stored both ways.

    Magnitudes are reduced as floats (:func:`block_amax`) and the clamp is the conversion's
    own saturation (:func:`saturating_fp8_cast`; ``CLAMP`` keeps it explicit for B x B blocks
    of inputs other than bf16): both give the reference's values with fewer instructions per
    element, which this kernel was short of (it was slower than its bytes allow)."""
    if TWO_D or not (ROWWISE and COLUMNWISE):
        role = 0 if ROWWISE else 1
    else:
        role = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    if TWO_D:
        offs_k = (pid_k * B + tl.arange(0, B)).to(tl.int64)
        mask_k = offs_k < K
        running = tl.zeros((SLAB_1, B), dtype=tl.float32)
        for s in tl.static_range(B // SLAB_1):
            _, _, x = load_rows(x_ptr, pid_m * B + s * SLAB_1, SLAB_1, offs_k, mask_k, M, stride_xm)
            running = tl.maximum(running, tl.abs(x))  # drops NaN, as block_amax does
        scale = scale_from_amax(block_amax(block_amax(running, 1), 0), MAX_VALUE, POWER_OF_2, EPSILON, VALUE_FOR_INF)
        scale_inv = reciprocal(scale)
        if ROWWISE:
            tl.store(row_scale_ptr + pid_m * stride_rs0 + pid_k * stride_rs1, scale_inv)
        if COLUMNWISE:
            tl.store(col_scale_ptr + pid_k * stride_cs0 + pid_m * stride_cs1, scale_inv)
        for s in tl.static_range(B // SLAB_2):
            offs_m, mask, x = load_rows(x_ptr, pid_m * B + s * SLAB_2, SLAB_2, offs_k, mask_k, M, stride_xm)
            q = saturating_fp8_cast(x * scale, MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, CLAMP)
            if ROWWISE:
                tl.store(row_data_ptr + offs_m[:, None] * K + offs_k[None, :], q, mask=mask)
            if COLUMNWISE:
                tl.store(col_data_ptr + offs_k[:, None] * M + offs_m[None, :], tl.trans(q), mask=tl.trans(mask))
    elif role == 0:
        # The two 1 x B programs spell their loads out rather than call load_rows, which
        # generates other code (other layouts) than the form timed in
        # benchmarks/results/gpu_check_cuda.json.
        offs_k = (pid_k * B + tl.arange(0, B)).to(tl.int64)
        mask_k = offs_k < K
        for i in tl.static_range(B // SLAB_1):
            offs_m = (pid_m * B + i * SLAB_1 + tl.arange(0, SLAB_1)).to(tl.int64)
            mask_m = offs_m < M
            mask = mask_m[:, None] & mask_k[None, :]
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
            row_scale = scale_from_amax(block_amax(x, 1), MAX_VALUE, POWER_OF_2, EPSILON, VALUE_FOR_INF)
            q_row = saturating_fp8_cast(x * row_scale[:, None], MAX_VALUE, OUT_DTYPE, SOFTWARE, E4M3, False)
            tl.store(row_data_ptr + offs_m[:, None] * K + offs_k[None, :], q_row, mask=mask)
            tl.store(row_scale_ptr + offs_m * stride_rs0 + pid_k * stride_rs1, reciprocal(row_scale), mask=mask_m)
    else:
        # Eight loads of one row in eight (:func:`_load_in_eighths`): the transposed store
        # then moves words, not bytes, through shared memory (:func:`_store_transposed`).
        first_t = pid_m * B
        for j in tl.static_range(B // SLAB_2):
            offs_c = (pid_k * B + j * SLAB_2 + tl.arange(0, SLAB_2)).to(tl.int64)
            mask_c = offs_c < K
            x0, x1, x2, x3, x4, x5, x6, x7 = _load_in_eighths(x_ptr, first_t, offs_c, mask_c, M, stride_xm, B)
            running = tl.maximum(tl.maximum(tl.maximum(tl.abs(x0), tl.abs(x1)), tl.maximum(tl.abs(x2), tl.abs(x3))),
                                 tl.maximum(tl.maximum(tl.abs(x4), tl.abs(x5)), tl.maximum(tl.abs(x6), tl.abs(x7))))
            col_scale = scale_from_amax(block_amax(running, 1), MAX_VALUE, POWER_OF_2, EPSILON, VALUE_FOR_INF)
            tl.store(col_scale_ptr + offs_c * stride_cs0 + pid_m * stride_cs1, reciprocal(col_scale), mask=mask_c)
            q0, q1, q2, q3, q4, q5, q6, q7 = _cast_eighths(x0, x1, x2, x3, x4, x5, x6, x7, col_scale[:, None], MAX_VALUE,
                                                           OUT_DTYPE, SOFTWARE, E4M3)
            _store_transposed(col_data_ptr, q0, q1, q2, q3, q4, q5, q6, q7, first_t, offs_c, mask_c, M, B)


BLOCK = 128


def _scale_buffer(compact_shape: tuple[int, int], block_scaling_dim: int, device: torch.device,
                  gemm_ready: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the buffer to return, the compact-shaped view of it the kernel writes through).

    GEMM-ready (TE's ``Float8BlockQuantizer.get_scale_shape``): 1 x 128 scales stored
    transposed, (cols, rows padded to 4); 128 x 128 scales (rows, cols padded to 4). The
    kernel writes only the valid region, so a buffer with padding starts zeroed (the
    reference's padding is zero)."""
    if not gemm_ready:
        compact = torch.empty(compact_shape, dtype=torch.float32, device=device)
        return compact, compact
    from tetrt_support.quant.scale_layouts import blockwise_padded_shape

    rows, cols = compact_shape
    shape = blockwise_padded_shape(compact_shape, block_scaling_dim)
    padded = shape != ((cols, rows) if block_scaling_dim == 1 else (rows, cols))
    buffer = (torch.zeros if padded else torch.empty)(shape, dtype=torch.float32, device=device)
    view = buffer[:, :rows].t() if block_scaling_dim == 1 else buffer[:, :cols]
    return buffer, view


_BLOCKWISE = Launcher(
    _blockwise_kernel,
    # (SLAB_1, SLAB_2, warps): the autotuner's candidates, picked per shape. The first line
    # holds the forms meant for both 1 x 128 layouts of an activation ((64, 64, 4)), a
    # weight's 128 x 128 blocks ((64, 64, 8)) and the row-wise layout alone ((64, 32, 8)); the
    # second adds narrower slabs and 8-warp forms, which hold fewer registers per thread.
    # Autotuned times: benchmarks/results/gpu_check_cuda.json ("kernels_autotuned_s").
    tile_configs([(64, 64, 4), (32, 64, 4), (64, 32, 4), (64, 64, 8), (32, 32, 4), (128, 64, 8),
                  (64, 16, 4), (32, 16, 4), (64, 32, 8), (32, 32, 8), (32, 64, 8), (32, 128, 8)],
                 names=("SLAB_1", "SLAB_2")),
    key=["M", "K", "TWO_D", "ROWWISE", "COLUMNWISE"], fixed={"SLAB_1": 32, "SLAB_2": 32},
)


def blockwise_quantize(
    x2d: torch.Tensor,
    fp8_dtype: torch.dtype,
    block_scaling_dim: int,
    *,
    force_pow_2_scales: bool = True,
    amax_epsilon: float = 0.0,
    rowwise: bool = True,
    columnwise: bool = False,
    gemm_ready_scales: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``(row_data, row_scale_inv, col_data, col_scale_inv)`` of FP8 blockwise scaling.

    Row-wise: ``numerics.float8_blockwise_quantize(x2d, ...)``; column-wise: the same of
    ``x2d.t()`` (data (K, M)); blocks 1 x 128 (``block_scaling_dim=1``) or 128 x 128 (2).
    Scales are (ceil(M/br), ceil(K/128)) row-major, as the reference returns them; with
    ``gemm_ready_scales`` they are written straight into TE's GEMM-ready buffers instead
    (``scale_layouts.store_blockwise_scales`` of those, zero padding included), as TE's
    kernels write them: no compact copy, no re-layout pass, and the GEMM reads them as views.
    """
    if block_scaling_dim not in (1, 2):
        raise ValueError(f"blockwise_quantize: block_scaling_dim must be 1 or 2, got {block_scaling_dim}")
    if x2d.dim() != 2 or x2d.stride(1) != 1:
        raise ValueError(f"blockwise_quantize: expected a 2-D row-major tensor, got strides {x2d.stride()}")
    m, k = x2d.shape
    dev = x2d.device
    two_d = block_scaling_dim == 2
    cdiv = triton.cdiv
    row_data = torch.empty((m, k), dtype=fp8_dtype, device=dev) if rowwise else None
    col_data = torch.empty((k, m), dtype=fp8_dtype, device=dev) if columnwise else None
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    row_scale, rs = (_scale_buffer((cdiv(m, BLOCK) if two_d else m, cdiv(k, BLOCK)), block_scaling_dim, dev,
                                   gemm_ready_scales) if rowwise else (None, dummy.view(1, 1)))
    col_scale, cs = (_scale_buffer((cdiv(k, BLOCK) if two_d else k, cdiv(m, BLOCK)), block_scaling_dim, dev,
                                   gemm_ready_scales) if columnwise else (None, dummy.view(1, 1)))
    roles = 2 if rowwise and columnwise and not two_d else 1  # one program per 1 x 128 layout and tile
    grid = (roles, max(1, cdiv(m, BLOCK)), max(1, cdiv(k, BLOCK)))
    if m and k:
        _BLOCKWISE(
            lambda meta: grid, x2d, fp8_out(row_data) if rowwise else dummy, rs, fp8_out(col_data) if columnwise else dummy, cs, m, k, x2d.stride(0),
            rs.stride(0), rs.stride(1), cs.stride(0), cs.stride(1),
            MAX_VALUE=float(torch.finfo(fp8_dtype).max), POWER_OF_2=bool(force_pow_2_scales),
            EPSILON=float(amax_epsilon), VALUE_FOR_INF=float(torch.finfo(x2d.dtype).max), TWO_D=two_d,
            ROWWISE=rowwise, COLUMNWISE=columnwise, OUT_DTYPE=TL_FP8[fp8_dtype], SOFTWARE=software_casts(),
            E4M3=fp8_dtype == torch.float8_e4m3fn, CLAMP=clamp_before_dual_store(x2d), B=BLOCK,
        )
    return row_data, row_scale, col_data, col_scale


__all__ = ["FP32_MAX", "blockwise_quantize", "current_scaling_quantize"]
