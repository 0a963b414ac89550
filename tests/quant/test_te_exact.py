"""Bit-exact against TransformerEngine's algorithms (the independent oracle in te_reference),
and one named regression test per divergence this package once had from TE."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.quant import te_cases, te_reference
from tetrt_support.quant import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    numerics,
)

def compact(t, layout: str = "rowwise") -> torch.Tensor:
    """The valid region of a tensor's scales (TE's padding and swizzling undone)."""
    return t._quantizer.compact_scale_inv(t, layout)


PAIRS = [(case, fam) for case in te_cases.CASES for fam in case.families]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case, family", PAIRS, ids=[f"{c.name}-{f}" for c, f in PAIRS])
def test_every_buffer_is_bit_exact_with_te(case: te_cases.Case, family: str, dtype: str) -> None:
    x = te_cases.family(family, te_cases.small_shape(case), te_cases.DTYPES[dtype], seed=3)
    fractions = te_cases.compare(case, x)
    assert fractions == {name: 1.0 for name in fractions}, fractions


@pytest.mark.parametrize("shape", [(), (7,), (3, 5, 130)])
@pytest.mark.parametrize("make", [lambda: Float8CurrentScalingQuantizer(columnwise_usage=True),
                                  lambda: Float8BlockQuantizer(columnwise_usage=True),
                                  lambda: Float8BlockQuantizer(block_scaling_dim=2, columnwise_usage=True)],
                         ids=["current", "block1d", "block2d"])
def test_shapes_te_accepts_including_0d_and_partial_blocks(make, shape: tuple[int, ...]) -> None:
    """Divergence 9: TE quantizes 0-d tensors (and pads partial blocks)."""
    x = torch.randn(shape) * 3
    q = make()
    t = q.quantize(x)
    assert t.shape == x.shape and t.dequantize().shape == x.shape
    case = te_cases.Case("", make, te_cases._current(torch.float8_e4m3fn, False) if isinstance(q, Float8CurrentScalingQuantizer)
                         else te_cases._blockwise(q.block_scaling_dim))
    assert set(te_cases.compare(case, x).values()) == {1.0}
    torch.testing.assert_close(t.dequantize(), x, rtol=0.07, atol=1e-6)


# ----------------------------------------------------------- divergences, by number
def test_divergence_1_scale_is_one_correctly_rounded_division() -> None:
    amax = torch.tensor([[2.7630667686462402]])
    _, scale = Float8CurrentScalingQuantizer().compute_scale(amax)
    assert scale.item() == 162.13868713378906  # TE's __fdiv_rn(448, amax)
    assert (448.0 / amax).item() == 162.138671875  # reciprocal-then-multiply: one ulp low
    assert scale.item() == float(np.float32(448.0) / np.float32(2.7630667686462402))


def test_divergence_2_nvfp4_block_scale_folds_one_sixth_into_the_global_scale() -> None:
    # bf16 values where (amax / 6) * S and amax * (S * (1/6)) round to different E4M3 scales.
    # 16 rows (TE's create_tensor needs M % 16 == 0 for any usage); rows 1-15 are zeros,
    # which change neither the global amax nor row 0's codes.
    x = torch.zeros(16, 32, dtype=torch.bfloat16)
    x[0, 0], x[0, 1] = 0.796875, 0.07470703125  # global amax, then a block of its own below
    x[0, 16] = 0.07470703125
    t = NVFP4Quantizer(columnwise_usage=False).quantize(x)
    assert t._rowwise_scale_inv.float()[0, 1].item() == 44.0  # TE; the two-rounding formula gives 40
    codes, scales, _ = te_reference.nvfp4(x.float().numpy())
    assert np.array_equal(t._rowwise_data.numpy(), codes)
    # Encode scale min(1 / (s * (1/S)), FLT_MAX), not S / s: a tie that falls the other way.
    y = torch.zeros(16, 32, dtype=torch.bfloat16)
    y[0, 0], y[0, 16], y[0, 17] = 6.375, 1.1875, 0.33203125
    codes = numerics.unpack_fp4(NVFP4Quantizer(columnwise_usage=False).quantize(y)._rowwise_data)
    assert codes[0, 17].item() == 3  # 1.5; S / s puts x * encode exactly on the 1.75 tie -> 2.0


def test_divergence_3_nvfp4_zero_scale_blocks_saturate_and_negative_zero_is_code_0() -> None:
    x = torch.zeros(16, 32)  # 16 rows: TE's create_tensor needs M % 16 == 0 for any usage
    x[0, 0] = 1e6  # the global amax
    x[0, 16], x[0, 17], x[0, 18] = 1e-6, -1e-6, -0.0  # a block whose E4M3 scale rounds to 0
    t = NVFP4Quantizer(columnwise_usage=False).quantize(x)
    assert t._rowwise_scale_inv.float()[0, 1].item() == 0.0
    codes = numerics.unpack_fp4(t._rowwise_data)[0]
    assert codes[16].item() == 7 and codes[17].item() == 15  # encoded with FLT_MAX: +-6
    assert codes[18].item() == 0 and codes[19].item() == 0  # -0.0 and 0.0 are both code 0
    assert numerics.e2m1_encode(torch.tensor([-0.0, -0.1, math.nan])).tolist() == [0, 8, 7]  # NaN: see the NaN test


@pytest.mark.parametrize("bad", [0.0, math.inf, math.nan])
def test_divergence_4_delayed_scaling_keeps_the_previous_scale(bad: float) -> None:
    q = Float8Quantizer(amax_history_len=1, scale=torch.tensor(3.0))
    q.amax_history[0] = bad
    q.update_scale()
    assert q.scale.item() == 3.0
    history, scale = te_reference.delayed_update(np.array([bad], np.float32), np.float32(3.0), fp8_max=448.0, margin=0, algo="max")
    assert scale == 3.0


def test_delayed_scaling_history_rolls_toward_the_front_as_te() -> None:
    q = Float8Quantizer(amax_history_len=4)
    q.amax_history.copy_(torch.tensor([7.0, 1.0, 2.0, 3.0]))
    q.update_scale()
    expected_history, expected_scale = te_reference.delayed_update(
        np.array([7.0, 1.0, 2.0, 3.0], np.float32), np.float32(1.0), fp8_max=448.0, margin=0, algo="max")
    assert q.amax_history.tolist() == expected_history.tolist() == [0.0, 2.0, 3.0, 7.0]
    assert q.scale.item() == expected_scale == np.float32(448.0) / np.float32(7.0)
    q2 = Float8Quantizer(amax_history_len=3, margin=1, amax_compute_algo="most_recent")
    q2.amax_history.copy_(torch.tensor([5.0, 9.0, 0.0]))
    q2.update_scale()
    assert q2.scale.item() == np.float32(224.0) / np.float32(5.0)


def test_divergence_5_blockwise_scale_overflow_uses_the_input_dtype_max() -> None:
    x = torch.full((1, 128), 1e-38, dtype=torch.bfloat16)  # 448 / amax overflows fp32
    def inverse_of(value: float) -> float:
        return torch.reciprocal(torch.tensor(value, dtype=torch.float32)).item()

    t = Float8BlockQuantizer(force_pow_2_scales=False).quantize(x)
    assert t._rowwise_scale_inv[0, 0].item() == inverse_of(torch.finfo(torch.bfloat16).max)
    t32 = Float8BlockQuantizer(force_pow_2_scales=False).quantize(x.float())
    assert t32._rowwise_scale_inv[0, 0].item() == inverse_of(torch.finfo(torch.float32).max)


def test_divergence_6_rht_on_the_columnwise_operand_only_in_bf16_with_te_signs() -> None:
    assert NVFP4Quantizer().rht_sign_mask == numerics.sign_mask_from_signs(tuple(te_reference.WGRAD_SIGNS.astype(int)))
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    with_rht = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, columnwise_usage=True).quantize(x)
    plain = NVFP4Quantizer(columnwise_usage=True).quantize(x)
    assert torch.equal(with_rht._rowwise_data, plain._rowwise_data)  # row-wise untouched
    assert not torch.equal(with_rht._columnwise_data, plain._columnwise_data)
    rotated = te_reference.rht(x.float().numpy().T.copy(), "bfloat16")  # rounded to bf16
    assert with_rht._amax_columnwise.item() == np.abs(rotated).max()
    torch.testing.assert_close(with_rht.dequantize().float(), x.float(), rtol=0.5, atol=0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("usage", [{}, {"rowwise_usage": False}, {"columnwise_usage": False}],
                         ids=["both", "columnwise", "rowwise"])
def test_rht_refuses_non_bf16_input_by_default_as_tes_kernels(dtype: torch.dtype, usage: dict) -> None:
    """TE's C++ quantize path (csrc/quantizer.cpp, NVFP4Quantizer::quantize_impl) raises "RHT is
    only supported for bfloat16 input" for any usage once with_rht is set; so does this one,
    naming the quantizer, the dtype, the layouts and the flag that allows it."""
    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, **usage)
    layouts = " and ".join(n for n, used in (("row-wise", q.rowwise_usage), ("column-wise", q.columnwise_usage)) if used)
    with pytest.raises(TypeError, match=rf"NVFP4Quantizer\.quantize: with_rht=True takes torch\.bfloat16 input only.*"
                                        rf"got {dtype} to quantize {layouts} .*rht_any_input_dtype=True"):
        q.quantize(torch.randn(32, 64, dtype=dtype))


@pytest.mark.parametrize("options", [{}, {"with_2d_quantization": True}, {"row_scaled_nvfp4": True},
                                     {"nvfp4_use_4over6": True}, {"with_rht": True, "with_post_rht_amax": True}],
                         ids=["1x16", "16x16", "row-scaled", "4over6", "rht"])
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64)])
def test_nvfp4_quantizes_empty_input_as_te(options: dict, shape: tuple[int, ...]) -> None:
    """TE's NVFP4 quantize returns at once for an empty input ("Nothing to be done if input is
    empty", before the RHT's dtype check): the buffers are allocated with TE's shapes
    (get_scale_shape: (0, 4) row-wise, (128, 0) column-wise here) and an fp32 input passes."""
    q = NVFP4Quantizer(**options)
    t = q.quantize(torch.randn(shape))
    assert {k: (tuple(v.shape), v.dtype) for k, v in t.inner_buffers().items()} == q.describe_buffers(shape)
    assert tuple(t._rowwise_scale_inv.shape) == (0, 4) and tuple(t._columnwise_scale_inv.shape) == (128, 0)
    assert t.dequantize().shape == shape


def test_rht_any_input_dtype_is_tes_reference_rule_and_changes_no_bf16_byte() -> None:
    """With the flag, fp32 input runs as TE's reference quantizer runs it (the transform
    rounded to fp32; its bytes are the te_cases sweep's); bf16 bytes are the default's."""
    rht = {"with_rht": True, "with_post_rht_amax": True}
    x = te_cases.family("outliers", (64, 128), torch.float32, seed=2)
    allowed = NVFP4Quantizer(**rht, rht_any_input_dtype=True)
    case = te_cases.CASES_BY_NAME["NVFP4 1x16 + RHT, rht_any_input_dtype"]
    assert set(te_cases.compare(case, x).values()) == {1.0}
    a, b = allowed.quantize(x.bfloat16()), NVFP4Quantizer(**rht).quantize(x.bfloat16())
    for name, buf in a.inner_buffers().items():
        assert torch.equal(buf.view(torch.uint8), getattr(b, name).view(torch.uint8)), name


def test_rht_dtype_check_runs_before_any_kernel_and_on_copy_into_a_tensor() -> None:
    """The check sits in Quantizer.quantize, ahead of the kernel dispatch, so every path meets
    it: copy_ into an NVFP4 tensor re-quantizes the source in the destination's dtype."""
    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)
    into_bf16 = q.make_empty((32, 64), dtype=torch.bfloat16)
    into_bf16.copy_(torch.randn(32, 64))  # cast to bf16 first: allowed
    into_fp32 = q.make_empty((32, 64), dtype=torch.float32)
    with pytest.raises(TypeError, match=r"got torch\.float32 to quantize row-wise and column-wise"):
        into_fp32.copy_(torch.randn(32, 64))


