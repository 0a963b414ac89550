"""The elementwise rules that Torch-TensorRT's complex rewriter covers, and complex division,
against eager PyTorch on ordinary, tiny, huge, largest-float, infinite and NaN inputs."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from tests.complex.rule_harness import assert_same_as_eager, lowered

STRATEGIES = ("rewrite", "retrace")
DTYPES = (torch.complex64, torch.complex128)

OPS = {
    "div": lambda a: a / a.flip(0),
    "reciprocal": torch.reciprocal,
    "log2": torch.log2,
    "log10": torch.log10,
    "log1p": torch.log1p,
    "expm1": torch.expm1,
    "asin": torch.asin,
    "acos": torch.acos,
    "atan": torch.atan,
    "asinh": torch.asinh,
    "acosh": torch.acosh,
    "atanh": torch.atanh,
    "rsqrt": torch.rsqrt,
    "sgn": torch.sgn,
    "repeat": lambda a: a.repeat(2, 1),
    "abs": torch.abs,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "exp": torch.exp,
}
# the functions whose rule carries a special-value table, run through a real engine below
TABLED = ("asin", "acos", "atan", "asinh", "acosh", "atanh", "log1p", "exp", "sqrt")


def _grid(dtype: torch.dtype, finite: bool) -> torch.Tensor:
    """Every pair of 0, -0, +-1, 0.5, -2.5, 3, 0.9999, tiny, the smallest normal, huge,
    the largest float (and inf, -inf, NaN unless ``finite``) as (real, imag): with the
    non-finite values, every row of the Annex G special-value tables."""
    real = dtype.to_real()
    info = torch.finfo(real)
    tiny, huge = (1e-30, 1e30) if real == torch.float32 else (1e-300, 1e300)
    values = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 0.9999, tiny, info.tiny, huge, -huge, info.max]
    if not finite:
        values += [float("inf"), float("-inf"), float("nan")]
    v = torch.tensor(values, dtype=real)
    re, im = torch.meshgrid(v, v, indexing="ij")
    return torch.complex(re.reshape(-1, 1), im.reshape(-1, 1)).expand(-1, 2).contiguous()


def _rtol(dtype: torch.dtype) -> float:
    return 2e-5 if dtype == torch.complex64 else 1e-10


# Every rule gives eager's answer at infinite and NaN inputs too: eager's CPU kernels follow
# glibc's C99 Annex G tables (casin, cacosh, csqrt, cexp, ...) and c10's own log1p, which
# the rules reproduce with where over isinf/isnan (tetrt_support.complex.rules.special_values).
@pytest.mark.parametrize("finite", [True, False], ids=["finite extremes", "infinities and nan"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", list(OPS))
def test_rule_matches_eager(name: str, strategy: str, dtype: torch.dtype, finite: bool) -> None:
    x = _grid(dtype, finite=finite)
    run = lowered(OPS[name], x, strategy=strategy)
    assert_same_as_eager(OPS[name], run(x), x, rtol=_rtol(dtype))


# Arithmetic with a real side: torch promotes the real operand to complex (value + 0i) and
# computes in full -- a + alpha * b with alpha a complex scalar, (ac - bd, ad + bc) -- so
# (inf + 1i) * 2 is (inf, nan) and -0i + 2 is +0i; a rule that scales or adds only the
# real part gives (inf, 2) and keeps -0.
ARITHMETIC = {
    "mul": lambda a: a * a.flip(0),
    "mul_real_scalar": lambda a: a * 2.0,
    "rmul_real_scalar": lambda a: -0.5 * a,
    "mul_int_scalar": lambda a: a * 3,
    "mul_real_tensor": lambda a: a * a.real.flip(0),
    "mul_complex_scalar": lambda a: a * (2 + 0j),
    "div_real_scalar": lambda a: a / 2.0,
    "div_real_tensor": lambda a: a / a.imag.flip(0),
    "div_complex_scalar": lambda a: a / (2 + 1j),
    "add": lambda a: a + a.flip(0),
    "add_real_scalar": lambda a: a + 2.0,
    "add_real_tensor": lambda a: a + a.real.flip(0),
    "sub_alpha": lambda a: torch.sub(a, a.flip(0), alpha=2),
    "rsub_real_scalar": lambda a: 2.0 - a,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", list(ARITHMETIC))
def test_arithmetic_follows_torchs_promotion_with_signed_zeros(name: str, strategy: str, dtype: torch.dtype) -> None:
    x = _grid(dtype, finite=False)
    run = lowered(ARITHMETIC[name], x, strategy=strategy)
    got = run(x)
    assert_same_as_eager(ARITHMETIC[name], got, x, rtol=_rtol(dtype))
    want = torch.view_as_real(ARITHMETIC[name](x))
    got = torch.view_as_real(got) if got.is_complex() else got
    zeros = want == 0
    flipped = (torch.signbit(got) != torch.signbit(want)) & zeros
    assert not flipped.any(), f"{name}: {int(flipped.sum())} zeros with the wrong sign"


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", list(OPS))
def test_rule_keeps_a_dynamic_dim_dynamic(name: str, strategy: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, dtype=torch.complex64, generator=g)
    run = lowered(OPS[name], x, strategy=strategy, dynamic_shapes=(({0: Dim("n", min=2, max=64)},),))
    other = torch.randn(9, 2, dtype=torch.complex64, generator=g)
    assert_same_as_eager(OPS[name], run(other), other, rtol=2e-5)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_division_does_not_overflow_where_torch_does_not(strategy: str) -> None:
    """The textbook (ac + bd) / (c^2 + d^2) gives 0 and NaN here; torch's scaled division gives 1."""
    big = torch.tensor([1e30 + 1e30j, 3e-30 - 4e-30j], dtype=torch.complex64)
    run = lowered(lambda a, b: a / b, big, big, strategy=strategy)
    got = torch.view_as_complex(run(big, big))
    torch.testing.assert_close(got, torch.ones(2, dtype=torch.complex64))
    assert_same_as_eager(lambda a, b: a / b, run(big, big), big, big, rtol=1e-6)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_special_value_tables_run_in_one_onnxruntime_block(strategy: str) -> None:
    """The tables are plain where/isinf/isnan/copysign: ONNX Runtime takes every tabled
    rule in ONE engine block and returns eager's special values."""
    import tetrt_support

    def all_tabled(z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(OPS[name](z) for name in TABLED)

    x = _grid(torch.complex64, finite=False)
    program = torch.export.export(_Tabled(all_tabled), (x,), strict=False)
    compiled = tetrt_support.compile(program, backend="onnxruntime", strategy=strategy)
    assert compiled.blocks_summary().startswith("1 engine block, 0 fallback blocks"), compiled.blocks_summary()
    for name, got, want in zip(TABLED, compiled(x), all_tabled(x)):
        torch.testing.assert_close(got, want, rtol=_rtol(torch.complex64), atol=1e-6, equal_nan=True, msg=name)


class _Tabled(torch.nn.Module):
    def __init__(self, fn) -> None:  # noqa: ANN001
        super().__init__()
        self.fn = fn

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.fn(z)


class _TimesTwo(torch.nn.Module):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * 2.0


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("backend", ["eager", "onnxruntime", "inductor"])
def test_compiled_complex_times_real_scalar_is_eagers_on_every_engine(backend: str, strategy: str) -> None:
    """The reported case, through the whole compiler: z * 2.0 at inf + 1j is (inf, nan)."""
    import tetrt_support

    z = torch.tensor([complex(float("inf"), 1.0), 1 - 2j, complex(0.0, -0.0)], dtype=torch.complex64)
    compiled = tetrt_support.compile(_TimesTwo(), arg_inputs=(z,), backend=backend, strategy=strategy,
                                     min_block_size=1)
    got, want = torch.view_as_real(compiled(z)), torch.view_as_real(z * 2.0)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(torch.signbit(got), torch.signbit(want))
