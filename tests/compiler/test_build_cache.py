"""The ONNX Runtime engine exports a block once per process: an equal block reuses the bytes,
anything the export reads that differs (graph, held tensors, input metadata, dynamic dims and
their bounds) builds again, and a failed build stores nothing."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tetrt_support
from tetrt_support.compiler.engines import get_engine
from tetrt_support.compiler.engines.build_cache import BuildCache, block_key
from tetrt_support.compiler.engines.onnxruntime import EXPORTED, exported_block_key


class _Scaled(torch.nn.Module):
    def __init__(self, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.scale) + 1


def _block(scale: float = 2.0) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(_Scaled(torch.full((4,), scale)))


@pytest.fixture
def empty_cache():
    EXPORTED.clear()
    yield EXPORTED
    EXPORTED.clear()


def test_an_equal_block_reuses_the_exported_bytes_and_computes_its_own_inputs(empty_cache: BuildCache) -> None:
    engine = get_engine("onnxruntime")
    x = torch.randn(3, 4)
    first = engine.build(_block(), [x])
    again = engine.build(copy.deepcopy(_block()), [x])
    info = empty_cache.info()
    assert (info.misses, info.hits, info.entries) == (1, 1, 1)
    assert again.model_bytes is first.model_bytes
    other = torch.randn(3, 4)
    torch.testing.assert_close(again(other), torch.tanh(other * 2) + 1)


def test_what_the_export_reads_is_in_the_key() -> None:
    x = torch.randn(3, 4)
    base = exported_block_key(_block(), [x])
    assert base is not None and exported_block_key(_block(), [x.clone()]) == base  # values are not read
    assert exported_block_key(_block(3.0), [x]) != base  # a held tensor's value
    assert exported_block_key(_block(), [x.double()]) != base  # dtype
    assert exported_block_key(_block(), [torch.randn(5, 4)]) != base  # shape
    assert exported_block_key(_block(), [x.t().contiguous().t()]) != base  # strides
    assert exported_block_key(_block(), [x], [{0: "batch"}]) != base  # a dynamic dim
    traced = _block()
    traced.graph.find_nodes(op="call_function", target=torch.tanh)[0].target = torch.sigmoid
    traced.recompile()
    assert exported_block_key(traced, [x]) != base  # the graph


def test_a_dynamic_dims_bounds_are_in_the_key() -> None:
    """A derived dim's repr (``4*s + 1``) hides its root's bounds; the key keeps them."""
    from torch.export import Dim

    block, x = _block(), torch.randn(3, 4)
    keys = {
        block_key(block, [x], ({0: Dim("s", min=2, max=high) * 4 + 1},))
        for high in (16, 32)
    }
    assert len(keys) == 2


def test_the_trace_mode_and_a_grad_input_are_in_the_key() -> None:
    x = torch.randn(3, 4)
    base = exported_block_key(_block(), [x])
    assert exported_block_key(_block(), [x.requires_grad_()]) != base
    with torch.no_grad():
        assert exported_block_key(_block(), [x.detach()]) != base
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert exported_block_key(_block(), [x.detach()]) != base
    finally:
        torch.set_default_dtype(default)


def _scaled_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 2


def test_a_block_holding_something_else_than_tensors_and_graphs_is_not_stored() -> None:
    block = _block()
    block.add_submodule("plain", torch.nn.Linear(4, 4))  # not a graph: its forward is not in the key
    assert exported_block_key(block, [torch.randn(3, 4)]) is None
    calling = _block()  # a Python function reads as its __name__ alone in the generated code
    node = calling.graph.find_nodes(op="call_function", target=torch.tanh)[0]
    node.target = _scaled_tanh
    calling.recompile()
    assert exported_block_key(calling, [torch.randn(3, 4)]) is None
    aten = make_fx(lambda x: torch.tanh(x) + 1)(torch.randn(3, 4))  # ATen ops and operator.* are named
    assert exported_block_key(aten, [torch.randn(3, 4)]) is not None
    cache = BuildCache(max_bytes=100)
    assert cache.get_or_build(None, lambda: b"abc") == b"abc"
    assert cache.info().entries == 0


def test_a_failed_build_stores_nothing_and_the_oldest_entries_go_past_the_limit() -> None:
    cache = BuildCache(max_bytes=10)

    def fail() -> bytes:
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        cache.get_or_build("a", fail)
    assert cache.info().entries == 0
    cache.get_or_build("a", lambda: b"123456")
    cache.get_or_build("b", lambda: b"1234")
    assert cache.get_or_build("a", fail) == b"123456"  # a hit, and now the newest
    cache.get_or_build("c", lambda: b"12")
    assert cache.get_or_build("a", fail) == b"123456" and cache.info().entries == 2  # b went
    assert cache.get_or_build("d", lambda: b"x" * 11) == b"x" * 11 and cache.info().entries == 2  # too big to keep


def test_compiling_a_model_again_exports_nothing(empty_cache: BuildCache) -> None:
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            z = torch.view_as_complex(self.proj(x).reshape(*x.shape[:-1], 4, 2))
            return {"out": torch.view_as_real(z * z).flatten(-2)}

    model = Model()
    x = torch.randn(2, 8)
    program = torch.export.export(model, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = tetrt_support.compile(program, backend="onnxruntime")
        misses = empty_cache.info().misses
        second = tetrt_support.compile(program, backend="onnxruntime")
    assert misses >= 1 and empty_cache.info().misses == misses and empty_cache.info().hits == misses
    with torch.no_grad():
        model.proj.weight.mul_(-1)  # weights are engine inputs: the reused bytes follow them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        third = tetrt_support.compile(torch.export.export(model, (x,)), backend="onnxruntime")
    with torch.no_grad():
        torch.testing.assert_close(third(x)["out"], model(x)["out"])
        torch.testing.assert_close(second(x)["out"], first(x)["out"])
    assert empty_cache.info().misses == misses  # other weights, the same exported model
