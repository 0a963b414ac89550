"""The numeric building blocks against independent references (numpy float64, ml_dtypes)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tetrt_support.quant import numerics

E2M1_GRID = np.array(sorted({s * v for v in numerics.E2M1_VALUES for s in (1.0, -1.0)}), dtype=np.float64)


def _ref_e2m1(values: np.ndarray) -> np.ndarray:
    """ml_dtypes' E2M1 cast (round-to-nearest-even) after saturating to +-6."""
    return np.clip(values, -6.0, 6.0).astype(np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)


def test_e2m1_matches_ml_dtypes_on_ties_and_grid() -> None:
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    values = np.concatenate([ties, -ties, E2M1_GRID, np.linspace(-7, 7, 561), [1e-30, -1e-30, 6.0001, 1e9]])
    ours = numerics.e2m1_decode(numerics.e2m1_encode(torch.tensor(values, dtype=torch.float32))).numpy()
    np.testing.assert_array_equal(ours, _ref_e2m1(values))


@given(st.floats(min_value=-10.0, max_value=10.0, allow_nan=False, width=32))
def test_e2m1_is_a_nearest_representable(value: float) -> None:
    decoded = numerics.e2m1_decode(numerics.e2m1_encode(torch.tensor([value]))).item()
    target = min(max(value, -6.0), 6.0)
    assert abs(decoded - target) == pytest.approx(np.abs(E2M1_GRID - target).min(), abs=0)


def test_e2m1_special_values() -> None:
    codes = numerics.e2m1_encode(torch.tensor([math.inf, -math.inf, math.nan, -0.0]))
    assert numerics.e2m1_decode(codes).tolist() == [6.0, -6.0, 6.0, 0.0]  # NaN -> +6 (TE's cvt.satfinite); -0.0 -> code 0


def test_fp4_packing_layout_and_round_trip() -> None:
    codes = torch.arange(16, dtype=torch.uint8).reshape(2, 8)
    packed = numerics.pack_fp4(codes)
    assert packed.shape == (2, 4) and packed.dtype == torch.uint8
    assert packed[0, 0].item() == 0x10 and packed[0, 1].item() == 0x32  # element 2i in the low nibble
    assert torch.equal(numerics.unpack_fp4(packed), codes)
    with pytest.raises(ValueError, match="last dim must be even"):
        numerics.pack_fp4(torch.zeros(3, dtype=torch.uint8))


def _ref_ceil_pow2_exponent(ratio: float) -> int:
    return math.ceil(math.log2(ratio))


def test_e8m0_rounds_up_to_powers_of_two() -> None:
    rng = np.random.default_rng(0)
    ratios = np.concatenate([2.0 ** rng.uniform(-100, 100, 500), 2.0 ** np.arange(-100, 100), [3.0, 5.0, 0.75]])
    ratios = torch.tensor(ratios, dtype=torch.float32)
    biased = numerics.float_to_e8m0(ratios)
    expected = [_ref_ceil_pow2_exponent(float(r)) + 127 for r in ratios]
    assert biased.tolist() == expected
    decoded = numerics.e8m0_to_float(biased)
    assert torch.all(decoded >= ratios)  # rounded UP: never below the ratio
    assert torch.all(decoded < 2 * ratios)  # and by less than one binade
    # The stored byte is exactly an E8M0 value: torch's own decoder agrees.
    assert torch.equal(biased.view(torch.float8_e8m0fnu).float(), decoded)


def test_torch_e8m0_cast_rounds_to_nearest_which_is_why_we_round_ourselves() -> None:
    ratio = torch.tensor([5.0])  # amax / fp8_max of a block: 5 needs scale 8, nearest gives 4
    assert torch.equal(ratio.to(torch.float8_e8m0fnu).float(), torch.tensor([4.0]))
    assert numerics.e8m0_to_float(numerics.float_to_e8m0(ratio)).item() == 8.0


def test_e8m0_special_values() -> None:
    biased = numerics.float_to_e8m0(torch.tensor([0.0, 1e-45, math.inf, math.nan, 2.0**127, 2.0**127 * 1.5]))
    assert biased.tolist() == [0, 0, 254, 255, 254, 254]
    assert torch.isnan(numerics.e8m0_to_float(torch.tensor([255], dtype=torch.uint8))).all()


