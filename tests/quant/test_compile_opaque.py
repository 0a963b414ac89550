"""torch.compile(fullgraph=True) of custom ops that take a quantizer as an opaque value argument."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from tetrt_support.quant import (
    VALUE_QUANTIZERS,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    Quantizer,
    is_value_opaque_quantizer,
    register_value_quantizer,
)
from tetrt_support.quant.distributed import single_process_group
from tetrt_support.quant.dynamo import qdq_op


QDQ_OPS = {cls: qdq_op(cls) for cls in VALUE_QUANTIZERS}


@torch.compiler.disable
def _eager_qdq(x: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
    return quantizer.quantize(x).dequantize()


def make_model(cls: type[Quantizer]):
    """A tiny model around the quantizer: the custom op if ``cls`` is registered, else eager code.

    The op is picked here, outside the compiled region, by class: inside it, torch 2.11
    sees ``type(quantizer)`` as FakeScriptObject.
    """
    op = QDQ_OPS.get(cls)

    def model(x: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
        if is_value_opaque_quantizer(quantizer):  # folds to a constant in the graph
            y = op(x * 2.0, quantizer)
        else:
            y = _eager_qdq(x * 2.0, quantizer)
        return torch.relu(y) + 1.0

    return model


CASES = {
    Float8CurrentScalingQuantizer: (Float8CurrentScalingQuantizer(), Float8CurrentScalingQuantizer(torch.float8_e5m2)),
    Float8BlockQuantizer: (Float8BlockQuantizer(), Float8BlockQuantizer(force_pow_2_scales=False)),
    MXFP8Quantizer: (MXFP8Quantizer(columnwise_usage=False), MXFP8Quantizer()),
    NVFP4Quantizer: (NVFP4Quantizer(with_rht=True, with_post_rht_amax=True), NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=0x0F0F)),
}
# NVFP4's cases use the Hadamard transform, which takes bf16 input only (TE's kernels' rule).
INPUT_DTYPE = {NVFP4Quantizer: torch.bfloat16}
BACKEND_CASES = [(cls, backend) for cls in VALUE_QUANTIZERS for backend in ("eager", "aot_eager")] + [
    (MXFP8Quantizer, "inductor"),
    (NVFP4Quantizer, "inductor"),
]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("cls, backend", BACKEND_CASES, ids=lambda v: getattr(v, "__name__", v))
def test_equal_quantizers_share_a_graph_and_a_new_value_recompiles_once(cls, backend: str) -> None:
    first, different = CASES[cls]
    counter = CompileCounter() if backend == "eager" else None
    model = make_model(cls)
    compiled = torch.compile(model, backend=counter or backend, fullgraph=True)
    x = torch.randn(32, 64, dtype=INPUT_DTYPE.get(cls, torch.float32))
    for q in (first, first.copy(), type(first)(**dict(first._value_key()[1]))):
        torch.testing.assert_close(compiled(x, q), model(x, q), rtol=0, atol=0)
    for q in (different, different.copy()):
        torch.testing.assert_close(compiled(x, q), model(x, q), rtol=0, atol=0)
    frames = counter.frame_count if counter else counters["stats"]["unique_graphs"]
    assert frames == 2, f"{backend}: expected one graph per quantizer value, got {frames}"


def test_graph_code_rebuilds_the_quantizer_from_its_value() -> None:
    codes: list[str] = []

    def capture(gm: torch.fx.GraphModule, example_inputs):
        codes.append(gm.code)
        return gm

    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)
    torch.compile(make_model(NVFP4Quantizer), backend=capture, fullgraph=True)(torch.randn(16, 32, dtype=torch.bfloat16), q)
    (code,) = codes
    assert "tetrt_rebuild_quantizer(tetrt_q_tetrt_support_quant_nvfp4_tensor_NVFP4Quantizer" in code
    assert f"('rht_sign_mask', {q.rht_sign_mask})" in code and "rht_matrix" not in code


def test_unregistered_quantizer_runs_through_the_eager_fallback() -> None:
    q = Float8Quantizer()  # identity semantics: never registered
    model = make_model(Float8Quantizer)
    compiled = torch.compile(model, backend="eager")  # the fallback is a graph break
    x = torch.randn(8, 16)
    expected = model(x, q.copy())
    torch.testing.assert_close(compiled(x, q), expected, rtol=0, atol=0)
    assert sum(counters["graph_break"].values()) >= 1
    torch._dynamo.reset()  # else the cached non-fullgraph code would answer the next call
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(model, backend="eager", fullgraph=True)(x, q)


def test_is_value_opaque_quantizer_folds_to_a_constant_in_the_graph() -> None:
    def flag(x: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
        return x + 1 if is_value_opaque_quantizer(quantizer) else x - 1

    x = torch.zeros(2)
    assert torch.compile(flag, backend="eager", fullgraph=True)(x, MXFP8Quantizer()).tolist() == [1.0, 1.0]


def test_held_process_group_raises_type_error_under_compile() -> None:
    with single_process_group() as group:
        q = Float8CurrentScalingQuantizer(amax_reduction_group=group)
        # Dynamo hashes the op's arguments while tracing (fake-tensor cache): the TypeError
        # surfaces there, wrapped as a TorchRuntimeError that quotes it.
        with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match="got TypeError.*holds a torch.distributed.ProcessGroup"):
            torch.compile(make_model(Float8CurrentScalingQuantizer), backend="eager", fullgraph=True)(torch.randn(4, 16), q)


class _StaticMethodQuantizer(MXFP8Quantizer):
    """The hazard: a @staticmethod reached through the instance."""

    @staticmethod
    def block_size() -> int:
        return 32

    def blocks_via_instance(self, k: int) -> int:
        return k // self.block_size()

    def blocks_via_class(self, k: int) -> int:
        return k // _StaticMethodQuantizer.block_size()


register_value_quantizer(_StaticMethodQuantizer)


@pytest.fixture
def _quiet_guard_errors():
    logger = logging.getLogger("torch._guards")  # logs the guard failure before raising it
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
    reason="torch < 2.13 refuses reading an unregistered method of an opaque object before any guard is built "
    "(measured on 2.11: 'Attempted to access unregistered member on an OpaqueObject')",
)
def test_staticmethod_through_instance_breaks_guards_and_class_call_works(_quiet_guard_errors) -> None:
    q = _StaticMethodQuantizer()

    def via_instance(x: torch.Tensor, quantizer: _StaticMethodQuantizer) -> torch.Tensor:
        return x * quantizer.blocks_via_instance(x.shape[-1])

    def via_class(x: torch.Tensor, quantizer: _StaticMethodQuantizer) -> torch.Tensor:
        return x * quantizer.blocks_via_class(x.shape[-1])

    x = torch.ones(64)
    # Still present in torch 2.14.1: Dynamo guards on ``q.block_size.__func__``, a plain function.
    with pytest.raises(Exception, match="'function' object has no attribute '__func__'"):
        torch.compile(via_instance, backend="eager", fullgraph=True)(x, q)
    torch._dynamo.reset()
    assert torch.compile(via_class, backend="eager", fullgraph=True)(x, q).tolist() == [2.0] * 64
