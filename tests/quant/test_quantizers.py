"""Each quantizer against an independent numpy/ml_dtypes reference, plus shapes and special values."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tetrt_support.quant import numerics
from tetrt_support.quant import (
    ALL_QUANTIZERS,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
)

E4M3 = ml_dtypes.float8_e4m3fn


def _fp8(values: np.ndarray, limit: float = 448.0) -> np.ndarray:
    return np.clip(values, -limit, limit).astype(np.float32).astype(E4M3).astype(np.float32)


def _blocks(a: np.ndarray, br: int, bc: int):
    for i in range(0, a.shape[0], br):
        for j in range(0, a.shape[1], bc):
            yield (slice(i, i + br), slice(j, j + bc))


def ref_current(x: np.ndarray) -> np.ndarray:
    scale = np.float32(448.0) / np.float32(np.abs(x).max())
    return _fp8(x * scale) * (np.float32(1.0) / scale)


def ref_block(x: np.ndarray, br: int, bc: int) -> np.ndarray:
    out = np.empty_like(x)
    for index in _blocks(x, br, bc):
        scale = 2.0 ** math.floor(math.log2(448.0 / np.abs(x[index]).max()))  # power of two, rounded down
        out[index] = _fp8(x[index] * scale) / scale
    return out


def ref_mxfp8(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for index in _blocks(x, 1, 32):
        scale = 2.0 ** math.ceil(math.log2(float(np.abs(x[index]).max()) / 448.0))  # power of two, rounded UP
        out[index] = _fp8(x[index] / scale) * scale
    return out


def ref_nvfp4(x: np.ndarray) -> np.ndarray:
    f32 = np.float32
    s_enc = f32(448.0 * 6.0) / f32(np.abs(x).max())
    out = np.empty_like(x)
    for index in _blocks(x, 1, 16):
        stored = _fp8(f32(np.abs(x[index]).max()) / f32(6.0) * s_enc)
        encoded = (x[index] * (s_enc / stored)).astype(np.float32)
        fp4 = np.clip(encoded, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
        out[index] = fp4 * (stored / s_enc)
    return out


@pytest.fixture
def activations() -> torch.Tensor:
    # Gaussian rows with a few outliers, K a multiple of every block size.
    x = torch.randn(64, 256)
    x[3, 7] = 40.0
    x[10, 100] = -25.0
    return x


@pytest.mark.parametrize(
    "quantizer, reference, rel_rms_bound",
    [
        (Float8CurrentScalingQuantizer(), ref_current, 0.04),
        (Float8BlockQuantizer(block_scaling_dim=1), lambda a: ref_block(a, 1, 128), 0.04),
        (Float8BlockQuantizer(block_scaling_dim=2), lambda a: ref_block(a, 128, 128), 0.04),
        (MXFP8Quantizer(), ref_mxfp8, 0.04),
        (NVFP4Quantizer(), ref_nvfp4, 0.15),
    ],
    ids=["fp8-current", "fp8-block-1x128", "fp8-block-128x128", "mxfp8", "nvfp4"],
)
def test_matches_independent_reference(quantizer, reference, rel_rms_bound: float, activations: torch.Tensor) -> None:
    ours = quantizer.quantize(activations).dequantize().numpy()
    expected = reference(activations.numpy())
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)
    x = activations.numpy()
    assert np.sqrt(np.mean((ours - x) ** 2)) / np.sqrt(np.mean(x**2)) < rel_rms_bound


def test_mxfp8_scales_are_exact_powers_of_two_rounded_up(activations: torch.Tensor) -> None:
    t = MXFP8Quantizer().quantize(activations)
    # TE's buffer: 64 rows padded to 128 (zeros); the 64 x 8 valid region holds the exponents
    assert t._rowwise_scale_inv.dtype == torch.uint8 and t._rowwise_scale_inv.shape == (128, 8)
    assert not t._rowwise_scale_inv[64:].any()
    block_amax = activations.abs().reshape(64, 8, 32).amax(-1).double()
    expected = torch.ceil(torch.log2(block_amax / 448.0)).to(torch.int64) + 127
    assert torch.equal(t._quantizer.compact_scale_inv(t, "rowwise").long(), expected)
    assert t._rowwise_data.float().abs().max().item() <= 448.0


def test_nvfp4_layout_and_global_scale(activations: torch.Tensor) -> None:
    t = NVFP4Quantizer(columnwise_usage=True).quantize(activations)
    assert t._rowwise_data.shape == (64, 128) and t._rowwise_data.dtype == torch.uint8
    assert t._rowwise_scale_inv.shape == (128, 16) and t._rowwise_scale_inv.dtype == torch.float8_e4m3fn  # rows padded to 128
    assert t._columnwise_data.shape == (256, 32) and t._columnwise_scale_inv.shape == (256, 4)
    assert t._amax_rowwise.item() == activations.abs().max().item() == t._amax_columnwise.item()
    assert t._rowwise_scale_inv.float().max().item() == 448.0  # the largest block maps onto E4M3's max


def test_nvfp4_hadamard_round_trips_and_spreads_outliers() -> None:
    x = (torch.randn(32, 64) * 0.1).bfloat16()  # bf16: the transform's only input dtype in TE's kernels
    x[:, 5] = 30.0  # one outlier column: without RHT its blocks' other 15 values flush to 0
    plain = NVFP4Quantizer().quantize(x).dequantize().float()
    rht = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True).quantize(x).dequantize().float()
    err_plain = (plain - x.float()).norm() / x.float().norm()
    err_rht = (rht - x.float()).norm() / x.float().norm()
    assert err_rht < 0.2 and err_plain < 0.2
    torch.testing.assert_close(NVFP4Quantizer(with_rht=True, with_post_rht_amax=True).quantize(x * 0).dequantize(), x * 0)


@pytest.mark.parametrize("cls", ALL_QUANTIZERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("rowwise, columnwise", [(True, False), (False, True), (True, True)])
def test_describe_buffers_and_make_empty_match_quantize(cls, rowwise: bool, columnwise: bool) -> None:
    q = cls(rowwise_usage=rowwise, columnwise_usage=columnwise)
    x = torch.randn(2, 32, 64, dtype=torch.bfloat16)
    t = q.quantize(x)
    spec = q.describe_buffers(x.shape)
    assert {n: (tuple(b.shape), b.dtype) for n, b in t.inner_buffers().items()} == spec
    assert list(spec) == [n for n in t._FLATTEN_TENSOR_BUFFERS if n in spec]  # flatten order
    empty = q.make_empty(x.shape, dtype=torch.bfloat16)
    assert type(empty) is type(t) and empty.shape == x.shape and empty.dtype == torch.bfloat16
    assert {n: (tuple(b.shape), b.dtype) for n, b in empty.inner_buffers().items()} == spec
    assert t.shape == x.shape and t.dtype == torch.bfloat16 and t.dequantize().dtype == torch.bfloat16
    assert t.__tensor_flatten__()[0] == list(spec)


@pytest.mark.parametrize("cls", ALL_QUANTIZERS, ids=lambda c: c.__name__)
def test_columnwise_dequantizes_to_the_same_logical_tensor(cls) -> None:
    x = torch.randn(32, 64)
    row = cls().quantize(x).dequantize()
    col = cls(rowwise_usage=False, columnwise_usage=True).quantize(x).dequantize()
    assert col.shape == x.shape
    if cls in (Float8Quantizer, Float8CurrentScalingQuantizer):
        assert torch.equal(row, col)  # per-tensor scale: the transpose holds the same bytes
    else:  # blocks along M instead of K: a different, equally accurate quantization
        assert ((col - x).norm() / x.norm()).item() < 0.15


@pytest.mark.parametrize("cls", ALL_QUANTIZERS, ids=lambda c: c.__name__)
def test_zeros_quantize_to_exact_zeros(cls) -> None:
    x = torch.zeros(32, 64)
    assert torch.equal(cls(columnwise_usage=True).quantize(x).dequantize(), x)


@pytest.mark.parametrize("cls", ALL_QUANTIZERS, ids=lambda c: c.__name__)
def test_inf_saturates_and_nan_stays_in_its_element(cls) -> None:
    """As TE's kernels: amaxes ignore NaN (fmaxf), so a NaN never changes a scale."""
    x = torch.randn(32, 64)
    x[0, 0] = math.inf
    x[1, 1] = -math.inf
    x[2, 2] = math.nan
    t = cls().quantize(x)
    out = t.dequantize()
    if cls is NVFP4Quantizer:
        # Encoded with S = 1 (S = 2688 / inf = 0 -> 1): the inf saturates to code 7, the NaN
        # too (E2M1 has no NaN; TE's kernels write +6) ...
        codes = numerics.unpack_fp4(t._rowwise_data)
        assert codes[0, 0].item() == 7 and codes[1, 1].item() == 15 and codes[2, 2].item() == 7
        # ... and TE's dequantize kernel multiplies by the stored amax, inf: nothing finite remains.
        assert out[0, 0].item() == math.inf and out[1, 1].item() == -math.inf
        assert not torch.isfinite(out).any()
        return
    if cls is MXFP8Quantizer:  # the E8M0 scale saturates at 2**127 and 448 * 2**127 overflows fp32
        assert out[0, 0].item() == math.inf and out[1, 1].item() == -math.inf
        assert (out[0, 1:32] == 0).all()  # the rest of an inf block flushes to zero
    else:  # saturates to the largest finite value the format can express
        assert torch.isfinite(out[0, 0]) and out[0, 0] > 0 and torch.isfinite(out[1, 1]) and out[1, 1] < 0
    assert torch.isnan(out[2, 2])
    assert torch.isfinite(out[2, 3:]).all() and torch.isfinite(out[2, :2]).all()
    rows_without_specials = out[3:]
    assert torch.isfinite(rows_without_specials).all()