def test_divergence_7_mxfp8_columnwise_keeps_the_mk_layout() -> None:
    t = MXFP8Quantizer().quantize(torch.randn(64, 96))
    assert tuple(t._columnwise_data.shape) == (64, 96) and tuple(compact(t, "columnwise").shape) == (2, 96)
    assert tuple(compact(t).shape) == (64, 3)
    # TE's allocation (get_scale_shape): row-wise padded to (128, 4) multiples, column-wise to (4, 128)
    assert tuple(t._rowwise_scale_inv.shape) == (128, 4) and tuple(t._columnwise_scale_inv.shape) == (4, 128)


def test_divergence_10_mxfp8_block_amax_ignores_nan() -> None:
    x = torch.randn(32, 64)  # TE's create_tensor needs M % 32 == 0 for any usage
    x[0, 3] = math.nan
    t = MXFP8Quantizer(columnwise_usage=False).quantize(x)
    assert t._rowwise_scale_inv[0, 0].item() != numerics.E8M0_NAN
    out = t.dequantize()
    assert math.isnan(out[0, 3]) and torch.isfinite(out[0, :3]).all() and torch.isfinite(out[0, 4:]).all()


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_mxfp8_reciprocal_product_gives_the_same_exponent_as_the_division(fp8_dtype: torch.dtype) -> None:
    """TE forms amax * fp32(1/fp8_max), not amax / fp8_max; at every binade edge (where a
    rounding difference could move the rounded-up exponent) the two agree, so the kernel's
    shortcut changes no scale."""
    limit = numerics.fp8_max(fp8_dtype)
    edges = np.array([np.float32(limit * 2.0**k) for k in range(-40, 40)], dtype=np.float32)
    near = np.concatenate([edges, *(np.nextafter(edges, np.float32(d)) for d in (-np.inf, np.inf))])
    amax = torch.from_numpy(near)
    by_rcp = numerics.float_to_e8m0(amax * torch.tensor(1.0 / limit))
    assert torch.equal(by_rcp, numerics.float_to_e8m0(amax / limit))
    assert by_rcp.tolist() == [te_reference.float_to_e8m0(np.float32(a) * np.float32(1.0 / limit)) for a in near]


