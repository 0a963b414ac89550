"""Ops without a rule: a clear error in raise mode, a complex island in fallback mode."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn

from tests.complex.complex_testing import STRATEGIES, export

from tetrt_support.complex import UnsupportedComplexOp, complex_nodes, lower

aten = torch.ops.aten


class CumsumRope(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x)
        running = torch.cumsum(z * 2, dim=0)  # complex cumsum: no rule
        return torch.view_as_real(running * 1j)


class ScaledEig(nn.Module):
    """A multi-output op whose outputs are genuinely complex (eigenvalues, eigenvectors),
    one of them used by a complex op that does have a rule (unlike ``tests.models.Eig``)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, vectors = torch.linalg.eig(x + 1)
        return values * 2, vectors


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_raise_names_op_node_and_source_line(strategy: str) -> None:
    ep = export(CumsumRope(), (torch.randn(5, 3, 2),))
    with pytest.raises(UnsupportedComplexOp, match=r"aten\.cumsum\.default at node 'cumsum'") as info:
        lower(ep, strategy)
    err = info.value
    assert err.op is aten.cumsum.default and err.node == "cumsum"
    assert "test_errors.py" in err.source and "running = torch.cumsum(z * 2, dim=0)" in err.source
    assert 'unsupported="fallback"' in str(err)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fallback_keeps_op_as_complex_island(strategy: str) -> None:
    model, x = CumsumRope(), torch.randn(5, 3, 2)
    gm = lower(export(model, (x,)), strategy, unsupported="fallback")
    torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)
    # the only complex values left: view_as_complex -> cumsum, closed by view_as_real
    island = complex_nodes(gm)
    assert [n.target for n in island] == [aten.view_as_complex.default, aten.cumsum.default, aten.view_as_real.default]
    vac, cumsum, var = island
    assert cumsum.args[0] is vac and var.args[0] is cumsum
    assert vac.meta["val"].dtype == torch.complex64 and var.meta["val"].dtype == torch.float32


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fallback_multi_output_op_returns_each_result_through_getitem(strategy: str) -> None:
    model, x = ScaledEig(), torch.randn(3, 3, dtype=torch.float64)
    gm = lower(export(model, (x,)), strategy, unsupported="fallback")
    assert gm.meta["tetrt_complex_io"] == {"inputs": [None], "outputs": [torch.complex128, torch.complex128]}
    (eig,) = [n for n in gm.graph.nodes if n.target is aten.linalg_eig.default]
    assert all(u.target is operator.getitem for u in eig.users)
    assert all(next(iter(u.users)).target is aten.view_as_real.default for u in eig.users)
    values, vectors = gm(x)
    ref_values, ref_vectors = model(x)
    torch.testing.assert_close(values, torch.view_as_real(ref_values), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(vectors, torch.view_as_real(ref_vectors), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_raise_mode_rejects_the_multi_output_op(strategy: str) -> None:
    with pytest.raises(UnsupportedComplexOp, match=r"aten\.linalg_eig\.default at node 'linalg_eig'"):
        lower(export(ScaledEig(), (torch.randn(3, 3),)), strategy)


def test_graph_without_meta_values_is_rejected() -> None:
    gm = torch.fx.symbolic_trace(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"needs node.meta\['val'\]"):
        lower(gm)
