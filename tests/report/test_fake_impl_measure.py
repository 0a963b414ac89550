"""report.fake_impl_measure's tables: a custom op's schema and the head of a captured graph."""

from __future__ import annotations

import pytest
import torch

from tetrt_support.report.fake_impl_measure import graph_head_table, schema_table


class _Opaque:
    pass


def test_schema_table_lists_arguments_then_returns() -> None:
    table = schema_table(torch.ops.aten.add.Tensor)
    assert table.title == "aten::add"
    assert table.rows == (("self", "Tensor"), ("other", "Tensor"), ("alpha", "number"), ("return 0", "Tensor"))


def test_graph_head_table_stops_at_the_first_call_of_the_op() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    scaled = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
    picked = graph.call_function(torch.ops.aten.cat.default, ([x, scaled],), {"dim": 0})
    graph.call_method("relu", (picked,))
    graph.call_function(torch.ops.aten.neg.default, (x,))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    table = graph_head_table(gm, "aten.cat.default")
    assert table.rows == (("x", "graph input"), ("mul_tensor", "aten.mul.Tensor on x, 2.0"),
                          ("cat_default", "aten.cat.default on [x, mul_tensor], dim=0"))
    with pytest.raises(ValueError, match=r"the graph calls no 'sigmoid'; it calls \[.*'relu'"):
        graph_head_table(gm, "sigmoid")


def test_opaque_argument_is_shown_by_its_type() -> None:
    from tetrt_support.report.fake_impl_measure import _describe_arg

    assert _describe_arg([_Opaque(), None, (1, "a")]) == "[_Opaque, None, (1, 'a')]"
