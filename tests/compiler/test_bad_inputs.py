"""Wrong inputs are refused by name before any engine runs, and leave nothing behind.

Reported: a wrong dtype or shape surfaced as the engine's own error (``input_0 ... Got: 15
Expected: 16``, inductor's "Attempt to trace generator"), ``None`` or a numpy array as
``'NoneType' object has no attribute 'is_complex'``; a batch outside ``Dim("b", max=8)``
was accepted; bad calls used up Dynamo's recompile budget so that a later valid input
failed; a conjugate-view complex input crashed in ``view_as_real``; a meta-device weight
refitted "successfully" and left an in-place module computing garbage.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.export import Dim

import tetrt_support
from tests.assertions import assert_same_outputs
from tests.strategies import examples
from tetrt_support.compiler.input_check import InputTypeError, InputValueError, InvalidInputError
from tetrt_support.compiler.refit import WEIGHTS_KEY, UnusableWeight

BACKENDS = ["onnxruntime", "inductor", "eager"]
EXPECTED_X = r"a torch.float32 tensor of shape \[b, 4\] with b in \[0, 8\]"


class Positions(torch.nn.Module):
    """A Linear over ``x`` plus ``position_ids``: both share the dynamic batch dim ``b``."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.proj = torch.nn.Linear(4, 3)
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(3, 4, generator=g))
            self.proj.bias.copy_(torch.randn(3, generator=g))

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x)) * 2 + position_ids.unsqueeze(-1)


def _inputs(batch: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 4, generator=torch.Generator().manual_seed(seed)), torch.arange(batch)


def _export() -> torch.export.ExportedProgram:
    x, ids = _inputs()
    b = Dim("b", max=8)
    return torch.export.export(
        Positions().eval(), (x,), {"position_ids": ids}, dynamic_shapes={"x": {0: b}, "position_ids": {0: b}}, strict=False
    )


@pytest.fixture(scope="module", params=BACKENDS)
def compiled(request: pytest.FixtureRequest) -> tetrt_support.CompiledModule:
    """One compile per backend for the whole module (not per example)."""
    module = tetrt_support.compile(_export(), backend=request.param, min_block_size=1)
    assert module.blocks_summary() == "1 engine block, 0 fallback blocks"
    return module


def _assert_valid_call_is_right(module: torch.nn.Module, batch: int = 3, seed: int = 1) -> None:
    x, ids = _inputs(batch, seed)
    assert_same_outputs(Positions().eval()(x, position_ids=ids), module(x, position_ids=ids))


# --------------------------------------------------------------------------- 1. named input errors
def test_a_wrong_dtype_names_the_input_what_was_expected_and_what_was_given(compiled) -> None:
    x, ids = _inputs()
    with pytest.raises(InputTypeError, match=rf"input 'x' must be {EXPECTED_X}, but got a torch.float64 tensor of shape \[2, 4\]"):
        compiled(x.double(), position_ids=ids)
    with pytest.raises(InputTypeError, match=r"input 'position_ids' must be a torch.int64 tensor of shape \[b\] with "
                       r"b in \[0, 8\], but got a torch.float32 tensor of shape \[2\]"):
        compiled(x, position_ids=ids.float())
    _assert_valid_call_is_right(compiled)


def test_a_wrong_static_dim_or_rank_names_the_input_and_both_shapes(compiled) -> None:
    x, ids = _inputs()
    with pytest.raises(InputValueError, match=r"input 'x': expected x.shape\[1\] to be equal to 4, but got 5 "
                       r"\(exported shape \[b, 4\], got \[2, 5\]\)"):
        compiled(torch.randn(2, 5), position_ids=ids)
    with pytest.raises(InputValueError, match=r"input 'x' must have 2 dimensions \(exported shape \[b, 4\]\), but got 3: "
                       r"shape \[2, 4, 1\]"):
        compiled(x[..., None], position_ids=ids)
    with pytest.raises(InputValueError, match=r"input 'position_ids': expected position_ids.shape\[0\] to be equal to 2, "
                       r"but got 3 \(b, which x.shape\[0\] set to 2"):
        compiled(x, position_ids=torch.arange(3))


