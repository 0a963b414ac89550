"""ONNX Runtime, the CPU stand-in for TensorRT, has no complex dtypes: the real errors."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tests.models import rope
from tetrt_support.compiler.engines import get_engine
from tetrt_support.compiler.engines.onnxruntime import export_block_to_onnx
from tetrt_support.optional import available



def test_exporting_a_complexrope_block_fails():
    x, freqs = torch.randn(1, 4, 2, 8), torch.randn(4, 4)
    block = make_fx(rope)(x, freqs)
    # torchlib has complex translations for a handful of ops only; broadcasting the
    # complex freqs (aten.unsqueeze on a complex value) is not one of them.
    with pytest.raises(torch.onnx.OnnxExporterError) as raised:
        export_block_to_onnx(block, [x, freqs])
    assert type(raised.value).__name__ == "ConversionError"
    message = str(raised.value)
    assert "No ONNX function found for <OpOverload(op='aten.unsqueeze', overload='default')>" in message
    assert "No decompositions registered for the complex-valued input" in message


def test_a_complex_input_tensor_cannot_reach_onnxruntime():
    x = torch.randn(3, 2)
    block = make_fx(lambda x: x * 2)(x)
    module = get_engine("onnxruntime").build(block, [x])
    with pytest.raises(TypeError, match="onnxruntime engine: input 0 has dtype torch.complex64"):
        module(torch.randn(3, 2, dtype=torch.complex64))


def test_a_bare_complex_multiply_does_export():
    """The exporter is not complex-blind: it carries complex values as [..., 2] pairs for a
    few ops (view_as_complex, mul, view_as_real). supports() still refuses them: the engine
    stands for TensorRT, which has no such translation, and a RoPE graph fails anyway."""
    a, b = torch.randn(3, 4, 2), torch.randn(3, 4, 2)

    def cmul(a, b):
        return torch.view_as_real(torch.view_as_complex(a) * torch.view_as_complex(b))

    block = make_fx(cmul)(a, b)
    module = get_engine("onnxruntime").build(block, [a, b])
    torch.testing.assert_close(module(a, b), cmul(a, b))
    assert not any(get_engine("onnxruntime").supports(n) for n in block.graph.nodes if n.op == "call_function")


@pytest.mark.skipif(available("torch_tensorrt"), reason="torch_tensorrt imports here: the error path cannot be shown")
def test_tensorrt_says_clearly_it_is_unavailable():
    x = torch.randn(2, 3)
    block = make_fx(lambda x: x + 1)(x)
    with pytest.raises(RuntimeError, match="torch_tensorrt is not installed/importable here: "):
        get_engine("tensorrt").build(block, [x])


def test_tensorrt_refuses_complex_nodes():
    x, freqs = torch.randn(1, 4, 2, 8), torch.randn(4, 4)
    block = make_fx(rope)(x, freqs)
    verdict = {n.name: get_engine("tensorrt").supports(n) for n in block.graph.nodes if n.op == "call_function"}
    assert not verdict["polar"] and not verdict["view_as_complex"] and not verdict["mul"]
    assert verdict["ones_like"]