@pytest.mark.parametrize("dtype, ml", [(torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn), (torch.float8_e5m2, ml_dtypes.float8_e5m2)])
def test_cast_to_fp8_matches_ml_dtypes_and_saturates(dtype: torch.dtype, ml: type) -> None:
    limit = numerics.fp8_max(dtype)
    assert limit == float(ml_dtypes.finfo(ml).max)
    x = torch.randn(4096) * limit / 3
    scale = torch.tensor(1.7)
    ours = numerics.cast_to_fp8(x, scale, dtype).float().numpy()
    scaled = (x * scale).numpy()
    reference = np.clip(scaled, -limit, limit).astype(ml).astype(np.float32)
    np.testing.assert_array_equal(ours, reference)
    special = numerics.cast_to_fp8(torch.tensor([math.inf, -math.inf, math.nan, 1e30]), 1.0, dtype).float()
    assert special[:2].tolist() == [limit, -limit] and math.isnan(special[2]) and special[3] == limit


def test_scale_from_amax_rules() -> None:
    amax = torch.tensor([0.0, math.inf, math.nan, 1e-45, 3.0, 448.0])
    scale = numerics.compute_scale_from_amax(amax, 448.0)
    assert scale[:3].tolist() == [1.0, 1.0, 1.0]  # zero and non-finite amax -> 1
    assert scale[3].item() == numerics.FP32_MAX  # 448 / tiny overflows -> fp32 max
    assert scale[4].item() == pytest.approx(448.0 / 3.0) and scale[5].item() == 1.0
    pow2 = numerics.compute_scale_from_amax(torch.tensor([3.0, 448.0, 0.001]), 448.0, force_pow_2_scales=True)
    assert pow2.tolist() == [2.0 ** math.floor(math.log2(448.0 / a)) for a in (3.0, 448.0, 0.001)]
    assert numerics.compute_scale_from_amax(torch.tensor([0.0]), 448.0, epsilon=1.0).item() == 448.0


def test_hadamard_is_orthonormal_sylvester_with_sign_rows() -> None:
    h = np.array([[1.0]])
    for _ in range(4):
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    mask = 0b1000_0000_0000_0101
    signs = np.array([-1.0 if (mask >> i) & 1 else 1.0 for i in range(16)])
    matrix = numerics.random_hadamard_matrix(mask)
    np.testing.assert_allclose(matrix.numpy(), signs[:, None] * h / 4.0, rtol=0, atol=0)
    torch.testing.assert_close(matrix @ matrix.t(), torch.eye(16), rtol=0, atol=1e-6)
    matrix.zero_()  # a fresh tensor: mutating it must not poison the cache
    assert numerics.random_hadamard_matrix(mask).abs().sum().item() == 64.0
    with pytest.raises(ValueError, match="must fit in 16 bits"):
        numerics.random_hadamard_matrix(1 << 16)


def test_apply_hadamard_groups_of_sixteen() -> None:
    x = torch.randn(3, 32)
    m = numerics.random_hadamard_matrix(12345)
    y = numerics.apply_hadamard(x, m)
    torch.testing.assert_close(y[:, 16:], x[:, 16:] @ m)
    torch.testing.assert_close(numerics.apply_hadamard(y, m.t()), x, rtol=0, atol=1e-5)


@pytest.mark.parametrize("shape, block", [((5, 300), (1, 128)), ((130, 260), (128, 128)), ((4, 64), (1, 32))])
def test_block_amax_matches_numpy_loops(shape: tuple[int, int], block: tuple[int, int]) -> None:
    x = torch.randn(shape)
    ours = numerics.block_amax(x, *block)
    a = np.abs(x.numpy().astype(np.float64))
    br, bc = block
    expected = np.array(
        [[a[i : i + br, j : j + bc].max() for j in range(0, shape[1], bc)] for i in range(0, shape[0], br)]
    )
    np.testing.assert_array_equal(ours.numpy(), expected.astype(np.float32))
    full = numerics.expand_block_scales(ours, br, bc, shape)
    assert full.shape == shape and torch.all(full >= x.abs())


