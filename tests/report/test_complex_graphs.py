"""Notebook 01's inventories: histograms, complex-node tables, strategy comparison, RoPE plot data."""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx as fx

from tetrt_support import zoo
from tetrt_support.report import complex_graphs as graphs
from tetrt_support.report.compare import max_abs_error


@pytest.fixture(scope="module")
def rope_export() -> zoo.ZooExport:
    return zoo.export_model("complex_rope")


def test_op_histogram_counts_call_functions_by_op(rope_export: zoo.ZooExport) -> None:
    hist = graphs.op_histogram(rope_export.program)
    assert hist["aten.view_as_complex.default"] == 2
    assert hist["aten.view_as_real.default"] == 2
    assert hist["aten.mul.Tensor"] == 2
    assert sum(hist.values()) == sum(1 for n in rope_export.program.graph.nodes if n.op == "call_function")
    # The same from the GraphModule and from the bare Graph.
    assert graphs.op_histogram(rope_export.program.graph_module) == hist
    assert graphs.op_histogram(rope_export.program.graph) == hist
    with pytest.raises(TypeError, match="expected an ExportedProgram, fx.GraphModule or fx.Graph, got int"):
        graphs.op_histogram(3)


def test_complex_node_rows_list_the_buffer_and_every_complex_op(rope_export: zoo.ZooExport) -> None:
    rows = graphs.complex_node_table(rope_export.program).rows
    ops = [r.op for r in rows]
    assert rows[0].op == "placeholder" and rows[0].dtype == "complex64" and rows[0].shape == "[64, 8]"
    assert ops.count("aten.view_as_complex.default") == 2 and ops.count("aten.view_as_real.default") == 2
    # view_as_real reads a complex value but produces a real one.
    real_rows = [r for r in rows if r.op == "aten.view_as_real.default"]
    assert all(r.dtype == "float32" and r.shape == "[2, 8, 4, 8, 2]" for r in real_rows)
    assert len(graphs.complex_valued_nodes(rope_export.program)) == len(rows) - 2


def test_llama4_has_sixteen_complex_valued_nodes() -> None:
    program, _, _ = zoo.export_model("llama4")
    valued = graphs.complex_valued_nodes(program)
    assert len(valued) == 16  # shared: polar, a mul, two casts; per layer (2): 2 view_as_complex, 2 unsqueeze, 2 mul
    assert {graphs.op_name(n) for n in valued} == {
        "aten.polar.default",
        "aten.mul.Tensor",
        "aten.to.dtype_layout",
        "aten.view_as_complex.default",
        "aten.unsqueeze.default",
    }


def test_histogram_rows_put_histograms_side_by_side() -> None:
    table = graphs.histogram_table({"before": {"mul": 2, "add": 1}, "after": {"mul": 8}})
    assert table.headers == ("op", "before", "after")
    assert table.rows == (("add", 1, 0), ("mul", 2, 8))
    assert graphs.histogram_table({"a": {"x": 1}}, ops=["y", "x"]).rows == (("y", 0), ("x", 1))


def test_max_abs_error_compares_pytrees_and_refuses_mismatched_structure() -> None:
    a = {"x": torch.tensor([1.0, 2.0]), "z": torch.tensor([1 + 1j], dtype=torch.complex64)}
    b = {"x": torch.tensor([1.0, 2.5]), "z": torch.tensor([1 + 3j], dtype=torch.complex64)}
    assert max_abs_error(a, b) == 2.0
    with pytest.raises(ValueError, match="expected 2 tensor outputs, got 1"):
        max_abs_error(a, [torch.zeros(2)])
    with pytest.raises(ValueError, match=r"output 0: expected complex \[1\], got real \[1, 2\]"):
        max_abs_error(torch.zeros(1, dtype=torch.complex64), torch.zeros(1, 2))


@pytest.mark.skipif(not graphs.torch_decompose_available(), reason="decompose_complex_in_graph ships with torch >= 2.14")
@pytest.mark.parametrize("name", ["complex_rope", "llama4"])
def test_torch_decompose_complex_runs_on_exported_programs(name: str) -> None:
    model = zoo.build_model(name)
    program, args, kwargs = zoo.export_model(name, model=model)
    gm = graphs.torch_decompose_complex(program, args, kwargs)
    flat = torch.utils._pytree.tree_leaves((args, kwargs))
    with torch.no_grad():
        want, got = model(*args, **kwargs), gm(*flat)
    assert max_abs_error(want, got) < 1e-5
    # It keeps view_as_complex (and, for Llama 4, polar) nodes: the result is not complex-free.
    assert "aten.view_as_complex.default" in {graphs.op_name(n) for n in graphs.complex_valued_nodes(gm)}