@pytest.mark.parametrize(
    ("value", "given"),
    [
        (None, "None"),
        (2.0, r"a float \(2.0\)"),
        ([1.0, 2.0], "a list"),
        (np.ones((2, 4), np.float32), r"a numpy.ndarray; pass torch.from_numpy\(...\) instead"),
    ],
    ids=["None", "float", "list", "numpy"],
)
def test_a_non_tensor_names_the_input(compiled, value, given: str) -> None:
    _, ids = _inputs()
    with pytest.raises(InputTypeError, match=rf"input 'x' must be {EXPECTED_X}, but got {given}$"):
        compiled(value, position_ids=ids)
    with pytest.raises(InputTypeError, match=r"input 'position_ids' must be a torch.int64 tensor"):
        compiled(torch.randn(2, 4), position_ids=value)


def test_the_errors_are_one_type_and_the_standard_ones() -> None:
    assert issubclass(InputTypeError, InvalidInputError) and issubclass(InputTypeError, TypeError)
    assert issubclass(InputValueError, InvalidInputError) and issubclass(InputValueError, ValueError)


def test_a_meta_tensor_input_is_refused_naming_the_device(compiled) -> None:
    x, ids = _inputs()
    with pytest.raises(InputTypeError, match=r"input 'x' must be on the cpu device, where the module was compiled, "
                       r"but got a tensor on meta"):
        compiled(x.to("meta"), position_ids=ids)


# --------------------------------------------------------------------------- 2. declared ranges
def test_a_dim_above_its_declared_range_is_refused_as_the_exported_program_refuses_it(compiled) -> None:
    x, ids = _inputs(batch=9)
    with pytest.raises(AssertionError, match=r"Guard failed: x.size\(\)\[0\] <= 8"):
        _export().module()(x, position_ids=ids)  # what torch.export says
    with pytest.raises(InputValueError, match=r"input 'x': expected x.shape\[0\] to be <= 8, but got 9 "
                       r"\(b in \[0, 8\]; exported shape \[b, 4\], got \[9, 4\]\)"):
        compiled(x, position_ids=ids)
    x, ids = _inputs(batch=8)  # the bound itself is in range
    assert_same_outputs(Positions().eval()(x, ids), compiled(x, position_ids=ids))


def test_the_declared_range_is_checked_after_a_pickle_round_trip(compiled) -> None:
    buffer = io.BytesIO()
    tetrt_support.save(compiled, buffer, output_format="pickle")
    buffer.seek(0)
    loaded = tetrt_support.load(buffer, trusted=True)
    with pytest.raises(InputValueError, match=r"input 'x': expected x.shape\[0\] to be <= 8, but got 9"):
        loaded(*_inputs(batch=9)[:1], position_ids=torch.arange(9))
    _assert_valid_call_is_right(loaded)


