"""get_engine, supports() per engine, and the errors of bad input."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tests.models import rope
from tetrt_support.compiler.engines import ENGINE_NAMES, Engine, get_engine
from tetrt_support.compiler.engines.onnxruntime import onnx_translatable




@pytest.fixture(scope="module")
def rope_graph():
    x, freqs = torch.randn(1, 4, 2, 8), torch.randn(4, 4)
    return make_fx(rope)(x, freqs), [x, freqs]


def _calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def test_get_engine_names():
    assert ENGINE_NAMES == ("eager", "inductor", "onnxruntime", "tensorrt")
    for name in ENGINE_NAMES:
        engine = get_engine(name)
        assert isinstance(engine, Engine) and engine.name == name


def test_unknown_engine_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown engine 'tvm'; valid engines: eager, inductor, onnxruntime, tensorrt"):
        get_engine("tvm")


def test_eager_and_inductor_take_every_node_complex_included(rope_graph):
    gm, _ = rope_graph
    for name in ("eager", "inductor"):
        assert all(get_engine(name).supports(n) for n in _calls(gm))


def test_onnxruntime_refuses_complex_nodes_and_takes_the_real_ones(rope_graph):
    gm, _ = rope_graph
    ort = get_engine("onnxruntime")
    verdict = {n.name: ort.supports(n) for n in _calls(gm)}
    complex_nodes = {"polar", "view_as_complex", "unsqueeze", "unsqueeze_1", "mul", "view_as_real"}
    assert {n for n, ok in verdict.items() if not ok} == complex_nodes
    assert verdict["ones_like"] and verdict["view"]  # real nodes of the same graph


def test_onnxruntime_support_follows_the_exporters_table():
    aten = torch.ops.aten
    for op in (aten.linear.default, aten.scaled_dot_product_attention.default, aten.slice.Tensor, aten.silu.default):
        assert onnx_translatable(op), op
    # Expanded (CompositeImplicitAutograd) or erased (assertions) by the exporter; both in Llama 4.
    for op in (aten.to.dtype, aten.to.dtype_layout, aten._assert_tensor_metadata.default):
        assert onnx_translatable(op), op
    # No torchlib function and no decomposition: the exporter cannot translate these.
    for op in (aten._linalg_eigh.default, aten.linalg_eig.default):
        assert not onnx_translatable(op), op


def test_tensor_and_int_inputs_only():
    x = torch.randn(2, 3)
    block = make_fx(lambda x: x + 1)(x)
    for name in ("eager", "onnxruntime", "inductor"):
        with pytest.raises(TypeError, match=f"{name} engine: block input 1 is a float; engine blocks take tensors and ints"):
            get_engine(name).build(block, [x, 3.0])


def test_dynamic_dim_needs_an_example_of_size_two():
    x = torch.randn(1, 3)
    block = make_fx(lambda x: x + 1, tracing_mode="symbolic")(x)
    with pytest.raises(ValueError, match=r"makes dim 0 \('batch'\) dynamic, but the example input has size 1"):
        get_engine("onnxruntime").build(block, [x], [{0: "batch"}])


def test_dynamic_dims_need_one_entry_per_input():
    x = torch.randn(2, 3)
    block = make_fx(lambda x: x + 1, tracing_mode="symbolic")(x)
    with pytest.raises(ValueError, match="dynamic_dims has 2 entries but the block has 1 inputs"):
        get_engine("onnxruntime").build(block, [x], [{0: "b"}, {0: "b"}])


def test_dynamic_dims_keep_the_bounds_the_block_recorded():
    from torch._dynamo.exc import UserError

    from tetrt_support.compiler.engines.base import dynamic_shapes_for_export

    class Table(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("rows", torch.randn(16, 4))

        def forward(self, x):
            return x + self.rows[: x.shape[1]]

    table, x = Table(), torch.randn(2, 5, 4)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=16)}
    # The flat graph of the program: (lifted buffer, x) in, like a block cut from it.
    block = torch.export.export(table, (x,), dynamic_shapes=(dims,)).graph_module
    inputs, names = [table.rows, x], [{}, {0: "b", 1: "s"}]
    shapes = dynamic_shapes_for_export(inputs, names, block)
    assert shapes[0] is None
    assert shapes[1][1].__name__ == "s" and shapes[1][1].max == 16  # the program's range
    assert shapes[1][0].max > 2**30  # no recorded bound: unbounded
    with pytest.raises(UserError, match=r"Not all values of s .* satisfy the generated guard"):
        torch.export.export(block, tuple(inputs), dynamic_shapes=dynamic_shapes_for_export(inputs, names))
    module = get_engine("onnxruntime").build(block, inputs, names)
    longer = torch.randn(3, 9, 4)
    torch.testing.assert_close(module(table.rows, longer)[0], table(longer))


def test_the_engine_exports_what_torch_onnx_export_writes_with_one_registry() -> None:
    """The engine hands the exporter a registry it built once: the ONNX bytes are those
    ``torch.onnx.export(..., dynamo=True)`` writes for the same program, and a second export
    builds no registry."""
    from tetrt_support.compiler.engines import onnxruntime as engine

    class Block(torch.nn.Module):
        def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return torch.atan2(y, x).softmax(-1) * 2  # atan2: the engine's exact decomposition runs too

    block = torch.fx.symbolic_trace(Block())
    inputs = [torch.randn(3, 5), torch.randn(3, 5)]
    ours = engine.export_block_to_onnx(block, inputs)
    built = engine._registry.cache_info().currsize
    assert engine.export_block_to_onnx(block, inputs) == ours
    assert engine._registry.cache_info().currsize == built
    program = torch.export.export(block, tuple(inputs), strict=False)
    program = program.run_decompositions({torch.ops.aten.atan2.default: engine.EXACT_DECOMPOSITIONS[
        torch.ops.aten.atan2.default]})
    public = torch.onnx.export(program, dynamo=True, input_names=["input_0", "input_1"], optimize=True, verbose=False)
    assert public.model_proto.SerializeToString() == ours