def test_current_scaling_saturation_and_pow2() -> None:
    x = torch.tensor([[1000.0, -3.0, 0.5, 0.0]])
    q = Float8CurrentScalingQuantizer(force_pow_2_scales=True)
    t = q.quantize(x)
    scale = 1.0 / t._scale_inv.item()
    assert scale == 2.0 ** math.floor(math.log2(448.0 / 1000.0))
    assert t.dequantize()[0, 0].item() == pytest.approx(1000.0, rel=0.07)
    # Delayed scaling with a stale scale saturates instead of overflowing.
    stale = Float8Quantizer(scale=torch.tensor(1.0))
    assert stale.quantize(x).dequantize()[0, 0].item() == 448.0


def test_delayed_scaling_records_amax_and_updates_scale() -> None:
    q = Float8Quantizer(amax_history_len=4)
    q.quantize(torch.full((2, 16), 3.0))
    q.quantize(torch.full((2, 16), -5.0))
    assert q.amax_history.tolist() == [5.0, 0.0, 0.0, 0.0]
    q.update_scale()
    assert q.scale.item() == pytest.approx(448.0 / 5.0)
    assert q.amax_history.tolist() == [0.0, 0.0, 0.0, 5.0]  # TE rolls toward the front: the newest goes last
    clone = q.copy()
    assert clone is not q and clone != q and clone.scale is not q.scale  # identity semantics, cloned state
    assert torch.equal(clone.scale, q.scale)