# -------------------------------------------------------------- additions
def test_nvfp4_2d_weight_blocks_share_one_scale_per_16x16_tile() -> None:
    t = NVFP4Quantizer(with_2d_quantization=True).quantize(torch.randn(64, 64) * 5)
    s = compact(t).float()
    assert torch.equal(s, s[::16].repeat_interleave(16, 0))
    assert torch.equal(compact(t, "columnwise").float(), s[::16].t().repeat_interleave(16, 0))  # the same tiles, transposed


def test_mxfp8_2d_blocks_share_one_scale_per_32x32_tile_in_both_layouts() -> None:
    t = MXFP8Quantizer(with_2d_quantization=True).quantize(torch.randn(64, 96) * 5)
    row, col = compact(t), compact(t, "columnwise")
    assert torch.equal(row, row[::32].repeat_interleave(32, 0))
    assert torch.equal(col, row[::32].repeat_interleave(32, 1))
    assert torch.equal(t._rowwise_data.view(torch.uint8), t._columnwise_data.view(torch.uint8))


def test_stochastic_rounding_is_seeded_and_unbiased() -> None:
    q = NVFP4Quantizer(stochastic_rounding=True)
    x = torch.full((64, 64), 1.2)  # between the E2M1 points 1.0 and 1.5 ...
    x[:, ::16] = 6.0  # ... once every block's scale is exactly 1 (block amax = global amax = 6)
    a = q.quantize(x, generator=torch.Generator().manual_seed(1))
    b = q.quantize(x, generator=torch.Generator().manual_seed(1))
    c = q.quantize(x, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a._rowwise_data, b._rowwise_data) and not torch.equal(a._rowwise_data, c._rowwise_data)
    inner = torch.ones(64, 64, dtype=torch.bool)
    inner[:, ::16] = False
    nearest = NVFP4Quantizer().quantize(x).dequantize()[inner].mean().item()
    stochastic = a.dequantize()[inner].mean().item()
    assert abs(stochastic - 1.2) < 0.01 < abs(nearest - 1.2)  # unbiased on average; RNE is not


