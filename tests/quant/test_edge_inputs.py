"""Edge inputs: empty tensors, pickling and deep copies, NVFP4 with inf and huge finite values."""

from __future__ import annotations

import copy
import io
import math
import pickle

import numpy as np
import pytest
import torch

from tests.quant import te_reference
from tetrt_support.quant import (
    FAKE_IMPLS,
    RECIPES,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Linear,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
    get_recipe,
    numerics,
)
from tetrt_support.quant.ops import quantized_matmul

RHT = {"with_rht": True, "with_post_rht_amax": True}
CONFIGS = {
    "fp8_delayed": lambda **u: Float8Quantizer(**u),
    "fp8_current": lambda **u: Float8CurrentScalingQuantizer(**u),
    "fp8_current_e5m2_pow2": lambda **u: Float8CurrentScalingQuantizer(torch.float8_e5m2, force_pow_2_scales=True, **u),
    "fp8_block_2d": lambda **u: Float8BlockQuantizer(block_scaling_dim=2, **u),
    "fp8_block_1d": lambda **u: Float8BlockQuantizer(block_scaling_dim=1, **u),
    "mxfp8": lambda **u: MXFP8Quantizer(**u),
    "mxfp8_2d": lambda **u: MXFP8Quantizer(with_2d_quantization=True, **u),
    "mxfp8_swizzled": lambda **u: MXFP8Quantizer(optimize_for_gemm=True, **u),
    "nvfp4": lambda **u: NVFP4Quantizer(**u),
    "nvfp4_rht": lambda **u: NVFP4Quantizer(**RHT, **u),
    "nvfp4_rht_sr": lambda **u: NVFP4Quantizer(**RHT, stochastic_rounding=True, **u),
    "nvfp4_2d_swizzled": lambda **u: NVFP4Quantizer(with_2d_quantization=True, optimize_for_gemm=True, **u),
    "nvfp4_4over6": lambda **u: NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, **u),
    "nvfp4_row_scaled": lambda **u: NVFP4Quantizer(row_scaled_nvfp4=True, **u),
}
USAGES = [(True, True), (True, False), (False, True)]
EMPTY_2D = [(256, 0), (0, 256), (0, 0)]


def _quantizer(name: str, rowwise: bool, columnwise: bool):
    if name == "nvfp4_row_scaled" and not rowwise:
        pytest.skip("row-scaled NVFP4 requires row-wise usage (as TE)")
    return CONFIGS[name](rowwise_usage=rowwise, columnwise_usage=columnwise)