@pytest.mark.parametrize(
    "quantizer, shape, match",
    [
        (MXFP8Quantizer(), (32, 48), "the last dim must be a multiple of 32"),
        (MXFP8Quantizer(columnwise_usage=True), (4, 64), "the product of the leading dims must be a multiple of 32"),
        (NVFP4Quantizer(), (16, 8), "the last dim must be a multiple of 16"),
    ],
)
def test_block_multiple_errors_name_the_dimension(quantizer, shape, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        quantizer.quantize(torch.randn(shape))
    with pytest.raises(ValueError, match=match):
        quantizer.make_empty(shape)


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(TypeError, match="input dtype must be one of"):
        MXFP8Quantizer().quantize(torch.ones(4, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least one of rowwise_usage/columnwise_usage"):
        MXFP8Quantizer(rowwise_usage=False, columnwise_usage=False)
    with pytest.raises(ValueError, match="fp8_dtype must be one of"):
        Float8BlockQuantizer(torch.bfloat16)
    with pytest.raises(TypeError, match="unexpected keyword argument 'amax_reduction_group'"):
        MXFP8Quantizer().quantize(torch.ones(32, 32), amax_reduction_group=None)


def test_block_quantizer_accepts_partial_blocks() -> None:
    x = torch.randn(130, 200)
    t = Float8BlockQuantizer(block_scaling_dim=2, columnwise_usage=True).quantize(x)
    assert t._rowwise_scale_inv.shape == (2, 4) and t._columnwise_scale_inv.shape == (2, 4)  # TE pads the inner dim to 4
    assert t._quantizer.compact_scale_inv(t, "rowwise").shape == (2, 2)
    np.testing.assert_allclose(t.dequantize().numpy(), ref_block(x.numpy(), 128, 128), rtol=1e-6, atol=1e-7)


class TestQuantizedTensorDispatch:
    def test_detach_clone_to_stay_quantized(self) -> None:
        t = MXFP8Quantizer().quantize(torch.randn(32, 64))
        for derived in (t.detach(), t.clone(), t.to(torch.bfloat16)):
            assert type(derived) is type(t) and derived.shape == t.shape
        assert t.to(torch.bfloat16).dtype == torch.bfloat16
        assert t.detach()._rowwise_data.data_ptr() == t._rowwise_data.data_ptr()  # an alias shares storage
        assert t.clone()._rowwise_data.data_ptr() != t._rowwise_data.data_ptr()
        assert torch.equal(t.clone().dequantize(), t.dequantize())

    def test_other_ops_run_on_the_dequantized_value(self) -> None:
        t = NVFP4Quantizer().quantize(torch.randn(16, 64))
        out = t + 1
        assert type(out) is torch.Tensor and torch.equal(out, t.dequantize() + 1)
        assert torch.equal(t[1:3], t.dequantize()[1:3])
        assert torch.equal(t.reshape(8, 128), t.dequantize().reshape(8, 128))
        assert torch.equal(torch.nn.functional.linear(t, torch.eye(64)), t.dequantize() @ torch.eye(64))

    def test_inplace_on_quantized_raises_and_copy_requantizes(self) -> None:
        t = Float8CurrentScalingQuantizer().quantize(torch.randn(4, 16))
        with pytest.raises(NotImplementedError, match="in-place ops on a Float8Tensor are not supported"):
            t.add_(1)
        new = torch.randn(4, 16)
        t.copy_(new)
        assert torch.equal(t.dequantize(), Float8CurrentScalingQuantizer().quantize(new).dequantize())

    def test_flatten_unflatten_round_trip(self) -> None:
        x = torch.randn(16, 32, dtype=torch.bfloat16)
        t = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, columnwise_usage=True).quantize(x)
        names, ctx = t.__tensor_flatten__()
        rebuilt = type(t).__tensor_unflatten__({n: getattr(t, n) for n in names}, ctx, t.shape, t.stride())
        assert isinstance(rebuilt, QuantizedTensor) and torch.equal(rebuilt.dequantize(), t.dequantize())
        assert repr(t).startswith("NVFP4Tensor(shape=(16, 32), dtype=torch.bfloat16, quantizer=NVFP4Quantizer(")

    def test_quantizer_on_tensor_is_a_copy(self) -> None:
        q = Float8Quantizer()
        t = q.quantize(torch.randn(4, 16))
        assert isinstance(t, Float8Tensor) and t._quantizer is not q
        assert t._quantizer.scale is not q.scale


@given(
    st.lists(st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, width=32), min_size=32, max_size=32),
    st.sampled_from([MXFP8Quantizer, Float8CurrentScalingQuantizer]),
)
def test_fp8_error_is_at_most_half_an_e4m3_step(values: list[float], cls) -> None:
    """Every element lands on the nearest E4M3 grid point of its (block) scale: error <= half a step."""
    # 31 rows of zeros: TE's MXFP8 needs 32 rows whatever the usage; zeros move no scale
    x = torch.cat([torch.tensor([values]), torch.zeros(31, 32)])
    t = cls(columnwise_usage=False).quantize(x)
    scale_inv = numerics.e8m0_to_float(t._quantizer.compact_scale_inv(t, "rowwise")) if cls is MXFP8Quantizer else t._scale_inv
    scaled = (x / scale_inv).abs()  # magnitude on the E4M3 grid
    exponent = torch.floor(torch.log2(scaled.clamp_min(2.0**-6)))  # subnormals share the 2**-6 binade's step
    half_step = torch.ldexp(torch.ones_like(scaled), (exponent - 4).int()) * scale_inv  # 3 mantissa bits
    err = (t.dequantize() - x).abs()
    assert torch.all(err <= half_step * (1 + 1e-6)), (err - half_step).max()


def test_nvfp4_rht_is_rotate_along_m_then_quantize_the_transpose(activations: torch.Tensor) -> None:
    """RHT on the column-wise operand = the plain row-wise recipe on rotate(x^T), rotated back.
    On fp32 input (``rht_any_input_dtype=True``, TE's reference quantizer's rule) the rotation
    is rounded once, to fp32."""
    mask = 0b0110_1001_1100_0011
    h = np.array([[1.0]])
    for _ in range(4):
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    signs = np.array([-1.0 if (mask >> i) & 1 else 1.0 for i in range(16)])
    rotation = torch.tensor(signs[:, None] * h / 4.0, dtype=torch.float32)
    x_t = activations.t().contiguous()  # (K, M): the column-wise operand, RHT along M
    rotated = (x_t.double().reshape(256, -1, 16) @ rotation.double()).reshape(256, 64).float()  # rounded once
    plain = NVFP4Quantizer().quantize(rotated)
    rht = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=mask, rowwise_usage=False,
                         columnwise_usage=True, rht_any_input_dtype=True).quantize(activations)
    assert torch.equal(rht._columnwise_data, plain._rowwise_data)
    assert torch.equal(rht._columnwise_scale_inv.view(torch.uint8), plain._rowwise_scale_inv.view(torch.uint8))
    assert torch.equal(rht._amax_columnwise, plain._amax_rowwise)
    unrotated = (plain.dequantize().reshape(256, -1, 16) @ rotation.t()).reshape(256, 64).t()
    torch.testing.assert_close(rht.dequantize(), unrotated, rtol=1e-6, atol=1e-6)
    rowwise = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=mask,
                             rht_any_input_dtype=True).quantize(activations)
    assert torch.equal(rowwise._rowwise_data, NVFP4Quantizer().quantize(activations)._rowwise_data)  # row-wise: no RHT