def test_recipes_follow_te_defaults_per_tensor_role() -> None:
    from tetrt_support.quant import get_recipe

    x, w, g = get_recipe("nvfp4").quantizers()
    assert (x.with_rht, x.with_2d_quantization, x.stochastic_rounding) == (True, False, False)
    assert (w.with_rht, w.with_2d_quantization, w.stochastic_rounding) == (False, True, False)
    assert (g.with_rht, g.with_2d_quantization, g.stochastic_rounding) == (True, False, True)
    x, w, g = get_recipe("nvfp4", disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True).quantizers()
    assert not any((x.with_rht, w.with_2d_quantization, g.stochastic_rounding))
    x, w, g = get_recipe("fp8_block").quantizers()
    assert (x.block_scaling_dim, w.block_scaling_dim, g.block_scaling_dim) == (1, 2, 1) and w.force_pow_2_scales
    assert get_recipe("mxfp8", enable_2d_quantization=True).weight().with_2d_quantization
    assert not get_recipe("mxfp8").weight().with_2d_quantization
    with pytest.raises(TypeError):
        get_recipe("mxfp8", disable_rht=True)


def test_amax_reduction_where_te_reduces_is_a_per_call_option() -> None:
    from tetrt_support.quant.distributed import single_process_group

    x = torch.randn(32, 64)
    with single_process_group() as group:
        for q in (Float8CurrentScalingQuantizer(), NVFP4Quantizer(columnwise_usage=True)):
            reduced, alone = q.quantize(x, amax_reduction_group=group), q.quantize(x)
            assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                       for a, b in zip(reduced.inner_buffers().values(), alone.inner_buffers().values()))
        with pytest.raises(TypeError, match="amax_reduction_group"):  # TE does not reduce MXFP8 amaxes
            MXFP8Quantizer().quantize(x, amax_reduction_group=group)


# --------------------------------------------------------- property-based sweep
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402


def _values(*, nan: bool) -> st.SearchStrategy:
    """Any fp32 value (subnormals, huge, +-0, +-inf; NaN where TE defines the result)."""
    return st.floats(width=32, allow_nan=nan, allow_infinity=True, allow_subnormal=True)


def _tensor(shape: tuple[int, int], *, nan: bool, dtype: str):
    return hnp.arrays(np.float32, shape, elements=_values(nan=nan)).map(
        lambda a: torch.from_numpy(a.copy()).to(te_cases.DTYPES[dtype]))


