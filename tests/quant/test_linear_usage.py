"""quant.Linear makes only the layouts TE's _Linear makes, and computes only the gradients it needs.

TransformerEngine's ``module/linear.py``: row-wise always; the input's column-wise copy
(the wgrad operand) iff grad is enabled and the weight requires grad; the weight's (the
dgrad operand) iff grad is enabled and the input requires grad; in backward, dgrad and
wgrad only for what requires grad, the output gradient column-wise only for wgrad (or a
bias). Which layouts were made is read from every ``Quantizer.quantize`` call (a spy);
values are compared bit for bit with a reference that quantizes both layouts, as the
Linear did before it followed TE's usages.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import tetrt_support.quant  # noqa: F401  (registers the quantizers as opaque value types)
from tetrt_support.quant import ops
from tetrt_support.quant.base import Quantizer
from tetrt_support.quant.fake_impls import FAKE_IMPLS
from tetrt_support.quant.linear import Linear
from tetrt_support.quant.ops import quantized_matmul, with_usage
from tetrt_support.quant.recipes import RECIPES, get_recipe
from tetrt_support.report.fake_impl_measure import fp32_recipe

IN, OUT, TOKENS = 64, 96, 32  # distinct shapes tell the input (32, 64), weight (96, 64) and grad (32, 96) apart
ROLE = {(TOKENS, IN): "input", (OUT, IN): "weight", (TOKENS, OUT): "grad"}
BOTH, ROWWISE = (True, True), (True, False)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[bool, bool]]]:
    """Every quantize call as (role, (row-wise, column-wise)), in call order."""
    calls: list[tuple[str, tuple[bool, bool]]] = []
    original = Quantizer.quantize

    def spy(self: Quantizer, x: torch.Tensor, **options):  # type: ignore[no-untyped-def]
        calls.append((ROLE[tuple(x.shape)], (self.rowwise_usage, self.columnwise_usage)))
        return original(self, x, **options)

    monkeypatch.setattr(Quantizer, "quantize", spy)
    return calls


@pytest.fixture
def gemms(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, str | None]]:
    """The (layout_a, layout_b) of every GEMM the ops run."""
    calls: list[tuple[str | None, str | None]] = []
    original = ops.quantized_matmul

    def spy(a, b, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((kwargs.get("layout_a"), kwargs.get("layout_b")))
        return original(a, b, **kwargs)

    monkeypatch.setattr(ops, "quantized_matmul", spy)
    return calls


def _layer(recipe: str, fake_impl: str = "make_empty_traceable", *, bias: bool = True) -> Linear:
    torch.manual_seed(0)
    return Linear(IN, OUT, recipe=fp32_recipe(recipe), fake_impl=fake_impl, bias=bias, compile_as="custom_ops")


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(TOKENS, IN, generator=g), torch.randn(TOKENS, OUT, generator=g)


def _reference_forward(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """The forward from operands quantized in both layouts (the recipes' quantizers as built)."""
    xq, wq = layer.input_quantizer.quantize(x.detach()), layer.weight_quantizer.quantize(layer.weight.detach())
    out = quantized_matmul(xq, wq, transpose_a=False, transpose_b=True, layout_a="rowwise", layout_b="rowwise",
                           out_dtype=torch.float32 if layer.bias is not None else x.dtype)
    if layer.bias is not None:
        out = out + layer.bias.detach().float()
    return out.to(x.dtype)


def _reference_grads(layer: Linear, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgrad, wgrad) from operands and a gradient quantized in both layouts (seed 7 for
    NVFP4's stochastic rounding, as the backward under test draws it)."""
    xq, wq = layer.input_quantizer.quantize(x.detach()), layer.weight_quantizer.quantize(layer.weight.detach())
    torch.manual_seed(7)
    gq = layer.grad_quantizer.quantize(grad)
    dgrad = quantized_matmul(gq, wq, transpose_a=False, transpose_b=False, out_dtype=x.dtype,
                             layout_a="rowwise", layout_b="columnwise").to(x.dtype)
    wgrad = quantized_matmul(gq, xq, transpose_a=True, transpose_b=False, out_dtype=x.dtype,
                             layout_a="columnwise", layout_b="columnwise").to(x.dtype)
    return dgrad, wgrad


def _backward(y: torch.Tensor, grad: torch.Tensor) -> None:
    torch.manual_seed(7)
    y.backward(grad)


# ------------------------------------------------------------------ which layouts
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_no_grad_makes_row_wise_copies_only_and_the_same_output(recipe: str, fake_impl: str, made) -> None:
    layer = _layer(recipe, fake_impl)
    x, _ = _inputs()
    with torch.no_grad():
        y = layer(x)
    assert made == [("input", ROWWISE), ("weight", ROWWISE)]
    made.clear()
    assert torch.equal(y, _reference_forward(layer, x))


@pytest.mark.parametrize("recipe", RECIPES)
def test_no_grad_op_returns_no_saved_input_and_a_row_wise_weight(recipe: str) -> None:
    """The op's flat outputs: nothing saved of the input, the weight's row-wise buffers only."""
    layer = _layer(recipe)
    x, _ = _inputs()
    q = layer.weight_quantizer
    with torch.no_grad():
        _, x_flat, w_flat = layer._ops.forward(x, layer.weight, layer.bias, [], layer.input_quantizer, q,
                                               layer.grad_quantizer, False, False, [False] * 3, None, None)
    rowwise_only = with_usage(q, columnwise=False).describe_buffers(layer.weight.shape)
    assert x_flat == []
    assert [(tuple(t.shape), t.dtype) for t in w_flat] == [(tuple(s), d) for s, d in rowwise_only.values()]
    assert len(w_flat) < len(q.describe_buffers(layer.weight.shape))  # the recipe's quantizer makes both


@pytest.mark.parametrize("recipe", RECIPES)
def test_training_makes_both_layouts_and_the_same_gradients(recipe: str, made, gemms) -> None:
    layer = _layer(recipe)
    x, grad = _inputs()
    x.requires_grad_(True)
    y = layer(x)
    _backward(y, grad)
    assert made == [("input", BOTH), ("weight", BOTH), ("grad", BOTH)]
    assert gemms == [("rowwise", "rowwise"), ("rowwise", "columnwise"), ("columnwise", "columnwise")]
    made.clear()
    dgrad, wgrad = _reference_grads(layer, x, grad)
    assert torch.equal(y.detach(), _reference_forward(layer, x))
    assert torch.equal(x.grad, dgrad) and torch.equal(layer.weight.grad, wgrad)
    assert torch.equal(layer.bias.grad, grad.sum(0))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_frozen_weight_makes_no_input_column_wise_copy_and_no_wgrad(recipe: str, bias: bool, made, gemms) -> None:
    """TE keeps the output gradient's column-wise copy when the layer has a bias."""
    layer = _layer(recipe, bias=bias)
    layer.weight.requires_grad_(False)
    x, grad = _inputs()
    x.requires_grad_(True)
    _backward(layer(x), grad)
    assert made == [("input", ROWWISE), ("weight", BOTH), ("grad", BOTH if bias else ROWWISE)]
    assert gemms == [("rowwise", "rowwise"), ("rowwise", "columnwise")]  # fprop, dgrad
    made.clear()
    assert layer.weight.grad is None
    assert torch.equal(x.grad, _reference_grads(layer, x, grad)[0])


@pytest.mark.parametrize("recipe", RECIPES)
def test_input_without_grad_makes_no_weight_column_wise_copy_and_no_dgrad(recipe: str, made, gemms) -> None:
    layer = _layer(recipe)
    x, grad = _inputs()
    _backward(layer(x), grad)
    assert made == [("input", BOTH), ("weight", ROWWISE), ("grad", BOTH)]
    assert gemms == [("rowwise", "rowwise"), ("columnwise", "columnwise")]  # fprop, wgrad
    made.clear()
    assert x.grad is None
    assert torch.equal(layer.weight.grad, _reference_grads(layer, x, grad)[1])


def test_the_modules_quantizers_are_not_changed() -> None:
    layer = _layer("nvfp4")
    before = [q.copy() for q in (layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer)]
    with torch.no_grad():
        layer(_inputs()[0])
    layer.weight.requires_grad_(False)
    layer(_inputs()[0].requires_grad_(True)).sum().backward()
    assert [layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer] == before


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
@pytest.mark.parametrize("columnwise", [(False, False), (True, False), (False, True)], ids=["none", "input", "weight"])
def test_fake_impls_match_the_real_ops_for_every_usage(recipe: str, fake_impl: str, columnwise: tuple[bool, bool]) -> None:
    """torch.library's fake-tensor check (real and fake outputs agree in number, shapes and
    dtypes) for the forward op with each usage, fresh and with a cached weight of that
    usage, and for the backward op computing only what those layouts allow. (Both
    layouts: test_linear_ops.test_opcheck.)"""
    layer = _layer(recipe, fake_impl)
    input_columnwise, weight_columnwise = columnwise
    x = torch.randn(TOKENS, IN, requires_grad=weight_columnwise)
    quantizers = (layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer)
    args = (x, layer.weight, layer.bias, [], *quantizers, *columnwise, [False] * 3, None, None)
    torch.library.opcheck(layer._ops.forward, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    _, x_flat, w_flat = layer._ops.forward(*args)
    cached = (x.detach(), layer.weight, layer.bias, [t.detach() for t in w_flat], *quantizers, *columnwise, [False] * 3,
              None, None)
    torch.library.opcheck(layer._ops.forward, cached, test_utils=("test_faketensor",))
    backward_args = (
        torch.randn(TOKENS, OUT), [t.detach() for t in x_flat], [t.detach() for t in w_flat], *quantizers,
        [TOKENS, IN], [OUT, IN], torch.float32, True, weight_columnwise, input_columnwise, *columnwise, [False] * 3, None,
    )
    torch.library.opcheck(layer._ops.backward, backward_args, test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))


# ------------------------------------------------------------------ missing layouts
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_backward_refuses_a_gradient_whose_operand_was_not_made(fake_impl: str) -> None:
    layer = _layer("mxfp8", fake_impl)
    x, grad = _inputs()
    args = (layer.weight, layer.bias, [], layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer)
    out, _, _ = layer._ops.forward(x.clone().requires_grad_(True), *args, True, False, [False] * 3, None, None)
    with pytest.raises(RuntimeError, match=r"dgrad GEMM\) reads the weight's column-wise copy, but the forward did not make it"):
        out.backward(grad)
    out, _, _ = layer._ops.forward(x, *args, False, True, [False] * 3, None, None)
    with pytest.raises(RuntimeError, match=r"wgrad GEMM\) reads the input's column-wise copy, but the forward did not make it"):
        out.backward(grad)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_row_wise_cache_where_dgrad_needs_the_column_wise_copy_is_a_miss(recipe: str, made) -> None:
    """TE's ``quantize_weight``: a workspace without the needed usage is re-made and re-cached."""
    layer = _layer(recipe)
    x, grad = _inputs()
    with torch.no_grad():
        cached = layer(x, is_first_microbatch=True)
    assert not layer._weight_cache_columnwise
    with torch.no_grad():  # no gradient: the row-wise cache serves
        assert torch.equal(layer(x, is_first_microbatch=False), cached)
    layer(x, is_first_microbatch=False).sum().backward()  # wgrad reads the input, not the weight's copy
    assert layer.weight.grad is not None
    made.clear()
    x.requires_grad_(True)
    y = layer(x, is_first_microbatch=False)  # needs the column-wise copy: quantized afresh, cached again
    assert ("weight", BOTH) in made and layer._weight_cache_columnwise
    _backward(y, grad)
    assert torch.equal(x.grad, _reference_grads(layer, x, grad)[0])
    made.clear()
    layer(x, is_first_microbatch=False)
    assert ("weight", BOTH) not in made  # the new cache serves


@pytest.mark.parametrize("recipe", ["fp8_current", "nvfp4"])
def test_a_cache_with_both_layouts_serves_a_call_that_needs_fewer(recipe: str, made) -> None:
    layer = _layer(recipe)
    x, _ = _inputs()
    layer(x.clone().requires_grad_(True), is_first_microbatch=True)
    made.clear()
    with torch.no_grad():
        y = layer(x, is_first_microbatch=False)
    assert made == [("input", ROWWISE)]  # the weight came from the cache
    made.clear()
    assert torch.equal(y, _reference_forward(layer, x))


def test_a_compiled_call_on_a_row_wise_cache_re_caches_as_eager_does() -> None:
    layer = _layer("fp8_current")
    x, grad = _inputs()
    torch._dynamo.reset()
    step = torch.compile(lambda t, first: layer(t, is_first_microbatch=first), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        step(x, True)
    x.requires_grad_(True)
    y = step(x, False)
    assert layer._weight_cache_columnwise
    _backward(y, grad)
    assert torch.equal(x.grad, _reference_grads(layer, x, grad)[0])


# ------------------------------------------------------------------ with_usage
def test_with_usage_copies_once_per_value_and_never_mutates() -> None:
    q = get_recipe("nvfp4").input()
    assert with_usage(q, columnwise=True) is q  # already both: no copy
    rowwise = with_usage(q, columnwise=False)
    assert rowwise is not q and (rowwise.rowwise_usage, rowwise.columnwise_usage) == (True, False)
    assert q.columnwise_usage
    assert with_usage(q.copy(), columnwise=False) is rowwise  # equal values share one copy


def test_with_usage_made_inside_a_fake_impl_holds_real_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from tetrt_support.quant import NVFP4Quantizer

    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, rht_sign_mask=0x1234)  # a value no other test uses: made here first
    with FakeTensorMode():
        variant = with_usage(q, columnwise=False)
    assert not isinstance(variant.rht_matrix, FakeTensor)


# ------------------------------------------------------------------ torch.compile
def _compile_phases(recipe: str, fake_impl: str, backend: str, made) -> tuple[CompileCounterWithBackend, dict]:
    """Compiled (fullgraph) calls under no_grad, in training, and with a frozen weight:
    each phase's quantize usages in the compiled layer, and whether its results equal the
    same calls on an eager twin."""
    from torch._dynamo.utils import counters

    layer, eager = _layer(recipe, fake_impl), _layer(recipe, fake_impl)
    x, grad = _inputs()
    torch._dynamo.reset()
    counters.clear()
    counting = CompileCounterWithBackend(backend)
    compiled = torch.compile(layer, backend=counting, fullgraph=True)

    def run(module: torch.nn.Module, phase: str) -> tuple[list, list[torch.Tensor]]:
        made.clear()
        if phase == "no_grad":
            with torch.no_grad():
                results = [module(x * s) for s in (1.0, 0.5)]
        else:
            inp = x.clone().requires_grad_(True)
            _backward(module(inp), grad)
            results = [inp.grad] + ([] if phase == "frozen_weight" else [module.weight.grad])
        return list(made), results

    phases: dict = {}
    for phase in ("no_grad", "training", "frozen_weight"):
        if phase == "frozen_weight":
            layer.weight.requires_grad_(False)
            eager.weight.requires_grad_(False)
        usages, got = run(compiled, phase)
        _, expected = run(eager, phase)
        phases[phase] = (usages, all(torch.equal(g, e) for g, e in zip(got, expected)))
    made.clear()
    phases["graph_breaks"] = sum(counters["graph_break"].values())
    return counting, phases


EXPECTED_PHASES = {
    "no_grad": ([("input", ROWWISE), ("weight", ROWWISE)] * 2, True),
    "training": ([("input", BOTH), ("weight", BOTH), ("grad", BOTH)], True),
    "frozen_weight": ([("input", ROWWISE), ("weight", BOTH), ("grad", BOTH)], True),  # the bias keeps grad's copy
    "graph_breaks": 0,
}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_usages_follow_grad_mode_and_requires_grad(recipe: str, fake_impl: str, backend: str, made) -> None:
    """One frame per (grad mode, requires_grad) combination, none for repeats, no graph break."""
    counting, phases = _compile_phases(recipe, fake_impl, backend, made)
    assert phases == EXPECTED_PHASES
    assert counting.frame_count == 3


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_compiled_usages_under_inductor(recipe: str, fake_impl: str, made) -> None:
    counting, phases = _compile_phases(recipe, fake_impl, "inductor", made)
    assert phases == EXPECTED_PHASES
    assert counting.frame_count == 3
