"""The Linear custom ops: registration checks, the aliasing rule, numerics, flat protocol."""

from __future__ import annotations

import pytest
import torch

import tetrt_support.quant  # noqa: F401  (registers the quantizers as opaque value types)
from tetrt_support.quant.fake_impls import FAKE_IMPLS, get_strategy
from tetrt_support.quant.fake_impls.make_empty_traceable import make_empty_traceable
from tetrt_support.quant.fake_impls.tensor_proto import TensorProto
from tetrt_support.quant.linear import Linear
from tetrt_support.quant.ops import flatten_quantized, linear_ops, opaque_type_name
from tetrt_support.quant.recipes import RECIPES, Recipe, get_recipe
from tetrt_support.report.fake_impl_measure import fp32_recipe  # nvfp4: TE's reference rule for fp32 input


def _forward_args(layer: Linear, x: torch.Tensor, cache: list[torch.Tensor] | None = None) -> tuple:
    return (x, layer.weight, layer.bias, cache or [], layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer,
            True, True, list(layer.fast_accum), None, None)  # both layouts: the training usages


def _storages(tensors) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in tensors if t is not None and t.numel() > 0]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_opcheck(recipe: str, fake_impl: str) -> None:
    """torch.library's own checks: schema (aliasing and mutation included), autograd
    registration and fake impl for the forward op; fake impl and AOT dispatch (dynamic
    shapes) for the backward op. Not run, because opcheck's helpers cannot handle FP8
    tensors on CPU (no sum/mul kernels for float8): forward test_aot_dispatch_dynamic
    (it sums every output into a loss) and backward test_schema (it does arithmetic on
    the FP8 inputs). Both paths are exercised by the aot_eager compile tests and the
    explicit aliasing test below."""
    layer = Linear(64, 32, recipe=fp32_recipe(recipe), fake_impl=fake_impl, compile_as="custom_ops")
    x = torch.randn(32, 64, requires_grad=True)
    args = _forward_args(layer, x)
    torch.library.opcheck(layer._ops.forward, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    _, x_flat, w_flat = layer._ops.forward(*args)
    backward_args = (
        torch.randn(32, 32), [t.detach() for t in x_flat], [t.detach() for t in w_flat],
        layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer, [32, 64], [32, 64], torch.float32, True,
        True, True, True, True, list(layer.fast_accum), None,
    )
    torch.library.opcheck(layer._ops.backward, backward_args, test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("cached", [False, True], ids=["fresh-weight", "cached-weight"])
def test_outputs_alias_no_input_and_no_other_output(recipe: str, cached: bool) -> None:
    layer = Linear(64, 32, recipe=fp32_recipe(recipe))
    x = torch.randn(32, 64)
    cache = flatten_quantized(layer.weight_quantizer.quantize(layer.weight.detach())) if cached else []
    out, x_flat, w_flat = layer._ops.forward(*_forward_args(layer, x, cache))
    assert (len(w_flat) == 0) == cached  # the cached weight came in, so it is not returned again
    outputs = _storages([out, *x_flat, *w_flat])
    assert len(set(outputs)) == len(outputs)
    assert not set(outputs) & set(_storages([x, layer.weight, layer.bias, *cache]))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_forward_and_backward_equal_the_dequantized_reference(recipe: str, fake_impl: str) -> None:
    """The GEMMs (torch._scaled_mm for per-tensor FP8, fp32 matmul of dequantized
    operands for block formats) equal fp32 arithmetic on the dequantized operands."""
    layer = Linear(64, 32, recipe=fp32_recipe(recipe), fake_impl=fake_impl, compile_as="custom_ops")
    x = torch.randn(32, 64, requires_grad=True)
    grad = torch.randn(32, 32)
    y = layer(x)
    torch.manual_seed(7)  # NVFP4 gradients round stochastically: same random numbers twice
    y.backward(grad)
    qx, qw, qg = layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer
    xq, wq = qx.quantize(x.detach()), qw.quantize(layer.weight.detach())
    torch.manual_seed(7)
    gq = qg.quantize(grad)
    row, col = "rowwise", "columnwise"
    torch.testing.assert_close(y.detach(), xq.dequantize(layout=row) @ wq.dequantize(layout=row).T + layer.bias.detach(),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, gq.dequantize(layout=row) @ wq.dequantize(layout=col), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, gq.dequantize(layout=col).T @ xq.dequantize(layout=col), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.bias.grad, grad.sum(0))


def test_fp8_current_uses_e5m2_gradients_and_others_e4m3() -> None:
    grad_dtypes = {name: getattr(get_recipe(name).grad(), "fp8_dtype", None) for name in RECIPES}
    assert grad_dtypes == {
        "fp8_current": torch.float8_e5m2, "fp8_block": torch.float8_e4m3fn,
        "mxfp8": torch.float8_e4m3fn, "nvfp4": None,  # NVFP4 gradients are E2M1
    }


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_fake_buffers_match_real_and_reassemble_round_trips(recipe: str, fake_impl: str) -> None:
    strategy = get_strategy(fake_impl)
    quantizer = fp32_recipe(recipe).input()
    x = torch.randn(32, 64)
    real = quantizer.quantize(x)
    real_flat = flatten_quantized(real)
    template = strategy.fake_quantized(quantizer, x.shape, x.dtype, torch.device("meta"))
    fake_flat = strategy.flat_fake(template)
    assert [(t.shape, t.dtype) for t in fake_flat] == [(t.shape, t.dtype) for t in real_flat]
    rebuilt = strategy.reassemble(template, real_flat)
    assert type(rebuilt) is type(real)
    torch.testing.assert_close(rebuilt.dequantize(), real.dequantize(), rtol=0, atol=0)
    assert [t.data_ptr() for t in strategy.flat_buffers(rebuilt)] == [t.data_ptr() for t in real_flat]


@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_reassemble_names_a_wrong_buffer_count_or_shape(fake_impl: str) -> None:
    strategy = get_strategy(fake_impl)
    quantizer = get_recipe("mxfp8").input()
    template = strategy.fake_quantized(quantizer, (32, 64), torch.float32, torch.device("meta"))
    flat = flatten_quantized(quantizer.quantize(torch.randn(32, 64)))  # TE's default: both usages, 4 buffers
    with pytest.raises(ValueError, match=r"has 4 buffers .*got 1 tensors"):
        strategy.reassemble(template, flat[:1])
    with pytest.raises(ValueError, match=r"buffer _rowwise_data should be \(32, 64\)"):
        strategy.reassemble(template, [flat[0][:8], *flat[1:]])


def test_make_empty_traceable_stashes_flatten_names_and_context() -> None:
    quantizer = get_recipe("nvfp4").input()
    t = make_empty_traceable(quantizer, (16, 64), torch.float32)
    names, ctx = t.__tensor_flatten__()
    assert t._te_flat_names == tuple(names) and t._te_flat_ctx == ctx


def test_flat_buffers_refuses_a_tensor_without_the_stash() -> None:
    t = get_recipe("fp8_current").input().quantize(torch.randn(4, 64))
    with pytest.raises(TypeError, match="carries no _te_flat_names"):
        get_strategy("make_empty_traceable").flat_buffers(t)
    assert len(get_strategy("tensor_proto").flat_buffers(t)) == 3  # data, transpose, scale_inv; no stash needed


def test_tensor_proto_describes_without_allocating() -> None:
    proto = TensorProto.describe(get_recipe("nvfp4").input(), (16, 64), torch.bfloat16)
    assert proto.names == (
        "_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv", "_amax_rowwise", "_amax_columnwise",
    )
    assert proto.slot_count == 6
    # scales as TE allocates them: rows padded to 128, scale columns to 4
    assert [b.shape for b in proto.buffers] == [(16, 32), (128, 4), (64, 8), (128, 4), (1,), (1,)]


def test_bad_recipe_and_fake_impl_names_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown recipe 'fp16'; valid recipes: fp8_current, fp8_block, mxfp8, nvfp4"):
        Linear(4, 4, recipe="fp16")
    with pytest.raises(ValueError, match=r"unknown fake_impl 'proto'; valid fake impls: make_empty_traceable, tensor_proto"):
        Linear(4, 4, fake_impl="proto")


def test_wrong_input_width_is_named() -> None:
    with pytest.raises(ValueError, match="input's last dimension is 32, expected in_features=64"):
        Linear(64, 32)(torch.randn(4, 32))


def test_unregistered_quantizer_class_cannot_become_an_op_argument() -> None:
    from tetrt_support.quant import Float8Quantizer  # delayed scaling: identity semantics, not registered

    with pytest.raises(TypeError, match="Float8Quantizer is not registered as an opaque type"):
        opaque_type_name(Float8Quantizer)
    with pytest.raises(TypeError, match="not registered as an opaque type"):
        linear_ops(Float8Quantizer, Float8Quantizer, Float8Quantizer, "tensor_proto")


def test_leading_dimensions_are_kept() -> None:
    layer = Linear(64, 32, recipe="fp8_block")
    assert layer(torch.randn(2, 3, 64)).shape == (2, 3, 32)


def test_recipe_object_carries_its_options_to_the_quantizers_and_the_repr() -> None:
    recipe = get_recipe("nvfp4", row_scaled_activation=True, disable_rht=True, disable_stochastic_rounding=False)
    layer = Linear(64, 32, recipe=recipe, dtype=torch.bfloat16)
    assert layer.recipe == recipe and isinstance(layer.recipe, Recipe)
    assert layer.input_quantizer.row_scaled_nvfp4 and not layer.input_quantizer.with_rht
    assert not layer.grad_quantizer.row_scaled_nvfp4 and layer.grad_quantizer.stochastic_rounding  # TE's roles
    assert "recipe='nvfp4(disable_rht=True, row_scaled_activation=True)'" in repr(layer)  # defaults not listed
    assert "recipe='mxfp8'" in repr(Linear(64, 32, recipe="mxfp8"))
    assert Linear(64, 32, recipe="mxfp8").recipe == get_recipe("mxfp8")  # a name is its default Recipe
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    layer(x).sum().backward()
    assert layer._ops.forward is Linear(64, 32, recipe="nvfp4")._ops.forward  # one op pair per quantizer classes


def test_recipe_must_be_a_name_or_a_recipe() -> None:
    with pytest.raises(TypeError, match="recipe must be a recipe name or a Recipe .*got dict"):
        Linear(4, 4, recipe={"name": "nvfp4"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'rht_any_input_dtype'"):
        get_recipe("mxfp8", rht_any_input_dtype=True)


def test_nvfp4_linear_takes_bf16_and_refuses_fp32_as_tes_kernels() -> None:
    """TE's nvfp4 recipe transforms the input and the gradient: its kernels take bf16 only."""
    with pytest.raises(TypeError, match=r"with_rht=True takes torch\.bfloat16 input only.*got torch\.float32"):
        Linear(64, 32, recipe="nvfp4")(torch.randn(32, 64))
    bf16 = Linear(64, 32, recipe="nvfp4", dtype=torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    bf16(x).sum().backward()
    assert x.grad.dtype == torch.bfloat16 and bf16.weight.grad.abs().sum() > 0
    allowed = Linear(64, 32, recipe=get_recipe("nvfp4", rht_any_input_dtype=True))
    assert allowed(torch.randn(32, 64)).shape == (32, 32)


@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
def test_an_assigned_quantizer_is_used_and_drops_the_cached_weight(fake_impl: str) -> None:
    # Replacing the weight quantizer after construction: the layer must compute with the
    # new one, and a weight cached by the old one must not be reused.
    from tetrt_support.quant.float8_blockwise_tensor import Float8BlockQuantizer
    from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer as Current

    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(0))
    # same buffers as the old cache (it used to be reused silently), other dtype, other class
    for new in (Current(force_pow_2_scales=True), Current(torch.float8_e5m2), Float8BlockQuantizer(block_scaling_dim=2)):
        layer = Linear(256, 128, bias=False, recipe="fp8_current", fake_impl=fake_impl)
        reference = Linear(256, 128, bias=False, fake_impl=fake_impl,
                           recipe=Recipe("assigned", Current, lambda new=new: new, lambda: Current(torch.float8_e5m2)))
        reference.load_state_dict(layer.state_dict())
        with torch.no_grad():
            old_cached = layer(x, is_first_microbatch=True)
            layer.weight_quantizer = new
            assert layer._weight_cache is None
            expected = reference(x)
            assert torch.equal(layer(x, is_first_microbatch=False), expected)  # a miss: quantized anew
            assert torch.equal(layer(x, is_first_microbatch=False), expected)  # the new cache
            assert not torch.equal(old_cached, expected)
    with pytest.raises(TypeError, match="Linear.grad_quantizer must be a Quantizer, got str"):
        layer.grad_quantizer = "e5m2"


def test_a_quantizer_unlike_the_recipes_leaves_the_layer_without_a_recipe() -> None:
    from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer as Current

    layer = Linear(64, 32, recipe="fp8_current")
    layer.input_quantizer = get_recipe("fp8_current").input()  # equal to the recipe's: still that recipe
    assert layer.recipe == get_recipe("fp8_current")
    layer.weight_quantizer = Current(torch.float8_e5m2)
    assert layer.recipe is None
    assert "recipe=None, input_quantizer=" in repr(layer) and "weight_quantizer=Float8CurrentScalingQuantizer(" in repr(layer)