SWEEP = {  # case name -> (shape, NaN allowed)
    "FP8 current E4M3": ((8, 16), True), "FP8 current E5M2 ": ((8, 16), True),
    "FP8 block 1x128": ((3, 130), True), "FP8 block 128x128": ((130, 3), True),
    "MXFP8 1x32 / 32x1": ((32, 64), True), "MXFP8 32x32": ((32, 64), True),
    "MXFP8 1x32 / 32x1, GEMM-swizzled": ((32, 64), True),
    "NVFP4 1x16": ((16, 32), True), "NVFP4 16x16": ((16, 32), True),
    "NVFP4 1x16 + RHT, rht_any_input_dtype": ((16, 32), True),
    "NVFP4 1x16, GEMM-swizzled": ((16, 32), True), "NVFP4 1x16 row-scaled, row-wise": ((16, 32), True),
    "NVFP4 1x16 4over6 (MAE, 256)": ((16, 32), True), "NVFP4 16x16 4over6 (MSE, 448)": ((16, 32), True),
    "NVFP4 1x16 4over6 fast (MSE, 256)": ((16, 32), True), "NVFP4 16x16 4over6 fast (MAE, 448)": ((16, 32), True),
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", [n.strip() for n in SWEEP])
@given(data=st.data())
def test_any_values_are_bit_exact_with_te(name: str, dtype: str, data: st.DataObject) -> None:
    shape, nan = next(v for k, v in SWEEP.items() if k.strip() == name)
    x = data.draw(_tensor(shape, nan=nan, dtype=dtype), label="x")
    fractions = te_cases.compare(te_cases.CASES_BY_NAME[name], x)
    assert fractions == {k: 1.0 for k in fractions}, fractions



@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dequantize_is_tes_formula_bit_for_bit(dtype: str) -> None:
    """TE's dequantize kernels: data * scale_inv (FP8), data * 2**e (MXFP8), and
    e2m1 * ((scale * amax) * (1/2688)) (NVFP4), rounded to the output dtype."""
    x = te_cases.family("outliers", (64, 128), te_cases.DTYPES[dtype], seed=5)
    t = NVFP4Quantizer().quantize(x)
    want = te_reference.nvfp4_dequantize(t._rowwise_data.numpy(), compact(t).float().numpy(), t._amax_rowwise.item())
    assert np.array_equal(t.dequantize(torch.float32).numpy(), want)
    assert torch.equal(t.dequantize(), torch.from_numpy(want).to(x.dtype))
    m = MXFP8Quantizer(columnwise_usage=True).quantize(x)
    for layout, tile in (("rowwise", (1, 32)), ("columnwise", (32, 1))):
        data, scale = getattr(m, f"_{layout}_data"), compact(m, layout)
        want = te_reference.mxfp8_dequantize(data.float().numpy(), scale.numpy(), tile)
        assert np.array_equal(m.dequantize(torch.float32, layout=layout).numpy(), want)
    f = Float8CurrentScalingQuantizer().quantize(x)
    assert torch.equal(f.dequantize(torch.float32), f._data.float() * f._scale_inv)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_nvfp4_2d_tiles_of_a_partial_row_block_pad_as_tes_reference_and_the_quantizer_refuses_them(dtype: str) -> None:
    """TE differs between its paths for M % 16 != 0: its pure-PyTorch reference quantizer
    (``custom_recipes/reference_nvfp4.py``, ``_pad_tensor``) zero-pads the rows of a
    16x16-tiled tensor, while ``NVFP4Quantizer::create_tensor`` -- the C++ path of TE's
    ``NVFP4Quantizer``, which this package's quantizer stands for -- refuses the shape for
    any usage. So the quantizer refuses it, and the numerics underneath keep the
    reference's padding (bit-exact with the oracle) for a caller of the 2-D function."""
    x = te_cases.family("outliers", (40, 64), te_cases.DTYPES[dtype], seed=11)
    with pytest.raises(ValueError, match="product of the leading dims must be a multiple of 16"):
        NVFP4Quantizer(with_2d_quantization=True, columnwise_usage=False).quantize(x)
    codes, scales, amax = te_reference.nvfp4(x.float().numpy(), tile_rows=16)
    data, scale = numerics.nvfp4_quantize(x, numerics.amax(x).reshape(1), 16)
    assert np.array_equal(data.numpy(), codes)
    assert np.array_equal(scale.view(torch.uint8).numpy(), scales.view(np.uint8))
    assert numerics.amax(x).item() == amax[0]


# ------------------------------------------------------- NVFP4 with NaN, 4over6, row-scaled
def test_nvfp4_negative_zero_is_code_0_as_tes_reference_small_negatives_code_8() -> None:
    """What each side writes for a scaled element of zero magnitude:

    - TE's reference (``reference_nvfp4.py`` ``cast_to_fp4x2``): code 0 for -0.0 (it lands in
      the ``x >= 0.0`` bin), code 8 ("-0") for a negative that rounds to zero, in [-0.25, 0);
    - TE's kernels (``cvt.rn.satfinite.e2m1x2.f32``): the sign bit is kept for every result,
      so -0.0 is code 8 too, as CUDA's ``cuda_fp4.hpp`` restates that conversion in software
      (``__nv_cvt_double_to_fp4``: ``res |= sign`` after the zero/underflow case; not run on
      hardware here; TE's C++ test compares decoded values, where -0 equals +0);
    - this package: the reference's codes. TE's own exact test compares kernel and reference
      codes with atol=0, so the two are not equal there (its inputs never hold a -0.0); both
      codes decode to zero, so every dequantized value agrees."""
    x = torch.full((16, 16), 100.0)  # encode scale 6 / 100; 16 rows, as TE's create_tensor needs
    x[0, 1], x[0, 2], x[0, 3] = -0.0, -1e-3, 0.0  # -1e-3 * 0.06 rounds to zero: "-0"
    x[0, 4] = -1e-45  # times 0.06 underflows to -0.0 in fp32: code 0 (the kernel: 8)
    codes = numerics.unpack_fp4(NVFP4Quantizer(columnwise_usage=False).quantize(x)._rowwise_data)[0]
    assert codes[1:5].tolist() == [0, 8, 0, 0]
    ref_codes, _, _ = te_reference.nvfp4(x.numpy())
    assert numerics.unpack_fp4(torch.from_numpy(ref_codes))[0, 1:5].tolist() == [0, 8, 0, 0]
    assert (numerics.e2m1_decode(codes[1:5]) == 0).all()


def test_fp16_product_of_the_4over6_fast_math_error_is_exact_in_fp32() -> None:
    """Why the fast-math error may use the fp32 product: for every E2M1 value and every finite
    E4M3 scale, fp16(q * s) (TE's mul.rn.f16x2) equals the fp32 product."""
    e2m1 = numerics.e2m1_decode(torch.arange(16, dtype=torch.uint8))
    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    e4m3 = e4m3[~torch.isnan(e4m3)]
    products = e2m1[:, None] * e4m3[None, :]
    assert torch.equal(products.half().float(), products)


def test_4over6_fast_math_is_tes_opt_in_and_changes_the_choice_on_some_blocks() -> None:
    """TE's default is the exact error (NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH unset); the fast-math
    variant follows quantize_4over6_nvfp4.cuh's accumulate_fp16_scaled_error_pair and TE's
    reference (``_ref_nvfp4_4over6_fp16_candidate``), and picks differently on some blocks."""
    assert NVFP4Quantizer(nvfp4_use_4over6=True).nvfp4_4over6_err_use_fast_math is False
    assert NVFP4Quantizer(nvfp4_4over6_err_use_fast_math=True).nvfp4_4over6_err_use_fast_math is False  # no 4over6
    x = te_cases.family("near dtype max", (64, 128), torch.bfloat16, seed=4)
    exact = NVFP4Quantizer(nvfp4_use_4over6=True, columnwise_usage=False)
    fast = NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_4over6_err_use_fast_math=True, columnwise_usage=False)
    a, b = exact.quantize(x), fast.quantize(x)
    assert not torch.equal(compact(a).view(torch.uint8), compact(b).view(torch.uint8))
    ref_codes, ref_scales, _ = te_reference.nvfp4(x.float().numpy(), four_over_six="MAE", fast_math=True)
    assert np.array_equal(b._rowwise_data.numpy(), ref_codes)
    assert np.array_equal(compact(b).view(torch.uint8).numpy(), ref_scales.view(np.uint8))
    from tetrt_support.quant import get_recipe

    recipe = get_recipe("nvfp4", disable_rht=True, nvfp4_4over6="all", nvfp4_4over6_err_use_fast_math=True)
    assert all(q.nvfp4_4over6_err_use_fast_math for q in (recipe.input(), recipe.weight()))
    assert not recipe.grad().nvfp4_4over6_err_use_fast_math  # the gradient never uses 4over6


