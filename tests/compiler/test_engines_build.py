"""Every engine that runs here (eager, onnxruntime; inductor on two tiny blocks) equals eager
on small real blocks, serves two sizes from one build, and survives pickling."""

from __future__ import annotations

import pickle

import pytest
import torch
from tests.assertions import assert_same_outputs
from tests.compiler.engine_cases import CASE_NAMES, BlockCase, make_block_cases

from tetrt_support.compiler.engines import get_engine

# Inductor compiles are slow on 2 shared cores: two tiny blocks make the point.
INDUCTOR_CASES = ("elementwise", "multi_output")
ENGINE_CASES = [("eager", c) for c in CASE_NAMES] + [("onnxruntime", c) for c in CASE_NAMES]
ENGINE_CASES += [("inductor", c) for c in INDUCTOR_CASES]

_built: dict[tuple[str, str], torch.nn.Module] = {}


@pytest.fixture(scope="module")
def block_cases() -> dict[str, BlockCase]:
    return make_block_cases()


@pytest.fixture
def built(request, block_cases):
    """One build per (engine, case), shared by the tests below: builds are the slow part."""
    engine, case = request.param
    if (engine, case) not in _built:
        c = block_cases[case]
        _built[engine, case] = get_engine(engine).build(c.block, c.inputs, c.dynamic_dims)
    return _built[engine, case], block_cases[case]


@pytest.mark.parametrize("built", ENGINE_CASES, indirect=True, ids=lambda p: "-".join(p))
def test_matches_eager_at_example_size(built):
    module, case = built
    assert_same_outputs(case.fn(*case.inputs), module(*case.inputs), rtol=1e-5)


@pytest.mark.parametrize("built", ENGINE_CASES, indirect=True, ids=lambda p: "-".join(p))
def test_one_build_serves_another_size(built):
    module, case = built
    assert [x.shape for x in case.other_inputs] != [x.shape for x in case.inputs]
    assert_same_outputs(case.fn(*case.other_inputs), module(*case.other_inputs), rtol=1e-5)


@pytest.mark.parametrize("built", ENGINE_CASES, indirect=True, ids=lambda p: "-".join(p))
def test_pickle_round_trip(built):
    module, case = built
    module(*case.inputs)  # a live session / compiled graph must not be what gets pickled
    loaded = pickle.loads(pickle.dumps(module))
    assert_same_outputs(case.fn(*case.other_inputs), loaded(*case.other_inputs), rtol=1e-5)


def test_pickled_onnxruntime_block_recreates_its_session_lazily(block_cases):
    case = block_cases["elementwise"]
    module = _built.get(("onnxruntime", "elementwise")) or get_engine("onnxruntime").build(
        case.block, case.inputs, case.dynamic_dims
    )
    loaded = pickle.loads(pickle.dumps(module))
    assert loaded._session is None and loaded.model_bytes == module.model_bytes
    loaded(*case.inputs)
    assert loaded._session is not None


def test_inductor_compiles_once_for_two_sizes(block_cases):
    case = block_cases["elementwise"]
    module = get_engine("inductor").build(case.block, case.inputs, case.dynamic_dims)
    module(*case.inputs)
    module(*case.other_inputs)
    assert module.compiled_graphs == 1  # the batch dim is symbolic in the one compiled graph
    module(*[x[:, :3] for x in case.other_inputs])  # a static dim changed: another graph
    assert module.compiled_graphs == 2
    loaded = pickle.loads(pickle.dumps(module))
    assert loaded.compiled_graphs == 0  # recompiled on first call, never pickled


def test_inductor_block_takes_an_int_input_of_any_value_with_one_graph():
    """An int input (a size made outside the block) is a symbol, 0 and 1 included: never a
    constant baked into the code (and, with inductor's on-disk caches off, never served a
    graph compiled for another value)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, n):
        return x.sin() * n + 1

    x = torch.randn(3, 2)
    module = get_engine("inductor").build(make_fx(fn, tracing_mode="symbolic")(x, 3), [x, 3])
    for n in (3, 5, 1, 0, 7):
        torch.testing.assert_close(module(x, n), fn(x, n))
    assert module.compiled_graphs == 1


def test_inductor_block_compiles_without_dynamo(block_cases):
    """No nested torch.compile: Dynamo sees no frame, so the block also builds while Dynamo
    compiles another frame (the "tetrt" torch.compile backend, tests/compiler/test_backend.py)."""
    from torch._dynamo.utils import counters

    case = block_cases["elementwise"]
    torch._dynamo.reset()
    counters.clear()
    module = get_engine("inductor").build(case.block, case.inputs, case.dynamic_dims)
    assert_same_outputs(case.fn(*case.inputs), module(*case.inputs), rtol=1e-5)
    assert module.compiled_graphs == 1 and counters["stats"]["unique_graphs"] == 0


def test_built_module_returns_a_single_tensor_when_the_block_does():
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(3, 2)
    block = make_fx(lambda x: x * 2)(x)  # returns a bare tensor, not a tuple
    for engine in ("eager", "onnxruntime"):
        out = get_engine(engine).build(block, [x])(x)
        assert isinstance(out, torch.Tensor)
        torch.testing.assert_close(out, x * 2)
