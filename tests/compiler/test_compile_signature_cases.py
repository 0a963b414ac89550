"""The signature cases where Torch-TensorRT's complex support went wrong, on the shipped compiler.

Each model is small and exported once; compiled modules are shared within the module.
"""

from __future__ import annotations

import functools

import pytest
import torch

import tetrt_support
from tests.assertions import assert_same_outputs
from tests.models import DC, NT, CumsumBetween, Eig, Eigvals, OutputModel, register_case_dataclass

register_case_dataclass()  # Interior("dataclass") returns a DC


class Interior(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        z = torch.view_as_real(torch.view_as_complex(x) * torch.view_as_complex(y))
        return {"tensor": lambda: z, "namedtuple": lambda: NT(z, z * 2), "dataclass": lambda: DC(z, z * 2)}[self.kind]()


def _pairs(seed: int = 0, batch: int = 2, seq: int = 3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, 4, 2, generator=g), torch.randn(batch, seq, 4, 2, generator=g)


@functools.cache
def _compiled(name: str, strategy: str, backend: str = "onnxruntime"):
    model, args = {
        "eig": (Eig(), (torch.randn(4, 4, generator=torch.Generator().manual_seed(0)),)),
        "eigvals": (Eigvals(), (torch.randn(4, 4, generator=torch.Generator().manual_seed(0)),)),
        "cumsum": (CumsumBetween(), _pairs()),
        "interior-tensor": (Interior("tensor"), _pairs()),
        "interior-namedtuple": (Interior("namedtuple"), _pairs()),
        "interior-dataclass": (Interior("dataclass"), _pairs()),
    }[name]
    ep = torch.export.export(model, args, strict=False)
    # min_block_size=1: these tiny models are about where the blocks fall, so every
    # engine-capable op stays in an engine (Torch-TensorRT's default of 5 would fold them)
    return model, tetrt_support.compile(ep, backend=backend, strategy=strategy, min_block_size=1)


@pytest.mark.parametrize("strategy", ["rewrite", "retrace"])
@pytest.mark.parametrize("kind", ["tensor", "namedtuple", "dataclass"])
def test_interior_complex_region_keeps_its_output_structure(kind: str, strategy: str) -> None:
    model, module = _compiled(f"interior-{kind}", strategy)
    x, y = _pairs(seed=3)
    for out in (module(x, y), module(x=x, y=y), module(x, y=y)):
        assert_same_outputs(model(x, y), out)
    assert module.blocks_summary() == "1 engine block, 0 fallback blocks"


@pytest.mark.parametrize("strategy", ["rewrite", "retrace"])
def test_eig_outputs_stay_complex_and_are_not_wrapped_twice(strategy: str) -> None:
    model, module = _compiled("eig", strategy)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(5))
    out = module(x=x)
    assert type(out).__name__ == "torch.return_types.linalg_eig" or isinstance(out, tuple)
    assert [t.dtype for t in out] == [torch.complex64, torch.complex64]
    assert_same_outputs(tuple(model(x)), tuple(out), atol=1e-4)
    kinds = [b.kind for b in module.blocks()]
    assert kinds == ["engine", "fallback"], module.blocks()
    assert any("linalg_eig" in op for op in module.blocks()[1].ops)


@pytest.mark.parametrize("strategy", ["rewrite", "retrace"])
def test_single_complex_output_of_a_fallback_block(strategy: str) -> None:
    model, module = _compiled("eigvals", strategy)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(5))
    assert_same_outputs(model(x), module(x), atol=1e-4)


@pytest.mark.parametrize("strategy", ["rewrite", "retrace"])
def test_fallback_op_between_two_engine_blocks(strategy: str) -> None:
    model, module = _compiled("cumsum", strategy)
    x, y = _pairs(seed=4)
    assert_same_outputs(model(x, y), module(x, y=y))
    assert [b.kind for b in module.blocks()] == ["engine", "fallback", "engine"], module.blocks()
    assert module.blocks_summary() == "2 engine blocks, 1 fallback block"
    assert any("cumsum" in op for op in module.blocks()[1].ops)


def test_block_summary_of_a_compiled_module_is_structured() -> None:
    _, module = _compiled("cumsum", "rewrite")
    first = module.blocks()[0]
    assert first.name == "engine_0" and first.runner == "OnnxRuntimeBlock"
    assert any(op.startswith("aten.mul") for op in first.ops)


# ----------------------------------------------------------------------------- bad input