def test_nvfp4_nan_input_follows_tes_kernel_not_its_reference() -> None:
    """TE's kernels skip NaN in every amax (``fmaxf`` / ``__hmax`` in
    ``cast/nvfp4/quantize_transpose_nvfp4.cuh``, ``recipe/current_scaling.cu``) and convert
    with ``cvt.satfinite`` to E2M1, which writes a NaN as positive MAX_NORM (+6, code 7; the
    comment on ``stochastic_round_fp4_e2m1`` in ``common/util/ptx.cuh``). TE's pure-PyTorch
    reference (``reference_nvfp4.py``) differs: ``torch.amax`` propagates the NaN into the
    global amax (so every scale is NaN) and ``cast_to_fp4x2``'s bins leave a NaN at code 0.
    Where they disagree this package follows the kernel."""
    x = torch.randn(16, 32) * 3
    x[2, 5] = math.nan
    clean = x.clone()
    clean[2, 5] = 0.0
    t, c = NVFP4Quantizer(columnwise_usage=False).quantize(x), NVFP4Quantizer(columnwise_usage=False).quantize(clean)
    assert t._amax_rowwise.item() == c._amax_rowwise.item()  # the NaN raised no amax
    assert torch.equal(compact(t).view(torch.uint8), compact(c).view(torch.uint8))  # nor any block scale
    codes, clean_codes = numerics.unpack_fp4(t._rowwise_data), numerics.unpack_fp4(c._rowwise_data)
    assert codes[2, 5].item() == 7  # +6
    codes[2, 5] = clean_codes[2, 5]
    assert torch.equal(codes, clean_codes)  # every other element untouched
    ref_codes, _, _ = te_reference.nvfp4(x.numpy())
    assert np.array_equal(t._rowwise_data.numpy(), ref_codes)


