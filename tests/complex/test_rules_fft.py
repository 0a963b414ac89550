"""The FFT and einsum rules (real DFT matmuls) against eager PyTorch, both strategies,
complex64 and complex128, static and with a dynamic transform length."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from tests.complex.rule_harness import assert_same_as_eager, lowered

STRATEGIES = ("rewrite", "retrace")

# name -> (function, input is complex)
CASES = {
    "fft": (lambda a: torch.fft.fft(a), True),
    "fft_of_real": (lambda a: torch.fft.fft(a, dim=1), False),
    "fft_n_pads": (lambda a: torch.fft.fft(a, n=16), True),
    "fft_n_trims_ortho": (lambda a: torch.fft.fft(a, n=5, norm="ortho"), True),
    "ifft": (lambda a: torch.fft.ifft(a, dim=1), True),
    "ifft_forward_norm": (lambda a: torch.fft.ifft(a, norm="forward"), True),
    "rfft": (lambda a: torch.fft.rfft(a, dim=1), False),
    "rfft_odd_n": (lambda a: torch.fft.rfft(a, n=9), False),
    "irfft": (lambda a: torch.fft.irfft(a), True),
    "irfft_n": (lambda a: torch.fft.irfft(a, n=16, dim=1), True),
    "irfft_odd_n": (lambda a: torch.fft.irfft(a, n=7), True),
    "irfft_dim1": (lambda a: torch.fft.irfft(a, dim=1, norm="ortho"), True),
    "fftn_fnet": (lambda a: torch.fft.fftn(a, dim=(1, 2)), False),
    "fftn": (lambda a: torch.fft.fftn(a), True),
    "ifftn_s": (lambda a: torch.fft.ifftn(a, s=(8, 6)), True),
    "fft2": (lambda a: torch.fft.fft2(a), True),
    "ifft2": (lambda a: torch.fft.ifft2(a), True),
    "rfft2": (lambda a: torch.fft.rfft2(a), False),
    "irfft2": (lambda a: torch.fft.irfft2(a), True),
    "rfftn": (lambda a: torch.fft.rfftn(a, dim=(0, 2)), False),
    "irfftn_s": (lambda a: torch.fft.irfftn(a, s=(6, 10)), True),
    "hfft": (lambda a: torch.fft.hfft(a), True),
    "ihfft": (lambda a: torch.fft.ihfft(a), False),
    "autocorrelation": (lambda a: torch.fft.irfft(torch.fft.rfft(a, dim=1) * torch.fft.rfft(2 * a, dim=1).conj(), n=a.shape[1], dim=1), False),
    "einsum_fnet_tpu": (lambda a: torch.einsum("bij,jk,ni->bnk", a, torch.ones(12, 12, dtype=a.dtype) * (1 - 2j), torch.ones(10, 10, dtype=a.dtype) * 1j), True),
    "einsum_batched": (lambda a: torch.einsum("bij,bkj->bik", a, a.conj() * 0.5), True),
}


def _input(complex_: bool, dtype: torch.dtype, shape: tuple[int, ...] = (3, 10, 12)) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(shape, dtype=dtype if complex_ else dtype.to_real(), generator=g)


@pytest.mark.parametrize("dtype", (torch.complex64, torch.complex128), ids=str)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", list(CASES))
def test_fft_rule_matches_eager(name: str, strategy: str, dtype: torch.dtype) -> None:
    fn, complex_ = CASES[name]
    x = _input(complex_, dtype)
    run = lowered(fn, x, strategy=strategy)
    assert_same_as_eager(fn, run(x), x, rtol=1e-5 if dtype == torch.complex64 else 1e-12, of_largest=True)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", ["fftn_fnet", "rfft", "irfft_dim1", "ifft", "einsum_batched"])
def test_fft_rule_keeps_the_transform_length_dynamic(name: str, strategy: str) -> None:
    fn, complex_ = CASES[name]
    x = _input(complex_, torch.complex64)
    run = lowered(fn, x, strategy=strategy, dynamic_shapes=(({0: Dim("b", min=1, max=8), 1: Dim("s", min=2, max=32)},),))
    other = _input(complex_, torch.complex64, (2, 7, 12))
    assert_same_as_eager(fn, run(other), other, rtol=1e-5, of_largest=True)


def test_the_lowered_fft_is_real_matmuls() -> None:
    from tetrt_support.complex import complex_nodes

    x = _input(False, torch.complex64)
    program = torch.export.export(_Wrap(CASES["fftn_fnet"][0]), (x,), strict=False)
    from tetrt_support.complex import lower

    gm = lower(program, strategy="rewrite")
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("fft" in t for t in targets) and "aten.matmul.default" in targets
    assert complex_nodes(gm) == []


class _Wrap(torch.nn.Module):
    def __init__(self, fn) -> None:  # noqa: ANN001
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)