class Derived(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum() + y.sum()


def test_a_derived_and_a_lower_bounded_dim_are_checked_as_torch_checks_them() -> None:
    b, s = Dim("b", max=8), Dim("seq", min=3, max=100)
    program = torch.export.export(
        Derived(), (torch.randn(2, 4), torch.randn(4, 5)), dynamic_shapes=({0: b}, {0: 2 * b, 1: s}), strict=False
    )
    module = tetrt_support.compile(program, backend="eager")
    with pytest.raises(InputValueError, match=r"input 'y': expected y.shape\[0\] to be equal to 6, but got 5 "
                       r"\(2\*b, where x.shape\[0\] set b to 3"):
        module(torch.randn(3, 4), torch.randn(5, 5))
    with pytest.raises(InputValueError, match=r"input 'y': expected y.shape\[1\] to be >= 3, but got 2 \(seq in \[3, 100\]"):
        module(torch.randn(3, 4), torch.randn(6, 2))
    torch.testing.assert_close(module(torch.randn(1, 4), torch.randn(2, 3)).shape, torch.Size([]))  # 0/1 pass, as in torch


# --------------------------------------------------------------------------- 3. no trace left
def test_ten_refused_calls_leave_a_valid_non_contiguous_input_working(compiled) -> None:
    """On inductor, seven bad calls used to exhaust Dynamo's recompile budget
    (``FailOnRecompileLimitHit`` on the next valid input)."""
    x, ids = _inputs()
    bad = [
        (x.double(), ids), (x.half(), ids), (x.to(torch.int32), ids), (x, ids.float()), (x, ids.int()),
        (torch.randn(2, 5), ids), (x[..., None], ids), (None, ids), (x.numpy(), ids), (torch.randn(9, 4), torch.arange(9)),
    ]
    for args in bad:
        with pytest.raises(InvalidInputError):
            compiled(args[0], position_ids=args[1])
    transposed = torch.randn(4, 3, generator=torch.Generator().manual_seed(2)).t()
    assert not transposed.is_contiguous()
    assert_same_outputs(Positions().eval()(transposed, torch.arange(3)), compiled(transposed, position_ids=torch.arange(3)))


# --------------------------------------------------------------------------- 4. conjugate views
class ComplexScale(torch.nn.Module):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * z + 1j


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_conjugate_view_input_computes_what_eager_computes(backend: str) -> None:
    z = torch.randn(3, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    module = tetrt_support.compile(ComplexScale(), arg_inputs=(z,), backend=backend, min_block_size=1)
    assert z.conj().is_conj()
    assert_same_outputs(ComplexScale()(z.conj()), module(z.conj()))
    assert_same_outputs(ComplexScale()(z), module(z))


# --------------------------------------------------------------------------- 6. the property
_WRONG_DTYPES = [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.complex64]


@st.composite
def bad_calls(draw: st.DrawFn) -> tuple[object, object, str, str]:
    """(x, position_ids, the input named, a fragment of the message) with exactly one defect."""
    batch = draw(st.integers(2, 8))
    x, ids = torch.zeros(batch, 4), torch.arange(batch)
    defect = draw(st.sampled_from(["dtype", "ids_dtype", "static", "rank", "non_tensor", "range", "unequal"]))
    if defect == "dtype":
        dtype = draw(st.sampled_from(_WRONG_DTYPES))
        return x.to(dtype), ids, "x", f"got a {'complex tensor' if dtype.is_complex else str(dtype) + ' tensor'}"
    if defect == "ids_dtype":
        dtype = draw(st.sampled_from([torch.float32, torch.int32, torch.int16]))
        return x, ids.to(dtype), "position_ids", f"got a {dtype} tensor"
    if defect == "static":
        width = draw(st.integers(1, 9).filter(lambda n: n != 4))
        return torch.zeros(batch, width), ids, "x", f"x.shape[1] to be equal to 4, but got {width}"
    if defect == "rank":
        shape = draw(st.sampled_from([(batch,), (batch, 4, 1), (1, batch, 4), ()]))
        return torch.zeros(shape), ids, "x", f"must have 2 dimensions (exported shape [b, 4]), but got {len(shape)}"
    if defect == "non_tensor":
        name = draw(st.sampled_from(["x", "position_ids"]))
        value = draw(st.sampled_from([None, 1.5, 3, "x", [0.0] * 4, (1, 2), np.zeros((batch, 4), np.float32)]))
        given = "None" if value is None else type(value).__name__
        return (value, ids, name, given) if name == "x" else (x, value, name, given)
    if defect == "range":
        big = draw(st.integers(9, 40))
        return torch.zeros(big, 4), torch.arange(big), "x", f"x.shape[0] to be <= 8, but got {big}"
    other = draw(st.integers(0, 12).filter(lambda n: n != batch))
    return x, torch.arange(other), "position_ids", f"position_ids.shape[0] to be equal to {batch}, but got {other}"


@settings(max_examples=examples(20))
@given(call=bad_calls(), batch=st.integers(2, 8))
def test_any_wrong_input_is_named_and_changes_nothing_later(compiled, call, batch: int) -> None:
    x, ids, name, fragment = call
    with pytest.raises(InvalidInputError) as raised:
        compiled(x, position_ids=ids)
    assert isinstance(raised.value, (TypeError, ValueError))
    message = str(raised.value)
    assert message.startswith(f"input {name!r}") and fragment in message, message
    _assert_valid_call_is_right(compiled, batch)


# --------------------------------------------------------------------------- 5. refit
class TwoLayers(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def _fake_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(shape)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["meta", "fake", "meta_module"])
def test_a_refit_with_a_weight_without_data_is_refused_and_changes_nothing(backend: str, kind: str) -> None:
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    module = tetrt_support.compile(TwoLayers(0).eval(), arg_inputs=(x,), backend=backend, min_block_size=1)
    before = module(x)
    state = dict(TwoLayers(1).state_dict())
    if kind == "meta_module":
        with torch.device("meta"):
            new = TwoLayers(1)
        message = r"'a.weight': the new weight is a tensor on the meta device, which holds no data"
    else:
        # the last weight: every other one would have been replaced before it, had the refit not checked first
        state["b.bias"] = torch.empty(3, device="meta") if kind == "meta" else _fake_tensor((3,))
        new = state
        message = rf"'b.bias': the new weight is {'a fake tensor' if kind == 'fake' else 'a tensor on the meta device'}"
    with pytest.raises(UnusableWeight, match=message):
        tetrt_support.refit_module_weights(module, new, in_place=True)
    torch.testing.assert_close(module(x), before, atol=0, rtol=0)
    fine = TwoLayers(2).eval()
    assert_same_outputs(fine(x), tetrt_support.refit_module_weights(module, fine, in_place=True)(x))


def test_a_refit_with_a_weight_on_another_device_is_refused() -> None:
    x = torch.randn(2, 4)
    module = tetrt_support.compile(TwoLayers(0).eval(), arg_inputs=(x,), backend="eager", min_block_size=1)
    recorded = module.meta[WEIGHTS_KEY]
    assert {entry[3] for entry in recorded.values()} == {"cpu"}
    elsewhere = copy.deepcopy(module)  # as if compiled on a GPU (no GPU here to move weights to)
    elsewhere.meta[WEIGHTS_KEY] = {name: (*entry[:3], "cuda:0") for name, entry in recorded.items()}
    with pytest.raises(UnusableWeight, match=r"'a.weight': the compiled module computes on cuda:0, the new weight is on cpu"):
        tetrt_support.refit_module_weights(elsewhere, TwoLayers(1))


def test_a_refit_that_fails_half_way_puts_everything_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after the first replacement (here: RoPE's frequencies, given to the folded
    recipe) must undo it: the module computes as before, also when a later refit recomputes
    the folded planes from the recipe."""
    from tetrt_support import zoo
    from tetrt_support.compiler import refit

    old, new = zoo.ComplexRoPE(head_dim=32, max_seq_len=32).eval(), zoo.ComplexRoPE(head_dim=32, max_seq_len=32, theta=50.0).eval()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 16, 3, 32, generator=g), torch.randn(2, 16, 3, 32, generator=g)
    module = tetrt_support.compile(old, arg_inputs=(q, k), min_block_size=1)
    before = module(q, k)
    replace, calls = refit.replace_tensor_attribute, []

    def fail_on_the_second(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise RuntimeError("injected")
        return replace(*args, **kwargs)

    monkeypatch.setattr(refit, "replace_tensor_attribute", fail_on_the_second)
    with pytest.raises(RuntimeError, match="injected"):
        tetrt_support.refit_module_weights(module, new, in_place=True)
    monkeypatch.undo()
    assert_same_outputs(before, module(q, k), atol=0, rtol=0)
    # the recipe holds the old frequencies again: a refit that brings none recomputes the old planes
    assert_same_outputs(before, tetrt_support.refit_module_weights(module, {})(q, k), atol=1e-6)
    assert_same_outputs(new(q, k), tetrt_support.refit_module_weights(module, new, in_place=True)(q, k), atol=1e-5)


# --------------------------------------------------------------------------- 5. engines without a backward
class _HalfRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 0.5


def test_an_input_that_requires_grad_is_refused_by_an_engine_without_backward() -> None:
    """ONNX Runtime computes forward only: in grad mode an input that requires grad would come
    back with outputs cut off from autograd (ep.module() keeps the gradient), so it is refused
    by name; under torch.no_grad() the same call runs."""
    from tetrt_support.compiler.engines.base import NoBackwardError

    x = torch.randn(2, 3)
    module = tetrt_support.compile(_HalfRelu(), arg_inputs=(x,), backend="onnxruntime", min_block_size=1)
    with pytest.raises(NoBackwardError, match=r"onnxruntime block input 'x' requires grad, but the onnxruntime engine "
                       r"has no backward.*torch.no_grad\(\)"):
        module(x.clone().requires_grad_())
    with torch.no_grad():
        out = module(x.clone().requires_grad_())
    assert_same_outputs(_HalfRelu()(x), out)


def test_engine_weights_are_constants_so_a_model_with_weights_runs_in_grad_mode() -> None:
    """As in Torch-TensorRT, an engine's weights are constants: a compiled Linear called in
    grad mode with an input that needs no gradient runs, and its output carries none."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).eval()
    x = torch.randn(2, 4)
    module = tetrt_support.compile(model, arg_inputs=(x,), backend="onnxruntime", min_block_size=1)
    out = module(x)
    assert out.grad_fn is None
    assert_same_outputs(model(x).detach(), out)


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_engines_with_autograd_keep_the_gradient(backend: str) -> None:
    x = torch.randn(2, 3, requires_grad=True)
    module = tetrt_support.compile(_HalfRelu(), arg_inputs=(x.detach(),), backend=backend, min_block_size=1)
    module(x).sum().backward()
    torch.testing.assert_close(x.grad, (x.detach() > 0).float() * 0.5)