def _four_over_six_by_hand(block: np.ndarray, amax: float, e4m3_max: float, mode: str) -> tuple[int, float]:
    """One 1x16 block, TE's 4over6 rule in float64 with explicit fp32 roundings: (winner scale code, its error)."""
    import ml_dtypes

    f32 = np.float32
    s_enc = min(f32(e4m3_max * 6) / f32(amax), np.finfo(np.float32).max)
    base = f32(f32(np.abs(block).max()) / f32(6)) * f32(s_enc)
    best = None
    for factor in (1.5, 1.0):
        decode = np.array(np.clip(f32(base * f32(factor)), -448, 448), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
        s = float(decode.astype(np.float32))
        enc = f32(1) / (f32(s) * (f32(1) / f32(s_enc)))
        grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
        q = [np.sign(v) * grid[np.argmin(np.abs(grid - min(abs(f32(v) * enc), 6)))] for v in block]
        err = sum((abs(f32(f32(f32(qi * s) * f32(amax)) / f32(6 * e4m3_max)) - f32(v))) ** (2 if mode == "MSE" else 1)
                  for qi, v in zip(q, block))
        if best is None or err < best[1]:  # map-to-4 first; map-to-6 wins ties
            best = (int(decode.view(np.uint8)), err)
    return best


@pytest.mark.parametrize("mode", ["MAE", "MSE"])
@pytest.mark.parametrize("e4m3_max", [448, 256])
def test_nvfp4_4over6_picks_the_smaller_error_candidate_per_block(mode: str, e4m3_max: int) -> None:
    """TE's 4over6 (``nvfp4_use_4over6``): per block, map-to-4 (decode scale x1.5) or
    map-to-6, whichever reconstructs the block with the smaller MAE/MSE."""
    x = te_cases.family("outliers", (32, 64), torch.float32, seed=2)
    q = NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=e4m3_max, nvfp4_4over6_err_mode=mode, columnwise_usage=False)
    t = q.quantize(x)
    scales = compact(t).view(torch.uint8)
    amax = t._amax_rowwise.item()
    blocks = x.numpy().reshape(32, 4, 16)
    picked = [_four_over_six_by_hand(blocks[r, b], amax, e4m3_max, mode)[0] for r in range(0, 32, 7) for b in range(4)]
    assert picked == [scales[r, b].item() for r in range(0, 32, 7) for b in range(4)]
    plain = NVFP4Quantizer(columnwise_usage=False).quantize(x)
    if e4m3_max == 448:  # same global bound: picking the better candidate lowers the total error in its metric
        power = 2 if mode == "MSE" else 1
        err = lambda tt: (tt.dequantize() - x).abs().pow(power).sum()  # noqa: E731
        assert err(t) < err(plain)


def test_nvfp4_row_scaled_keeps_one_amax_per_row_and_per_column() -> None:
    """TE's ``row_scaled_nvfp4``: the row-wise amax is (M,), the column-wise one (K,) -- one
    per row of x^T (``quantizer.cpp`` allocates ``amax_columnwise`` with ``flat_last_dim``)."""
    # bf16 with both dims multiples of 32: TE's kernels take the column-wise layout from no other
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    x[3] *= 100.0  # a loud row does not coarsen the others
    t = NVFP4Quantizer(row_scaled_nvfp4=True).quantize(x)
    assert t._amax_rowwise.shape == (32,) and t._amax_columnwise.shape == (64,)
    assert torch.equal(t._amax_rowwise, x.abs().amax(1).float())
    assert torch.equal(t._amax_columnwise, x.abs().amax(0).float())
    per_tensor = NVFP4Quantizer().quantize(x)
    quiet = torch.arange(32) != 3
    row_err = (t.dequantize(torch.float32, layout="rowwise") - x.float())[quiet].abs().mean()
    assert row_err < (per_tensor.dequantize(torch.float32, layout="rowwise") - x.float())[quiet].abs().mean()


@pytest.mark.parametrize("family", te_cases.FAMILIES)
def test_row_scaled_nvfp4_both_usages_are_bit_exact_with_te_on_bf16_multiples_of_32(family: str) -> None:
    """The column-wise layout of row-scaled NVFP4 (one amax per column of x), on the input
    TE's kernels take it from: bf16, both dims multiples of 32."""
    case = te_cases.Case("row-scaled both", lambda: NVFP4Quantizer(row_scaled_nvfp4=True),
                         te_cases._nvfp4(False, False, row_scaled=True))
    x = te_cases.family(family, (64, 96), torch.bfloat16, seed=4)
    fractions = te_cases.compare(case, x)
    assert set(fractions) >= {"_columnwise_data", "_amax_columnwise"}
    assert fractions == {k: 1.0 for k in fractions}, fractions