def test_microscales_needing_no_padding_are_kept_and_others_padded_with_zeros() -> None:
    """TE's MXFP8/NVFP4 scale buffer is the compact scales padded to (128, 4) multiples (4 x
    128 along the rows). Where nothing needs padding and no swizzle is asked, the compact
    tensor already is that buffer and is kept (no fill and copy per quantize); otherwise the
    valid region is copied into zeros, and load gives the compact scales back either way."""
    from tetrt_support.quant import scale_layouts as L

    fitting = torch.randint(1, 120, (256, 8), dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert L.store_microscales(fitting, along_rows=False, swizzled=False) is fitting
    swizzled = L.store_microscales(fitting, along_rows=False, swizzled=True)
    assert swizzled is not fitting
    assert torch.equal(L.load_microscales(swizzled, (256, 8), along_rows=False, swizzled=True).view(torch.uint8),
                       fitting.view(torch.uint8))
    ragged = torch.randint(1, 120, (130, 6), dtype=torch.uint8)
    stored = L.store_microscales(ragged, along_rows=False, swizzled=False)
    assert stored.shape == (256, 8) and int(stored[130:].count_nonzero()) == 0 and int(stored[:, 6:].count_nonzero()) == 0
    assert torch.equal(L.load_microscales(stored, (130, 6), along_rows=False, swizzled=False), ragged)
    columnwise = torch.randint(1, 120, (4, 256), dtype=torch.uint8)  # MXFP8 column-wise: blocks along the rows
    assert L.store_microscales(columnwise, along_rows=True, swizzled=False) is columnwise