class ComplexIn(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * torch.view_as_complex(y)


@functools.cache
def _complex_in():
    x = torch.randn(2, 3, dtype=torch.complex64)
    y = torch.randn(2, 3, 2)
    ep = torch.export.export(ComplexIn(), (x, y), strict=False)
    return ComplexIn(), tetrt_support.compile(ep, backend="eager"), (x, y)


def test_misspelled_keyword_is_named() -> None:
    model, module, (x, y) = _complex_in()
    with pytest.raises(TypeError, match="unexpected keyword argument 'yy'"):
        module(x, yy=y)
    with pytest.raises(TypeError, match="unexpected keyword argument 'yy'"):
        model(x, yy=y)  # the original module says the same


def test_missing_keyword_is_named() -> None:
    _, module, (x, _) = _complex_in()
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'y'"):
        module(x=x)


def test_extra_keyword_is_named() -> None:
    _, module, (x, y) = _complex_in()
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        module(x, y=y, z=y)
    with pytest.raises(TypeError, match="got multiple values for argument 'x'"):
        module(x, x=x, y=y)


def test_real_tensor_for_a_complex_input_is_named() -> None:
    _, module, (x, y) = _complex_in()
    with pytest.raises(TypeError, match=r"input 'x' must be a complex tensor \(exported as torch.complex64\), "
                       r"but got a real tensor of dtype torch.float32"):
        module(x=torch.view_as_real(x), y=y)


def test_complex_tensor_for_a_real_input_is_named() -> None:
    _, module, (x, y) = _complex_in()
    with pytest.raises(TypeError, match=r"input 'y' must be a real tensor \(exported as torch.float32\), "
                       r"but got a complex tensor of dtype torch.complex64"):
        module(x, torch.view_as_complex(y))


def test_unknown_backend_and_strategy_are_named() -> None:
    ep = torch.export.export(ComplexIn(), _complex_in()[2], strict=False)
    with pytest.raises(ValueError, match="unknown backend 'trt'"):
        tetrt_support.compile(ep, backend="trt")
    with pytest.raises(ValueError, match="unknown strategy 'legacy'"):
        tetrt_support.compile(ep, strategy="legacy")




@pytest.mark.parametrize("strategy", ["rewrite", "retrace"])
def test_dynamic_batch_and_sequence_with_complex_io(strategy: str) -> None:
    model = OutputModel("dict", "both")
    batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=16)
    ep = torch.export.export(
        model, OutputModel.inputs("both", batch=2, seq=3), dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}), strict=False
    )
    module = tetrt_support.compile(ep, backend="onnxruntime", strategy=strategy)
    assert module.blocks_summary() == "1 engine block, 0 fallback blocks"
    for b, s in ((1, 2), (5, 7)):
        x, y = OutputModel.inputs("both", batch=b, seq=s, seed=b)
        assert_same_outputs(model(x, y), module(y=y, x=x))


def test_compile_needs_example_inputs_to_export_a_module() -> None:
    with pytest.raises(TypeError, match=r"got the module ComplexIn without example inputs; pass arg_inputs=\(\.\.\.\)"):
        tetrt_support.compile(ComplexIn())


def test_a_lost_codegen_is_rebuilt_from_the_exported_program() -> None:
    from tetrt_support.complex.codegen import restore_signature
    from tetrt_support.history import retrace

    ep = torch.export.export(Interior("dataclass"), _pairs(), strict=False)
    plain = retrace(ep.module(), list(_pairs()), "swap")
    plain.graph.set_codegen(torch.fx.graph.CodeGen())  # as if a pass had lost it
    plain.recompile()
    x, y = _pairs(seed=7)
    assert type(plain(x=x, y=y)) is tuple  # flat outputs: the dataclass is gone
    restore_signature(ep.module(), plain)  # what the keep_exported_signature pass does
    assert_same_outputs(Interior("dataclass")(x, y), plain(x=x, y=y))


def test_an_input_exported_by_keyword_can_be_passed_by_position() -> None:
    x = torch.randn(2, 3, dtype=torch.complex64)
    y = torch.randn(2, 3, 2)
    ep = torch.export.export(ComplexIn(), (x,), {"y": y}, strict=False)
    module = tetrt_support.compile(ep, backend="eager")
    expected = ComplexIn()(x, y)
    for out in (module(x, y), module(x, y=y), module(x=x, y=y), module(y=y, x=x)):
        assert_same_outputs(expected, out)
    with pytest.raises(ValueError, match="kwarg keyword mismatch"):
        ep.module()(x, y)  # ep.module() itself insists on the exported split