@pytest.mark.parametrize(
    "options, match",
    [
        ({"with_rht": True}, "needs with_post_rht_amax=True"),
        ({"nvfp4_use_4over6": True, "stochastic_rounding": True}, "4over6 does not support stochastic_rounding"),
        ({"nvfp4_use_4over6": True, "with_rht": True, "with_post_rht_amax": True}, "4over6 does not support with_rht"),
        ({"row_scaled_nvfp4": True, "with_2d_quantization": True}, "row-scaled NVFP4 does not support with_2d_quantization"),
        ({"row_scaled_nvfp4": True, "rowwise_usage": False}, "row-scaled NVFP4 requires rowwise usage"),
        ({"nvfp4_use_4over6": True, "nvfp4_e4m3_max": 300}, "nvfp4_e4m3_max must be 448 or 256"),
        ({"nvfp4_use_4over6": True, "nvfp4_4over6_err_mode": "max"}, "must be 'MAE' or 'MSE'"),
    ],
)
def test_nvfp4_refuses_the_combinations_te_refuses(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NVFP4Quantizer(**options)


def test_nvfp4_e4m3_max_is_448_without_4over6_as_te() -> None:
    assert NVFP4Quantizer(nvfp4_e4m3_max=256).nvfp4_e4m3_max == 448  # TE ignores the bound without 4over6


# ---------------------------------------------------------------- scale layouts
@pytest.mark.parametrize("rows, cols", [(32, 64), (160, 288), (256, 128)])
def test_mxfp8_scale_buffers_are_tes_allocation_padded_with_zeros(rows: int, cols: int) -> None:
    t = MXFP8Quantizer().quantize(torch.randn(rows, cols))
    r_pad, c_pad = -(-rows // 128) * 128, -(-(cols // 32) // 4) * 4
    assert tuple(t._rowwise_scale_inv.shape) == (r_pad, c_pad)  # get_scale_shape(columnwise=False)
    assert tuple(t._columnwise_scale_inv.shape) == (-(-(rows // 32) // 4) * 4, -(-cols // 128) * 128)
    assert not t._rowwise_scale_inv[rows:].any() and not t._rowwise_scale_inv[:, cols // 32:].any()
    assert not t._columnwise_scale_inv[rows // 32:].any() and not t._columnwise_scale_inv[:, cols:].any()
    assert tuple(t._rowwise_scale_inv.shape) == MXFP8Quantizer().describe_buffers((rows, cols))["_rowwise_scale_inv"][0]


@pytest.mark.parametrize("cls", [MXFP8Quantizer, NVFP4Quantizer])
def test_gemm_swizzled_scales_put_entry_i_j_where_tes_index_says(cls) -> None:
    """``optimize_for_gemm``: scale (i, j) at ``gemm_swizzled_scale_idx(i, j)`` of the padded buffer."""
    x = torch.randn(160, 288)
    plain, swz = cls().quantize(x), cls(optimize_for_gemm=True).quantize(x)
    flat = swz._rowwise_scale_inv.contiguous().view(torch.uint8).reshape(-1)
    padded = plain._rowwise_scale_inv.view(torch.uint8)
    i, j = np.indices(tuple(padded.shape))
    where = te_reference.swizzled_index(i, j, padded.shape[1] // 4).reshape(-1)
    assert np.array_equal(flat.numpy()[where], padded.numpy().reshape(-1))
    assert torch.equal(swz.dequantize(), plain.dequantize())  # same values, another layout


@pytest.mark.parametrize("dim, rows, cols", [(1, 130, 200), (2, 130, 200), (1, 3, 128), (2, 300, 520)])
def test_blockwise_scales_are_tes_gemm_ready_layout(dim: int, rows: int, cols: int) -> None:
    """1x128: (K/128, roundup(M, 4)), the compact scales transposed; 128x128: (M/128, roundup(K/128, 4))."""
    t = Float8BlockQuantizer(block_scaling_dim=dim).quantize(torch.randn(rows, cols))
    ceil = lambda a, b: -(-a // b)  # noqa: E731
    up4 = lambda a: ceil(a, 4) * 4  # noqa: E731
    want_row = (ceil(cols, 128), up4(rows)) if dim == 1 else (ceil(rows, 128), up4(ceil(cols, 128)))
    want_col = (ceil(rows, 128), up4(cols)) if dim == 1 else (ceil(cols, 128), up4(ceil(rows, 128)))
    assert tuple(t._rowwise_scale_inv.shape) == want_row and tuple(t._columnwise_scale_inv.shape) == want_col
    valid = compact(t)
    stored = t._rowwise_scale_inv.t() if dim == 1 else t._rowwise_scale_inv
    assert torch.equal(stored[: valid.shape[0], : valid.shape[1]], valid)
    assert not stored[valid.shape[0]:].any() and not stored[:, valid.shape[1]:].any()


def test_nvfp4_recipe_takes_the_error_mode_exactly_as_tes_recipe_asserts() -> None:
    """TE's ``NVFP4BlockScaling.__post_init__`` asserts ``nvfp4_4over6_err_mode`` in ('MAE', 'MSE')
    as given (only its environment default is upper-cased), while ``NVFP4Quantizer`` upper-cases
    it: the recipe refuses "mse", the quantizer takes it, and "weights" is one of TE's scopes."""
    from tetrt_support.quant.recipes import get_recipe

    with pytest.raises(ValueError, match=r"nvfp4_4over6_err_mode must be 'MAE' or 'MSE', got 'mse'.*asserts"):
        get_recipe("nvfp4", nvfp4_4over6="weights", nvfp4_4over6_err_mode="mse")
    weight_quantizer = get_recipe("nvfp4", nvfp4_4over6="weights", nvfp4_4over6_err_mode="MSE").quantizers()[1]
    assert weight_quantizer.nvfp4_use_4over6 and weight_quantizer.nvfp4_4over6_err_mode == "MSE"
    assert NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_4over6_err_mode="mse").nvfp4_4over6_err_mode == "MSE"
    with pytest.raises(ValueError, match="nvfp4_4over6 must be one of"):
        get_recipe("nvfp4", nvfp4_4over6="gradients")
