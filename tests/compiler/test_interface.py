"""``tetrt_support.compile`` takes Torch-TensorRT's calls: a module with example inputs or
an ExportedProgram, and its options, each changing the block structure as in
Torch-TensorRT; wrong option names and values raise naming them and the valid choices."""

from __future__ import annotations

import copy
import functools
import operator
import warnings

import pytest
import torch

import tetrt_support
from tests.assertions import assert_same_outputs
from tetrt_support import zoo
from tetrt_support.compiler.configured_engine import (
    BlockBuildError,
    Float64AsFloat32,
    FullCompilationError,
    WeightsAsInputs,
)
from tetrt_support.compiler.settings import MIN_BLOCK_SIZE


class IslandBetween(torch.nn.Module):
    """A small real region, a complex cumsum (no complex rule: PyTorch), a larger real region."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = torch.relu(x) * 2
        z = torch.view_as_complex(small.reshape(x.shape[0], 4, 2))
        island = torch.cumsum(z, dim=1)
        r = torch.view_as_real(island).reshape(x.shape[0], 8)
        return torch.tanh(self.proj(r) + 1).sin() * 3 - 1


class AllReal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)) * 2 + 1).relu()


def _x(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _structure(module) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(b.name, b.kind, b.ops) for b in module.blocks()]


def _compute_ops(ops: tuple[str, ...]) -> int:
    return sum(op != str(operator.getitem) for op in ops)


@functools.cache
def _island_blocks(min_block_size: int) -> list:
    model = IslandBetween().eval()
    return tetrt_support.compile(model, arg_inputs=(_x(),), min_block_size=min_block_size).blocks()


# --------------------------------------------------------------------------- model or program
def test_module_with_example_inputs_gives_the_blocks_of_its_exported_program() -> None:
    model = zoo.build_model("rope_attention").eval()
    args, kwargs = zoo.example_inputs("rope_attention", model)
    program = torch.export.export(model, args, kwargs, strict=False)
    from_program = tetrt_support.compile(program, min_block_size=1)
    from_module = tetrt_support.compile(model, arg_inputs=args, kwarg_inputs=kwargs, min_block_size=1)
    assert _structure(from_module) == _structure(from_program)
    assert from_module.blocks_summary() == "1 engine block, 0 fallback blocks"
    assert_same_outputs(model(*args, **kwargs), from_module(*args, **kwargs))
    assert_same_outputs(from_program(*args, **kwargs), from_module(*args, **kwargs), atol=0, rtol=0)


def test_module_with_dynamic_shapes_stays_dynamic() -> None:
    model = zoo.build_model("complex_rope").eval()
    args, _ = zoo.example_inputs("complex_rope", model, batch=2, seq=8)
    batch, seq = torch.export.Dim("batch", max=16), torch.export.Dim("seq", max=64)
    shapes = ({0: batch, 1: seq}, {0: batch, 1: seq})
    module = tetrt_support.compile(model, arg_inputs=args, dynamic_shapes=shapes)
    other, _ = zoo.example_inputs("complex_rope", model, batch=3, seq=5, seed=1)
    assert_same_outputs(model(*other), module(*other))


def test_inputs_is_an_alias_of_arg_inputs_and_not_both() -> None:
    model = AllReal().eval()
    via_alias = tetrt_support.compile(model, inputs=(_x(),), backend="eager")
    assert_same_outputs(model(_x(1)), via_alias(_x(1)))
    with pytest.raises(TypeError, match="arg_inputs or its alias inputs, not both"):
        tetrt_support.compile(model, inputs=(_x(),), arg_inputs=(_x(),))


def test_module_without_example_inputs_or_program_with_inputs_raises() -> None:
    model = AllReal()
    with pytest.raises(TypeError, match=r"without example inputs; pass arg_inputs=\(\.\.\.\)"):
        tetrt_support.compile(model)
    program = torch.export.export(model, (_x(),))
    # Torch-TensorRT's compile(ep, inputs=...): inputs that agree with the program's are accepted
    for spelling in ({"inputs": [_x(1)]}, {"arg_inputs": (_x(1),)}, {"arg_inputs": (_x(1),), "kwarg_inputs": {}}):
        compiled = tetrt_support.compile(program, backend="eager", **spelling)
        assert_same_outputs(model(_x(2)), compiled(_x(2)))
    with pytest.raises(TypeError, match=r"input \[0\]\[0\] is torch.float64 .* but the program was exported with"):
        tetrt_support.compile(program, arg_inputs=(_x().double(),))
    with pytest.raises(TypeError, match="do not have the program's structure"):
        tetrt_support.compile(program, arg_inputs=(_x(), _x()))
    with pytest.raises(TypeError, match="got an ExportedProgram and dynamic_shapes"):
        tetrt_support.compile(program, dynamic_shapes=({0: torch.export.Dim("b")},))
    with pytest.raises(TypeError, match="takes a torch.nn.Module .* or a torch.export.ExportedProgram, got function"):
        tetrt_support.compile(lambda x: x)


def test_the_default_backend_is_onnxruntime() -> None:
    model = AllReal().eval()
    module = tetrt_support.compile(model, arg_inputs=(_x(),))
    assert module.meta["tetrt_backend"] == "onnxruntime"
    assert [b.runner for b in module.blocks()] == ["OnnxRuntimeBlock"]
    assert isinstance(module.get_submodule("engine_0"), WeightsAsInputs)  # its weights fed as inputs: refittable


# --------------------------------------------------------------------------- min_block_size
def test_min_block_size_sends_small_engine_blocks_to_pytorch() -> None:
    every = _island_blocks(1)
    assert [b.kind for b in every] == ["engine", "fallback", "engine"]
    small, large = _compute_ops(every[0].ops), _compute_ops(every[2].ops)
    assert small < large
    # a threshold between the two: the small block's ops join the fallback block after it
    between = _island_blocks(small + 1)
    assert [b.kind for b in between] == ["fallback", "engine"]
    assert between[0].ops == every[0].ops + every[1].ops and between[1].ops == every[2].ops
    # above both: nothing is worth an engine
    assert [b.kind for b in _island_blocks(large + 1)] == ["fallback"]
    model = IslandBetween().eval()
    compiled = tetrt_support.compile(model, arg_inputs=(_x(),), min_block_size=small + 1)
    assert_same_outputs(model(_x(2)), compiled(_x(2)))


def test_min_block_size_defaults_to_torch_tensorrts_five() -> None:
    assert MIN_BLOCK_SIZE == 5
    every = _island_blocks(1)
    assert _compute_ops(every[0].ops) < 5 <= _compute_ops(every[2].ops)
    default = tetrt_support.compile(IslandBetween().eval(), arg_inputs=(_x(),))
    assert [b.kind for b in default.blocks()] == ["fallback", "engine"]


# --------------------------------------------------------------------------- torch_executed_ops
@pytest.mark.parametrize("spelling", ["torch.ops.aten.tanh.default", "aten::tanh.default", "aten.tanh", torch.ops.aten.tanh.default, torch.ops.aten.tanh])
def test_torch_executed_ops_splits_an_engine_block(spelling) -> None:
    model = AllReal().eval()
    module = tetrt_support.compile(model, arg_inputs=(_x(),), torch_executed_ops={spelling}, min_block_size=1)
    assert [b.kind for b in module.blocks()] == ["engine", "fallback", "engine"]
    assert module.blocks()[1].ops == ("aten.tanh.default",)
    assert not any("tanh" in op for b in module.blocks() if b.kind == "engine" for op in b.ops)
    assert_same_outputs(model(_x(1)), module(_x(1)))


def test_torch_executed_ops_rejects_unknown_names_and_single_ops() -> None:
    with pytest.raises(ValueError, match=r"'torch.ops.aten.tanhh.default' names no op; spell it as Torch-TensorRT does"):
        tetrt_support.compile(AllReal(), arg_inputs=(_x(),), torch_executed_ops={"torch.ops.aten.tanhh.default"})
    with pytest.raises(TypeError, match=r"takes a collection of ops, got the single op 'aten.tanh'; write \{'aten.tanh'\}"):
        tetrt_support.compile(AllReal(), arg_inputs=(_x(),), torch_executed_ops="aten.tanh")


# --------------------------------------------------------------------------- require_full_compilation
def test_require_full_compilation_names_the_ops_left_to_pytorch_and_their_lines() -> None:
    with pytest.raises(FullCompilationError) as info:
        tetrt_support.compile(IslandBetween(), arg_inputs=(_x(),), require_full_compilation=True)
    message = str(info.value)
    assert "require_full_compilation=True, but" in message and "outside the onnxruntime engine" in message
    assert "torch.ops.aten.cumsum.default in fallback_0" in message
    assert "test_interface.py" in message and "island = torch.cumsum(z, dim=1)" in message


def test_require_full_compilation_keeps_a_small_fully_supported_model_in_one_engine() -> None:
    # as in Torch-TensorRT, min_block_size is disregarded when everything is supported
    model = AllReal().eval()
    module = tetrt_support.compile(model, arg_inputs=(_x(),), require_full_compilation=True, min_block_size=50)
    assert module.blocks_summary() == "1 engine block, 0 fallback blocks"
    assert tetrt_support.compile(model, arg_inputs=(_x(),), min_block_size=50).blocks_summary() == (
        "0 engine blocks, 1 fallback block"
    )


def test_require_full_compilation_and_torch_executed_ops_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="torch_executed_ops forces torch.ops.aten.tanh.default there"):
        tetrt_support.compile(
            AllReal(), arg_inputs=(_x(),), require_full_compilation=True, torch_executed_ops={"aten.tanh.default"}
        )


# --------------------------------------------------------------------------- pass_through_build_failures
def _bf16_model_and_input() -> tuple[torch.nn.Module, torch.Tensor]:
    # ONNX Runtime's CPU provider has no bfloat16 Gemm: a real build failure at session creation
    return AllReal().to(torch.bfloat16).eval(), _x(dtype=torch.bfloat16)


def test_a_block_that_fails_to_build_runs_in_pytorch_with_a_warning() -> None:
    model, x = _bf16_model_and_input()
    with pytest.warns(UserWarning, match=r"the onnxruntime engine failed to build engine block engine_0 \(\d+ ops\) "
                      r"\(NotImplemented: .*Could not find an implementation for Gemm.*\); it runs in PyTorch as fallback_engine_0"):
        module = tetrt_support.compile(model, arg_inputs=(x,), min_block_size=1)
    assert [(b.name, b.kind, b.runner) for b in module.blocks()] == [("fallback_engine_0", "fallback", "GraphModule")]
    assert torch.equal(module(x), model(x))


def test_pass_through_build_failures_raises_naming_the_block() -> None:
    model, x = _bf16_model_and_input()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning on this path
        with pytest.raises(BlockBuildError, match=r"the onnxruntime engine failed to build engine block engine_0 .*Gemm") as info:
            tetrt_support.compile(model, arg_inputs=(x,), min_block_size=1, pass_through_build_failures=True)
    assert info.value.__cause__ is not None  # the engine's own error, chained


# --------------------------------------------------------------------------- truncate_double
def test_truncate_double_runs_float64_engine_inputs_as_float32() -> None:
    model = AllReal().double().eval()
    x = _x(dtype=torch.float64)
    wide = tetrt_support.compile(model, arg_inputs=(x,), min_block_size=1)
    narrow = tetrt_support.compile(model, arg_inputs=(x,), min_block_size=1, truncate_double=True)
    assert isinstance(wide.get_submodule("engine_0"), WeightsAsInputs)
    engine = narrow.get_submodule("engine_0")
    assert isinstance(engine, Float64AsFloat32) and isinstance(engine.engine_block, WeightsAsInputs)
    assert {w.dtype for w in engine.engine_block.weight_values()} == {torch.float32}  # weights truncated too
    x1 = _x(1, torch.float64)
    out_wide, out_narrow, ref = wide(x1), narrow(x1), model(x1)
    assert out_wide.dtype == out_narrow.dtype == torch.float64  # outputs cast back, as Torch-TensorRT does
    assert (out_wide - ref).abs().max() < 1e-12  # float64 all the way
    float32_ref = copy.deepcopy(model).float()(x1.float()).double()
    assert (out_narrow - float32_ref).abs().max() < 1e-6  # what float32 arithmetic gives
    assert (out_narrow - ref).abs().max() > 1e-12  # and visibly not float64


# --------------------------------------------------------------------------- option errors
@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"backend": "trt"}, ValueError, "unknown backend 'trt'; valid: eager, inductor, onnxruntime, tensorrt"),
        ({"strategy": "legacy"}, ValueError, "unknown strategy 'legacy'; valid: rewrite, retrace"),
        ({"min_block_size": 0}, ValueError, "min_block_size must be an int >= 1, got 0"),
        ({"min_block_size": True}, ValueError, "min_block_size must be an int >= 1, got True"),
        ({"min_block_size": "5"}, ValueError, "min_block_size must be an int >= 1, got '5'"),
        ({"truncate_double": 1}, TypeError, "truncate_double must be True or False, got 1"),
        ({"require_full_compilation": "yes"}, TypeError, "require_full_compilation must be True or False, got 'yes'"),
        ({"min_blok_size": 3}, TypeError, "unknown compile option 'min_blok_size' \\(did you mean 'min_block_size'\\?\\); valid options: backend, strategy, min_block_size"),
        ({"enabled_precisions": {torch.float16}}, TypeError, "unknown compile option 'enabled_precisions'; valid options:"),
    ],
)
def test_wrong_options_raise_naming_them_and_the_valid_choices(options, error, message) -> None:
    with pytest.raises(error, match=message):
        tetrt_support.compile(AllReal(), arg_inputs=(_x(),), **options)


def test_ir_is_torch_tensorrts_dynamo_path() -> None:
    program = torch.export.export(AllReal(), (_x(),))
    assert tetrt_support.compile(program, ir="dynamo", backend="eager").blocks_summary()
    with pytest.raises(ValueError, match=r"ir='torch_compile'.*torch.compile\(model, backend='tetrt'"):
        tetrt_support.compile(program, ir="torch_compile")
    with pytest.raises(ValueError, match="unknown ir 'ts'"):
        tetrt_support.compile(program, ir="ts")