def _rup(n: int, m: int) -> int:
    return -(-n // m) * m


def te_layouts(q, m: int, k: int) -> dict[str, tuple[int, ...]]:
    """The buffer shapes TE allocates for an (m, k) tensor, restated from TE's Python
    ``get_scale_shape`` / ``get_columnwise_shape`` / ``inner_tensor_specs``
    (``pytorch/tensor/{float8,float8_blockwise,mxfp8,nvfp4}_tensor.py``) and, for per-tensor
    FP8, ``Float8Quantizer::create_tensor`` (``pytorch/csrc/quantizer.cpp``: ``_transpose`` is
    ``make_transpose_shape``, ``scale_inv`` is (1,)). Every formula is defined for 0-sized dims."""
    out: dict[str, tuple[int, ...]] = {}
    row, col = q.rowwise_usage, q.columnwise_usage
    if isinstance(q, (Float8Quantizer, Float8CurrentScalingQuantizer)):
        if row:
            out["_data"] = (m, k)
        if col:
            out["_transpose"] = (k, m)
        out["_scale_inv"] = (1,)
        return out
    if isinstance(q, Float8BlockQuantizer):
        if q.block_scaling_dim == 2:
            rs, cs = (-(-m // 128), _rup(-(-k // 128), 4)), (-(-k // 128), _rup(-(-m // 128), 4))
        else:
            rs, cs = (-(-k // 128), _rup(m, 4)), (-(-m // 128), _rup(k, 4))
        shapes = {"rowwise": ((m, k), rs), "columnwise": ((k, m), cs)}
    elif isinstance(q, MXFP8Quantizer):
        shapes = {"rowwise": ((m, k), (_rup(m, 128), _rup(k // 32, 4))),
                  "columnwise": ((m, k), (_rup(m // 32, 4), _rup(k, 128)))}
    else:
        shapes = {"rowwise": ((m, k // 2), (_rup(m, 128), _rup(-(-k // 16), 4))),
                  "columnwise": ((k, m // 2), (_rup(k, 128), _rup(-(-m // 16), 4)))}
    for layout, used in (("rowwise", row), ("columnwise", col)):
        if used:
            out[f"_{layout}_data"], out[f"_{layout}_scale_inv"] = shapes[layout]
    if isinstance(q, NVFP4Quantizer):
        if row:
            out["_amax_rowwise"] = (1,)
        if col:
            out["_amax_columnwise"] = (1,)
    return out


# ====================================================================== empty tensors
@pytest.mark.parametrize("shape", EMPTY_2D)
@pytest.mark.parametrize("usage", USAGES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_empty_tensor_quantizes_to_tes_empty_layouts(name: str, usage: tuple[bool, bool], shape: tuple[int, int]) -> None:
    """An empty input gives every layout the usage asks for, each buffer with the shape TE
    allocates (empty scale buffers included) and the dtype ``make_empty`` gives; it
    dequantizes, from each layout, to an empty tensor of the input's shape and dtype."""
    q = _quantizer(name, *usage)
    for dtype in (torch.bfloat16, torch.float32):
        t = q.quantize(torch.empty(shape, dtype=dtype))
        got = {n: (tuple(b.shape), b.dtype) for n, b in t.inner_buffers().items()}
        assert got == q.describe_buffers(shape)
        empty = q.make_empty(shape, dtype=dtype)
        assert got == {n: (tuple(b.shape), b.dtype) for n, b in empty.inner_buffers().items()}
        if name != "nvfp4_row_scaled":  # TE's column-wise amax is (1,) there; ours (K,)
            assert {n: s for n, (s, _) in got.items()} == te_layouts(q, *shape)
        assert t.shape == shape and t.dtype == dtype
        layouts = [lay for lay, used in zip(("rowwise", "columnwise"), usage) if used]
        for layout in [None, *layouts]:
            d = t.dequantize(layout=layout)
            assert d.shape == shape and d.dtype == dtype and d.numel() == 0


@pytest.mark.parametrize("shape", [(0, 4, 256), (4, 0, 256), (2, 128, 0), (0, 0, 0)])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_empty_nd_tensor_round_trips(name: str, shape: tuple[int, ...]) -> None:
    q = CONFIGS[name](rowwise_usage=True, columnwise_usage=name != "nvfp4_row_scaled")
    t = q.quantize(torch.empty(shape, dtype=torch.bfloat16))
    assert {n: (tuple(b.shape), b.dtype) for n, b in t.inner_buffers().items()} == q.describe_buffers(shape)
    assert t.dequantize().shape == shape


def test_empty_tensor_scalars_are_what_an_empty_amax_gives() -> None:
    """Nothing to scale: current scaling stores scale_inv 1 (TE leaves it uninitialised),
    delayed scaling 1 / scale (``create_tensor``: ``at::reciprocal(scale)``) and leaves its
    history alone (TE returns before the kernel); NVFP4's amaxes are 0."""
    for shape in EMPTY_2D:
        x = torch.empty(shape)
        assert Float8CurrentScalingQuantizer().quantize(x)._scale_inv.tolist() == [1.0]
        delayed = Float8Quantizer(scale=torch.tensor([4.0]))
        delayed.amax_history[0] = 3.0
        assert delayed.quantize(x)._scale_inv.tolist() == [0.25]
        assert delayed.amax_history[0].item() == 3.0 and delayed.amax_history[1:].eq(0).all()
        t = NVFP4Quantizer().quantize(x)
        assert t._amax_rowwise.tolist() == [0.0] and t._amax_columnwise.tolist() == [0.0]


# ========================================================================== pickling
def _round_trips():
    def pickled(obj):
        return pickle.loads(pickle.dumps(obj))

    def saved(obj, weights_only=False):
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=weights_only)

    return {"pickle": pickled, "torch.save": saved, "deepcopy": copy.deepcopy}


ROUND_TRIPS = _round_trips()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype.itemsize == 1 else t


def _assert_same_tensor(a: QuantizedTensor, b: QuantizedTensor) -> None:
    assert type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype and a.requires_grad == b.requires_grad
    assert a.__tensor_flatten__()[0] == b.__tensor_flatten__()[0]
    for (na, ba), (nb, bb) in zip(a.inner_buffers().items(), b.inner_buffers().items()):
        assert na == nb and ba.dtype == bb.dtype and ba.shape == bb.shape and torch.equal(_bytes(ba), _bytes(bb)), na
    qa, qb = a._quantizer, b._quantizer
    assert type(qa) is type(qb) and qa is not qb
    if isinstance(qa, Float8Quantizer):  # identity semantics: compare the fields
        assert all(torch.equal(getattr(qa, f), getattr(qb, f)) if isinstance(getattr(qa, f), torch.Tensor)
                   else getattr(qa, f) == getattr(qb, f) for f in ("fp8_dtype", "margin", "scale", "amax_history"))
    else:
        assert qa == qb and qa.is_frozen == qb.is_frozen
    if isinstance(qa, NVFP4Quantizer) and qa.with_rht:
        assert torch.equal(qa.rht_matrix, qb.rht_matrix)  # derived state rebuilt
    assert torch.equal(a.dequantize(), b.dequantize())


@pytest.mark.parametrize("trip", [*ROUND_TRIPS, "torch.load(weights_only=True)"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_quantized_tensor_round_trips_bitwise(name: str, trip: str) -> None:
    fn = (lambda t: ROUND_TRIPS["torch.save"](t, weights_only=True)) if trip.startswith("torch.load") else ROUND_TRIPS[trip]
    x = torch.randn(128, 256, dtype=torch.bfloat16)
    for frozen in (False, True):
        q = _quantizer(name, True, True)
        if frozen and not isinstance(q, Float8Quantizer):
            q.freeze()
        t = q.quantize(x)
        _assert_same_tensor(t, fn(t))
        rowwise_only = _quantizer(name, True, False).quantize(x)  # absent buffers stay absent
        _assert_same_tensor(rowwise_only, fn(rowwise_only))
    t = q.quantize(x).requires_grad_()
    _assert_same_tensor(t, fn(t))


def test_pickled_quantizer_drops_a_stored_process_group() -> None:
    """As TE's quantizers' ``__getstate__`` (the group cannot be pickled)."""
    t = Float8CurrentScalingQuantizer().quantize(torch.randn(16, 16))
    t._quantizer.amax_reduction_group = lambda: None  # an unpicklable stand-in for a group
    loaded = pickle.loads(pickle.dumps(t))
    assert "amax_reduction_group" not in vars(loaded._quantizer) and loaded._quantizer == t._quantizer
    assert torch.equal(_bytes(loaded._data), _bytes(t._data))
    assert "amax_reduction_group" not in vars(copy.deepcopy(t._quantizer))


def _step(layer: Linear, x: torch.Tensor, grad: torch.Tensor, **kwargs) -> tuple[torch.Tensor, ...]:
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    torch.manual_seed(11)  # NVFP4's stochastic rounding draws from the default generator
    y = layer(x, **kwargs)
    torch.manual_seed(12)
    y.backward(grad)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


@pytest.mark.parametrize("trip", list(ROUND_TRIPS))
@pytest.mark.parametrize("fake_impl", FAKE_IMPLS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_linear_round_trips_with_bitwise_forward_and_backward(recipe: str, fake_impl: str, trip: str) -> None:
    torch.manual_seed(0)
    layer = Linear(64, 32, recipe=recipe, fake_impl=fake_impl, dtype=torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    grad = torch.randn(32, 32, dtype=torch.bfloat16)
    layer(x, is_first_microbatch=True)  # a cached quantized weight travels too
    reference = copy.deepcopy(layer)
    copied = ROUND_TRIPS[trip](layer)
    assert type(copied) is Linear and copied.recipe == layer.recipe and copied.recipe.quantizers() == layer.recipe.quantizers()
    fields = ("input_quantizer", "weight_quantizer", "grad_quantizer")
    assert all(getattr(copied, f) == getattr(layer, f) for f in fields if not isinstance(getattr(layer, f), Float8Quantizer))
    _assert_same_tensor(layer._weight_cache, copied._weight_cache)
    for kwargs in ({}, {"is_first_microbatch": False}):
        want, got = _step(reference, x, grad, **kwargs), _step(copied, x, grad, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), kwargs
    with torch.no_grad():
        copied.weight.add_(1.0)  # a copy, not a view of the original
    assert not torch.equal(copied.weight, layer.weight)


def test_linear_with_replaced_quantizer_round_trips() -> None:
    torch.manual_seed(0)
    layer = Linear(64, 32, recipe="fp8_current", dtype=torch.bfloat16)
    layer.grad_quantizer = Float8CurrentScalingQuantizer(torch.float8_e4m3fn)
    copied = pickle.loads(pickle.dumps(layer))
    assert copied.recipe is None and copied.grad_quantizer == layer.grad_quantizer
    x, grad = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(_step(layer, x, grad), _step(copied, x, grad)))


def test_state_dict_holds_no_recipe_as_tes_stateless_recipes() -> None:
    """TE's ``get_extra_state`` (``pytorch/module/base.py``) stores the recipe only for a
    stateful one (delayed scaling): for Float8CurrentScaling, Float8BlockScaling,
    MXFP8BlockScaling and NVFP4BlockScaling (``is_stateless_recipe``, ``pytorch/_extra_state.py``)
    it returns an empty tensor. The recipes here are all stateless, and the state dict
    likewise holds only the parameters: loading it keeps the receiving layer's recipe."""
    torch.manual_seed(0)
    source = Linear(64, 32, recipe=get_recipe("nvfp4", disable_rht=True))
    assert set(source.state_dict()) == {"weight", "bias"}
    target = Linear(64, 32, recipe="fp8_current")
    target.load_state_dict(source.state_dict())
    assert str(target.recipe) == "fp8_current" and torch.equal(target.weight, source.weight)
    same = Linear(64, 32, recipe=get_recipe("nvfp4", disable_rht=True))
    same.load_state_dict(source.state_dict())
    assert same.recipe == source.recipe


def test_named_recipe_pickles_by_name_and_options() -> None:
    recipe = get_recipe("nvfp4", disable_rht=True, row_scaled_activation=True)
    loaded = pickle.loads(pickle.dumps(recipe))
    assert loaded == recipe and str(loaded) == str(recipe) and loaded.quantizers() == recipe.quantizers()
    assert pickle.loads(pickle.dumps(get_recipe("fp8_current"))).fast_accum == get_recipe("fp8_current").fast_accum


# ======================================================================= NVFP4 edges
def _one_inf(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(3)).to(dtype)
    x[3, 5] = float("inf")
    return x


NVFP4_EDGES = {
    "one inf fp32": lambda: _one_inf(torch.float32),
    "one inf bf16": lambda: _one_inf(torch.bfloat16),
    "3e38 fp32": lambda: torch.full((256, 256), 3e38),
    "3e38 bf16": lambda: torch.full((256, 256), 3e38, dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", list(NVFP4_EDGES))
def test_nvfp4_inf_and_huge_inputs_match_te(case: str) -> None:
    """Quantized bytes and dequantized values are TE's, inf and NaN included.

    TE, ``common/cast/nvfp4/core_nvfp4.cuh``: the global encode scale of an infinite amax is
    1 (``compute_global_encode_scaling_factor_FP4``: 2688 / inf = 0 -> "If global amax is 0
    or infinity, return 1"), a block decode scale saturates at 448
    (``compute_decoding_scaling_factor``: ``fminf(S_dec_b, FLT_MAX)`` then the satfinite
    E4M3 cast), the inf element encodes as +6. ``dequantize_nvfp4.cuh`` multiplies
    ``scale * amax * factor_inv``: inf for an infinite amax, and for 448 * 3e38 (fp32
    overflow), so every value is +-inf, or NaN where the code is 0 -- as here."""
    x = NVFP4_EDGES[case]()
    t = NVFP4Quantizer().quantize(x)
    q = t._quantizer
    for layout, matrix in (("rowwise", x.float()), ("columnwise", x.float().t().contiguous())):
        codes, scales, amax = te_reference.nvfp4(matrix.numpy())
        assert np.array_equal(getattr(t, f"_{layout}_data").numpy(), codes)
        compact = q.compact_scale_inv(t, layout)
        assert np.array_equal(compact.view(torch.uint8).numpy(), scales.view(np.uint8))
        assert np.array_equal(getattr(t, f"_amax_{layout}").numpy(), amax)
        with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 and 448 * 3e38, as on the GPU
            want = te_reference.nvfp4_dequantize(codes, scales, amax)
        got = t.dequantize(torch.float32, layout=layout)
        got = got if layout == "rowwise" else got.t()
        assert np.array_equal(got.numpy(), want, equal_nan=True)
        assert not got.isfinite().any()  # TE's dequantize: nothing finite is left
    if case.startswith("3e38"):
        assert t._amax_rowwise.item() == pytest.approx(3e38, rel=1e-2) and t.dequantize(torch.float32).eq(math.inf).all()
        assert (numerics.unpack_fp4(t._rowwise_data) == 7).all() and t._rowwise_scale_inv.float().eq(448).all()
    else:
        values = t.dequantize(torch.float32)
        zero = numerics.unpack_fp4(t._rowwise_data) & 0x7 == 0
        assert torch.equal(values.isnan(), zero) and values[~zero].isinf().all()  # thousands of each
        assert values[3, 5].item() == math.inf and t._amax_rowwise.item() == math.inf


def test_nvfp4_gemm_alpha_is_tes() -> None:
    """``compute_nvfp4_per_tensor_scale_kernel`` (``common/recipe/nvfp4.cu``): alpha =
    amax_A * amax_B * (1 / (6 * 6 * fp8_max_A * fp8_max_B)), in fp32, left to right."""
    f32 = np.float32
    for a, b, ma, mb in ((3.0, 0.7, 448, 448), (1e-30, 1e30, 448, 256), (0.0, 5.0, 448, 448), (math.inf, 2.0, 448, 448)):
        want = f32(f32(a) * f32(b)) * (f32(1.0) / (f32(6.0) * f32(6.0) * f32(ma) * f32(mb)))
        got = numerics.nvfp4_gemm_alpha(torch.tensor([a]), torch.tensor([b]), ma, mb)
        assert got.dtype == torch.float32 and got.item() == float(want)


def test_nvfp4_linear_with_one_inf_gives_tes_infs_not_nan() -> None:
    """TE's NVFP4 GEMM multiplies the block-scaled operands and applies alpha to the fp32
    result (``cublaslt_gemm.cu`` via ``nvte_nvfp4_compute_per_tensor_scale``): one inf in the
    input makes alpha inf, so each output is +-inf with the sign of the block-scaled product
    (NaN only where that product is exactly 0) -- not NaN everywhere, which multiplying the
    dequantized operands (0 * inf in every row) gives."""
    torch.manual_seed(0)
    layer = Linear(256, 64, recipe="nvfp4", dtype=torch.bfloat16)
    x = _one_inf(torch.bfloat16)
    y = layer(x)
    xq, wq = layer.input_quantizer.quantize(x), layer.weight_quantizer.quantize(layer.weight.detach())
    product = (numerics.nvfp4_dequantize(xq._rowwise_data, xq._quantizer.compact_scale_inv(xq, "rowwise"), None).double()
               @ numerics.nvfp4_dequantize(wq._rowwise_data, wq._quantizer.compact_scale_inv(wq, "rowwise"), None).double().t())
    clear = product.abs() > 1e-3 * product.abs().max()
    assert not y.isnan().any() and y.isinf().all()
    assert torch.equal(torch.sign(y.double())[clear], torch.sign(product)[clear])
    # a finite input: the GEMM still equals the product of the dequantized operands
    finite = torch.randn(256, 256, dtype=torch.bfloat16)
    gemm = quantized_matmul(layer.input_quantizer.quantize(finite), wq, transpose_a=False, transpose_b=True,
                            layout_a="rowwise", layout_b="rowwise")
    reference = layer.input_quantizer.quantize(finite).dequantize(torch.float32) @ wq.dequantize(torch.float32).t()
    torch.testing.assert_close(gemm, reference, rtol=1e-5, atol=1e-5)