def _fp8_integers(shape: tuple[int, int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """FP8 matrices of small integers: every product and every fp32 partial sum is exact, so
    any summation order gives the one exact sum."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-12, 13, shape, generator=g).float().to(dtype)


@given(m=st.integers(1, 24), k=st.integers(1, 40), n=st.integers(1, 24),
       rhs_dtype=st.sampled_from([torch.float8_e4m3fn, torch.float8_e5m2]),
       out_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       scale_a=st.floats(2.0**-14, 2.0**10, width=32), scale_b=st.floats(2.0**-14, 2.0**10, width=32),
       seed=st.integers(0, 99))
def test_tensorwise_fp8_mm_is_the_exact_sum_times_both_scales_rounded_once(
        m: int, k: int, n: int, rhs_dtype: torch.dtype, out_dtype: torch.dtype, scale_a: float, scale_b: float,
        seed: int) -> None:
    lhs = _fp8_integers((m, k), torch.float8_e4m3fn, seed)
    rhs = _fp8_integers((n, k), rhs_dtype, seed + 1).t()  # column-major, as the GEMMs pass it
    sa, sb = torch.tensor(scale_a), torch.tensor(scale_b)
    out = numerics.tensorwise_fp8_mm(lhs, rhs, sa, sb, out_dtype)
    exact = lhs.double().numpy() @ rhs.double().numpy()  # integers: exact in float64 and in fp32
    scales = np.float32(scale_a) * np.float32(scale_b)  # one fp32 product of the two scales
    expected = (exact.astype(np.float32) * scales).astype(np.float32)
    if out_dtype == torch.bfloat16:
        expected = expected.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert out.dtype == out_dtype and out.shape == (m, n)
    np.testing.assert_array_equal(out.float().numpy(), expected)


def test_tensorwise_fp8_mm_gives_scaled_mm_bytes_where_both_are_exact() -> None:
    """torch's own op, on inputs and power-of-two scales whose result is exact in fp32: the
    definition is the op's (where rounding enters, oneDNN's reference kernel scales each
    product before summing, so the two differ in the last bits)."""
    lhs = _fp8_integers((16, 32), torch.float8_e4m3fn, 0)
    rhs = _fp8_integers((24, 32), torch.float8_e4m3fn, 1).t()
    for sa, sb in ((0.5, 4.0), (2.0**-7, 2.0**3)):
        for out_dtype in (torch.float32, torch.bfloat16):
            scale_a, scale_b = torch.tensor(sa), torch.tensor(sb)
            ours = numerics.tensorwise_fp8_mm(lhs, rhs, scale_a, scale_b, out_dtype)
            theirs = torch._scaled_mm(lhs, rhs, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
            assert torch.equal(ours, theirs), (sa, sb, out_dtype)


def test_tensorwise_fp8_mm_off_the_cpu_is_torchs_scaled_mm() -> None:
    """Traced on meta tensors (a device that is not the CPU, as CUDA is): the graph's GEMM is
    ``aten._scaled_mm`` with the fast-accumulation flag passed on, and no fp32 GEMM."""
    from torch.fx.experimental.proxy_tensor import make_fx

    lhs = torch.empty(32, 64, dtype=torch.float8_e4m3fn, device="meta")
    rhs = torch.empty(48, 64, dtype=torch.float8_e4m3fn, device="meta").t()
    scale = torch.ones((), device="meta")
    graph = make_fx(lambda a, b, sa, sb: numerics.tensorwise_fp8_mm(a, b, sa, sb, torch.bfloat16,
                                                                     use_fast_accum=True))(lhs, rhs, scale, scale)
    calls = [n for n in graph.graph.nodes if n.op == "call_function"]
    gemms = [n for n in calls if n.target == torch.ops.aten._scaled_mm.default]
    assert len(gemms) == 1
    # (self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    assert gemms[0].args[6:] == (torch.bfloat16, True)
    assert not any(n.target == torch.ops.aten.mm.default for n in calls)
