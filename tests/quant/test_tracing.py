"""The compile-count and graph-capture helpers of tetrt_support.report.quant_tracing (notebook 03)."""

from __future__ import annotations

import itertools

import pytest
import torch

from tetrt_support.quant import MXFP8Quantizer, NVFP4Quantizer, register_value_quantizer
from tetrt_support.report.quant_tracing import (
    IdentityMXFP8Quantizer,
    compiles_over_steps,
    make_step,
    placeholders,
    trace_over,
)


class _HoistedMXFP8Quantizer(MXFP8Quantizer):
    """Same numerics, lifted to a graph input (``hoist=True``)."""


register_value_quantizer(_HoistedMXFP8Quantizer, hoist=True)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield
    torch._dynamo.reset()


def test_identity_quantizer_is_equal_only_to_itself() -> None:
    a, b = IdentityMXFP8Quantizer(), IdentityMXFP8Quantizer()
    assert a == a and a != b and hash(a) != hash(b)
    expr, globals_ = a.__fx_repr__()
    assert globals_[expr] is a  # FX code refers to this very object


def test_fresh_value_quantizers_compile_once_identity_ones_every_step() -> None:
    assert compiles_over_steps(MXFP8Quantizer, MXFP8Quantizer) == (1, 1, True)
    assert compiles_over_steps(IdentityMXFP8Quantizer, IdentityMXFP8Quantizer) == (5, 5, True)


def test_two_alternating_values_compile_twice() -> None:
    configs = itertools.cycle([MXFP8Quantizer(columnwise_usage=False), MXFP8Quantizer()])
    assert compiles_over_steps(MXFP8Quantizer, lambda: next(configs).copy(), steps=6) == (2, 2, True)


def test_make_step_matches_the_eager_formula() -> None:
    x, q = torch.randn(32, 64), MXFP8Quantizer()
    expected = torch.relu(q.quantize(x * 2.0).dequantize()) + 1.0
    assert torch.equal(make_step(MXFP8Quantizer)(x, q), expected)


def test_trace_over_keeps_graphs_that_rebuild_a_value_from_its_fields() -> None:
    report = trace_over(make_step(NVFP4Quantizer), [NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)],
                         torch.randn(16, 32, dtype=torch.bfloat16))
    assert (report.frames, report.unique_graphs, report.matches_eager) == (1, 1, True)
    (graph,) = report.graphs
    assert "tetrt_rebuild_quantizer(" in graph.code and "rht_matrix" not in graph.code
    assert placeholders(graph) == ["L_x_"]  # the quantizer is baked in, not an input


def test_hoisted_value_is_a_graph_input_and_each_value_a_graph() -> None:
    quantizers = [_HoistedMXFP8Quantizer(d) for d in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fn)]
    report = trace_over(make_step(_HoistedMXFP8Quantizer), quantizers, torch.randn(32, 64))
    assert report.frames == 2 and report.matches_eager
    assert placeholders(report.graphs[0]) == ["L_x_", "L_quantizer_"]
    assert "tetrt_rebuild_quantizer" not in report.graphs[0].code


def test_trace_over_reports_a_mismatch_and_still_counts_every_compile() -> None:
    inner = make_step(MXFP8Quantizer)

    def step(x: torch.Tensor, quantizer: MXFP8Quantizer) -> torch.Tensor:
        out = inner(x, quantizer)
        return out if torch.compiler.is_compiling() else out + 1.0  # eager differs from compiled

    report = trace_over(step, [MXFP8Quantizer(), MXFP8Quantizer(torch.float8_e5m2)], torch.randn(32, 64))
    assert report.matches_eager is False and report.frames == 2  # the first mismatch stops nothing
