"""torchlib translates ``atan2`` as ``atan(y/x) +- pi`` on ``y > 0`` with NaN mapped to 0, and
has no translation for ``copysign``/``signbit``; the ONNX Runtime engine decomposes them
exactly first, so a block gives eager's values at signed zeros, infinities and NaN."""

from __future__ import annotations

import itertools

import pytest
import torch

import tetrt_support


class _Fn(torch.nn.Module):
    def __init__(self, fn) -> None:  # noqa: ANN001
        super().__init__()
        self.fn = fn

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.fn(y, x)


def _pairs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    values = [0.0, -0.0, 1.0, -1.0, 1e-30, -3.0, float("inf"), float("-inf"), float("nan")]
    y, x = zip(*itertools.product(values, values))
    return torch.tensor(y, dtype=dtype), torch.tensor(x, dtype=dtype)


@pytest.mark.parametrize(("name", "dtype"), [("atan2", torch.float32), ("copysign", torch.float32), ("copysign", torch.float64)])
def test_onnxruntime_block_matches_eager_at_signed_zeros_infinities_and_nan(name: str, dtype: torch.dtype) -> None:
    fn = getattr(torch, name)
    y, x = _pairs(dtype)
    program = torch.export.export(_Fn(fn), (y, x), strict=False)
    compiled = tetrt_support.compile(program, backend="onnxruntime", min_block_size=1, check_engine_blocks=False)
    assert compiled.blocks_summary().startswith("1 engine block, 0 fallback blocks"), compiled.blocks_summary()
    got, want = compiled(y, x), fn(y, x)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=0)
    finite = ~want.isnan()
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(want[finite]))  # the sign of every zero too


def test_a_float64_atan2_block_falls_back_with_a_warning_naming_the_missing_kernel() -> None:
    """ONNX Runtime's CPU provider has no float64 ``Atan`` kernel: the block runs in PyTorch."""
    y, x = _pairs(torch.float64)
    program = torch.export.export(_Fn(torch.atan2), (y, x), strict=False)
    with pytest.warns(UserWarning, match="Atan"):
        compiled = tetrt_support.compile(program, backend="onnxruntime", min_block_size=1)
    assert compiled.blocks_summary() == "0 engine blocks, 1 fallback block"
    torch.testing.assert_close(compiled(y, x), torch.atan2(y, x), equal_nan=True)


def test_complex_log_on_the_negative_real_axis_keeps_its_branch_on_onnxruntime() -> None:
    """``log(-2 + 0j) = log 2 + pi j``: torchlib's atan2 gave ``-pi`` here."""

    class Log(torch.nn.Module):
        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return torch.view_as_real(torch.log(torch.view_as_complex(z)))

    z = torch.tensor([[-2.0, 0.0], [-2.0, -0.0], [-0.5, 0.0]])
    program = torch.export.export(Log(), (z,), strict=False)
    compiled = tetrt_support.compile(program, backend="onnxruntime", min_block_size=1, check_engine_blocks=False)
    assert compiled.blocks_summary().startswith("1 engine block")
    torch.testing.assert_close(compiled(z), Log()(z))


def test_an_aten_block_is_exported_with_the_exact_decompositions_in_one_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact functions replace the ATen nodes before torch.export traces the block, so
    the only retrace is the exporter's own (a torch-level ``torch.atan2`` block, which export
    turns into ATen, takes one more); the caller's block keeps its nodes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tetrt_support.compiler.engines import onnxruntime as engine

    y, x = _pairs(torch.float32)
    aten_block = make_fx(lambda a, b: torch.atan2(a, b) + torch.copysign(a, b))(y, x)
    torch_block = torch.fx.symbolic_trace(_Fn(torch.atan2))
    retraces: list[int] = []
    original = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **k: retraces.append(1) or original(self, *a, **k))
    for block, expected in ((aten_block, 1), (torch_block, 2)):
        retraces.clear()
        engine.export_block_to_onnx(block, [y, x])
        assert len(retraces) == expected
    targets = {n.target for n in aten_block.graph.nodes if n.op == "call_function"}
    assert {torch.ops.aten.atan2.default, torch.ops.aten.copysign.Tensor} <= targets