def _identity_lowering(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> fx.GraphModule:
    return program.module()


def _broken_lowering(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> fx.GraphModule:
    gm = program.module()
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.mul.Tensor:
            node.target = torch.ops.aten.add.Tensor
    gm.recompile()
    return gm


def test_compare_strategies_reports_counts_leftovers_and_errors(rope_export: zoo.ZooExport) -> None:
    program, args, kwargs = rope_export
    strategies = [graphs.Strategy("identity", _identity_lowering), graphs.Strategy("broken", _broken_lowering)]
    identity, broken = graphs.compare_strategies(program, args, kwargs, strategies, repeats=2)
    assert identity.nodes == sum(graphs.op_histogram(program).values())
    assert identity.max_abs_error == 0.0 and identity.new_ops == ()
    assert "aten.view_as_complex.default" in identity.left_behind and identity.keeps_signature
    assert identity.seconds >= 0.0
    assert broken.max_abs_error > 0.1 and "aten.add.Tensor" in broken.new_ops
    table = graphs.strategy_table(program, [identity, broken])
    assert table.headers[0] == "graph" and table.column("graph") == ["exported", "identity", "broken"]
    assert table.rows[1][-1] is True and table.rows[2][-1] is False
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        graphs.compare_strategies(program, args, kwargs, strategies, repeats=0)


def test_rope_rotation_traces_are_unit_circles_at_the_rope_frequencies() -> None:
    rope = zoo.ComplexRoPE(head_dim=16, max_seq_len=32)
    traces = graphs.rope_rotation_traces(rope, pairs=[0, 3, 7], positions=32)
    inv = zoo.rope_inverse_frequencies(16)
    for t in traces:
        torch.testing.assert_close(t.x**2 + t.y**2, torch.ones(32))
        assert math.isclose(t.frequency, float(inv[t.pair]), rel_tol=1e-5)
        angle = torch.atan2(t.y, t.x)
        want = torch.remainder(t.positions * inv[t.pair] + torch.pi, 2 * torch.pi) - torch.pi
        torch.testing.assert_close(torch.cos(angle - want), torch.ones(32))
    with pytest.raises(ValueError, match=r"pairs \[8\] out of range: head_dim=16 has pairs 0..7"):
        graphs.rope_rotation_traces(rope, pairs=[8], positions=4)


def test_attention_scores_depend_only_on_the_offset() -> None:
    assert graphs.relative_position_invariance(zoo.ComplexRoPE(), positions=24) < 1e-4
    # Without rotation (identity "RoPE") the spread is 0 too; with a position-dependent
    # scale it is not: the check can fail.
    class Scaled(torch.nn.Module):
        head_dim = 16

        def forward(self, q, k):
            s = torch.arange(1, q.shape[1] + 1.0)[None, :, None, None]
            return q * s, k

    assert graphs.relative_position_invariance(Scaled(), positions=8) > 1.0


def twice(ctx, self):  # noqa: ANN001, ANN201 - a stand-in rule, only its name matters
    return self


def test_rule_table_rows_group_ops_by_rule() -> None:
    rules = {torch.ops.aten.mul.Tensor: twice, torch.ops.aten.mul.Scalar: twice, torch.ops.aten.neg.default: abs}
    table = graphs.rule_table(rules)
    assert table.headers == ("rule", "ATen ops it lowers")
    assert table.rows == (("twice", "mul.Tensor, mul.Scalar"), ("abs", "neg"))

    # Closures made by a rule factory are named after the factory, not "rule".
    def _unary(name):  # noqa: ANN001, ANN202
        def rule(ctx, self):  # noqa: ANN001, ANN202
            return self
        return rule

    made = {torch.ops.aten.sin.default: _unary("sin"), torch.ops.aten.cos.default: _unary("cos")}
    assert graphs.rule_table(made).rows == (("test_rule_table_rows_group_ops_by_rule._unary.rule", "sin, cos"),)


def test_lowered_aten_lines_show_a_complex_multiply_as_real_arithmetic() -> None:
    from tetrt_support.complex import lower

    def complex_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(torch.view_as_complex(x) * torch.view_as_complex(y))

    program = graphs.one_op_program(complex_mul, torch.randn(2, 3, 2), torch.randn(2, 3, 2))
    assert graphs.lowered_aten_lines(program.module()) == [
        "view_as_complex = torch.ops.aten.view_as_complex.default(args_0)",
        "view_as_complex_1 = torch.ops.aten.view_as_complex.default(args_1)",
        "mul = torch.ops.aten.mul.Tensor(view_as_complex, view_as_complex_1)",
        "view_as_real = torch.ops.aten.view_as_real.default(mul)",
        "return pytree.tree_unflatten((view_as_real,), self._out_spec)",
    ]
    lines = graphs.lowered_aten_lines(lower(program, strategy="rewrite"))
    assert lines[-1].startswith("return")
    assert all("complex" not in line for line in lines)
    assert sum("aten.mul.Tensor" in line for line in lines) == 4  # (ar*br - ai*bi, ar*bi + ai*br)


@pytest.mark.parametrize("name", ["complex_rope", "rope_attention", "llama4", "llama4_moe"])
def test_both_tetrt_strategies_leave_no_complex_node_and_match_eager(name: str) -> None:
    model = zoo.build_model(name)
    program, args, kwargs = zoo.export_model(name, model=model)
    with torch.no_grad():
        reference = model(*args, **kwargs)
    strategies = [graphs.tetrt_strategy(s) for s in ("rewrite", "retrace")]
    for report in graphs.compare_strategies(program, args, kwargs, strategies, reference=reference):
        assert report.complex_valued == 0 and report.left_behind == ()
        assert report.max_abs_error < 1e-5, report.strategy
        assert "aten.view_as_complex.default" not in graphs.op_histogram(report.graph)
