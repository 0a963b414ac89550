"""The custom ops behind :class:`tetrt_support.quant.linear.Linear`, and how quantized
tensors cross them.

The forward and backward ops take and return quantized tensors as lists of plain buffers,
never alias an input, make the column-wise layouts only when the backward needs them (as
TE's ``_Linear``), and never mutate the quantizers passed in. :func:`linear_ops` makes one
op pair per quantizer classes and fake-impl strategy. Reasons: ``docs/architecture.md``
("Module notes", the Linear's custom ops).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tetrt_support.quant import numerics
from tetrt_support.quant.base import functional_all_reduce_max
from tetrt_support.quant.fake_impls import FakeImplStrategy, get_strategy

if TYPE_CHECKING:
    from tetrt_support.quant.base import QuantizedTensor, Quantizer

OP_NAMESPACE = "tetrt_quant"


# ------------------------------------------------------------------------ usages
_USAGE_VARIANTS: dict[tuple[Any, ...], Quantizer] = {}


def with_usage(quantizer: Quantizer, *, rowwise: bool = True, columnwise: bool) -> Quantizer:
    """``quantizer`` if it already makes exactly these layouts, else an equal-valued copy
    that does (``quantizer`` itself is never changed: it may be a compiled graph's guarded
    constant, or shared).

    Copies of value quantizers are kept per (value, usage), frozen (shared, so nothing may
    change them; ``quantize`` then shares rather than copies them too): rebuilding derived
    state on every call would cost (NVFP4's Hadamard matrix: about 0.2 ms of host time per
    copy). They are built outside any fake mode, so a copy first made inside a fake impl
    holds real tensors. An identity quantizer (live state) is copied afresh each time."""
    if quantizer.rowwise_usage == rowwise and quantizer.columnwise_usage == columnwise:
        return quantizer
    key = (quantizer._value_key(), rowwise, columnwise) if quantizer._value_fields() is not None else None
    variant = _USAGE_VARIANTS.get(key) if key is not None else None
    if variant is None:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            variant = quantizer.copy()
        variant.set_usage(rowwise=rowwise, columnwise=columnwise)
        if key is not None:
            _USAGE_VARIANTS[key] = variant.freeze()
    return variant


# ------------------------------------------------------------------ flat protocol (eager)
def flatten_quantized(tensor: QuantizedTensor) -> list[torch.Tensor]:
    """``tensor``'s inner buffers in flatten order. Eager code only: in a Dynamo trace use
    the strategy's ``flat_buffers`` (``__tensor_flatten__`` graph-breaks there)."""
    names, _ = tensor.__tensor_flatten__()
    return [getattr(tensor, name) for name in names]


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def _without_aliases(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """``outputs`` with any tensor that shares storage with an input or an earlier output
    cloned: a custom op may not return aliases (torch.library checks this)."""
    seen = {_storage_key(t) for t in inputs if t is not None and t.numel() > 0}
    fresh = []
    for t in outputs:
        if t.numel() == 0:
            # No address tells an empty tensor's storage apart (data_ptr 0), but torch.library
            # compares storages, and quantizers alias empty buffers (an empty tensor is
            # contiguous in any layout, so Float8's ``_transpose = data.movedim(..).contiguous()``
            # IS a view of ``_data``). A fresh empty tensor costs nothing.
            t = t.clone()
        elif _storage_key(t) in seen:
            t = t.clone()
        else:
            seen.add(_storage_key(t))
        fresh.append(t)
    return fresh


# --------------------------------------------------------------------------- GEMMs
def _tensorwise_fp8(t: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(data, scale_inv) of a per-tensor scaled row-wise FP8 tensor, else None."""
    from tetrt_support.quant.float8_tensor import Float8Tensor

    if isinstance(t, Float8Tensor) and t._data is not None and t._scale_inv.numel() == 1:
        return t._data, t._scale_inv.reshape(())
    return None


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def quantized_matmul(
    a: QuantizedTensor,
    b: QuantizedTensor,
    *,
    transpose_a: bool,
    transpose_b: bool,
    out_dtype: torch.dtype = torch.float32,
    layout_a: str | None = None,
    layout_b: str | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``op(a) @ op(b)`` of two 2-D quantized tensors (``op`` = transpose or not).

    ``layout_a`` / ``layout_b`` name the quantized copy each operand is read from, as TE's
    GEMMs pick them: fprop row-wise x row-wise, dgrad row-wise grad x column-wise weight,
    wgrad column-wise grad x column-wise input (None: the first copy present).

    The FP8 GEMM writes ``out_dtype`` directly; the emulated path returns fp32.
    ``fast_accum`` is ``torch._scaled_mm``'s ``use_fast_accum`` for per-tensor FP8 operands
    (TE's ``use_split_accumulator=False``; a CPU ignores it); the block formats' GEMMs have none.

    Per-tensor FP8 operands go through :func:`numerics.tensorwise_fp8_mm` (``torch._scaled_mm``
    on a GPU, the same definition on the fp32 GEMM on the CPU; a per-tensor scale makes the
    transposes exact). Block-scaled formats (FP8 blockwise, MXFP8, NVFP4) are dequantized
    and multiplied in fp32 here:
    TransformerEngine calls cuBLASLt's block-scaled GEMMs instead, which were not run here.
    NVFP4 leaves its per-tensor factors out of the operands and applies them to the
    product, as TE's alpha does (:func:`_nvfp4_matmul`).
    """
    from tetrt_support.quant.kernels.dispatch import fast_matmul  # the GPU's GEMMs; None -> the reference

    fast = fast_matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b, out_dtype=out_dtype,
                       layout_a=layout_a, layout_b=layout_b, fast_accum=fast_accum)
    if fast is not None:
        return fast
    fa, fb = _tensorwise_fp8(a), _tensorwise_fp8(b)
    if fa is not None and fb is not None:
        (a_data, a_scale), (b_data, b_scale) = fa, fb
        lhs = a_data.t().contiguous() if transpose_a else a_data.contiguous()
        rhs = b_data.t() if transpose_b else b_data
        rhs = rhs if rhs.stride(0) == 1 else _column_major(rhs)  # cuBLASLt wants a column-major mat2
        # out_dtype straight from cuBLASLt's GEMM: an fp32 result and a separate cast would be
        # two more passes over the output (at 8192^2 as much traffic as quantizing an operand).
        return numerics.tensorwise_fp8_mm(lhs, rhs, a_scale, b_scale, out_dtype, use_fast_accum=fast_accum)
    nvfp4 = _nvfp4_matmul(a, b, transpose_a, transpose_b, layout_a, layout_b)
    if nvfp4 is not None:
        return nvfp4
    lhs = a.dequantize(torch.float32, layout=layout_a)
    rhs = b.dequantize(torch.float32, layout=layout_b)
    return (lhs.t() if transpose_a else lhs) @ (rhs.t() if transpose_b else rhs)


def _nvfp4_matmul(a: QuantizedTensor, b: QuantizedTensor, transpose_a: bool, transpose_b: bool,
                  layout_a: str | None, layout_b: str | None) -> torch.Tensor | None:
    """Two NVFP4 operands as TE's GEMM takes them: the fp32 product of the block-scaled values,
    then TE's alpha from the two per-tensor amaxes (an infinite amax: +-inf outputs, NaN
    where the product is 0, as in TE -- not the NaN everywhere that multiplying dequantized
    operands, 0 * inf in every row, would give). None for anything else (row-scaled amaxes:
    TE's separate path)."""
    from tetrt_support.quant.nvfp4_tensor import NVFP4Tensor

    if not (isinstance(a, NVFP4Tensor) and isinstance(b, NVFP4Tensor)):
        return None
    (lhs, amax_a), (rhs, amax_b) = a._quantizer.gemm_operand(a, layout_a), b._quantizer.gemm_operand(b, layout_b)
    if amax_a.numel() != 1 or amax_b.numel() != 1:
        return None
    alpha = numerics.nvfp4_gemm_alpha(amax_a, amax_b, float(a._quantizer.nvfp4_e4m3_max), float(b._quantizer.nvfp4_e4m3_max))
    return ((lhs.t() if transpose_a else lhs) @ (rhs.t() if transpose_b else rhs)) * alpha


# -------------------------------------------------------------------- op schemas
def opaque_type_name(cls: type) -> str:
    """The schema type name under which ``cls`` was registered as an opaque type."""
    try:
        from torch._library import opaque_object
    except ImportError as err:  # torch < 2.11
        raise RuntimeError(f"torch {torch.__version__} has no opaque-object API; quant.Linear needs torch >= 2.11") from err
    # torch 2.14 renamed is_opaque_type (now deprecated, and logging so) to is_custom_class.
    is_registered = getattr(opaque_object, "is_custom_class", None) or opaque_object.is_opaque_type
    if not is_registered(cls):
        raise TypeError(
            f"{cls.__name__} is not registered as an opaque type, so it cannot be a custom-op argument; "
            "register it with tetrt_support.quant's value-opaque registration first"
        )
    return opaque_object.get_opaque_type_name(cls)


def _tag(cls: type) -> str:
    return re.sub(r"\W", "_", cls.__name__).lower()


@dataclass(frozen=True)
class LinearOps:
    """The forward and backward custom ops of one (quantizer classes, fake impl) pairing."""

    forward: Any  # torch._library.custom_ops.CustomOpDef
    backward: Any
    fake_impl: str


def _forward_impl(strategy: FakeImplStrategy):
    def forward(x, weight, bias, weight_cache, input_quantizer, weight_quantizer, grad_quantizer,
                input_columnwise, weight_columnwise, fast_accum, input_amax, amax_group):
        del grad_quantizer, amax_group  # inputs only so that setup_context sees them
        x_q = with_usage(input_quantizer, columnwise=input_columnwise).quantize(x, **_amax_option(input_amax))
        w_quantizer = with_usage(weight_quantizer, columnwise=weight_columnwise)
        if weight_cache:
            w_q = strategy.reassemble(strategy.fake_quantized(w_quantizer, weight.shape, weight.dtype, "meta"), weight_cache)
        else:
            w_q = w_quantizer.quantize(weight)
        out = quantized_matmul(x_q, w_q, transpose_a=False, transpose_b=True, layout_a="rowwise", layout_b="rowwise",
                               out_dtype=x.dtype if bias is None else torch.float32, fast_accum=fast_accum[0])
        if bias is not None:
            out = out + bias.float()
        x_flat = flatten_quantized(x_q) if input_columnwise else []  # saved only for wgrad, as TE's
        w_flat = [] if weight_cache else flatten_quantized(w_q)
        inputs = [x, weight, bias, *weight_cache]
        fresh = _without_aliases([*x_flat, *w_flat], inputs)
        return out.to(x.dtype), fresh[: len(x_flat)], fresh[len(x_flat) :]

    return forward


def _forward_fake(strategy: FakeImplStrategy):
    def forward(x, weight, bias, weight_cache, input_quantizer, weight_quantizer, grad_quantizer,
                input_columnwise, weight_columnwise, fast_accum, input_amax, amax_group):
        del bias, grad_quantizer, fast_accum, input_amax, amax_group
        out = x.new_empty((x.shape[0], weight.shape[0]))
        x_flat = []
        if input_columnwise:  # saved for wgrad: both layouts
            x_quantizer = with_usage(input_quantizer, columnwise=True)
            x_flat = strategy.flat_fake(strategy.fake_quantized(x_quantizer, x.shape, x.dtype, x.device))
        if weight_cache:
            return out, x_flat, []
        w_value = strategy.fake_quantized(with_usage(weight_quantizer, columnwise=weight_columnwise),
                                          weight.shape, weight.dtype, weight.device)
        return out, x_flat, strategy.flat_fake(w_value)

    return forward


def _amax_option(amax: torch.Tensor | None) -> dict[str, Any]:
    """The quantize option for an amax the caller already all-reduced over its group."""
    return {} if amax is None else {"tensor_amax": amax}


def _check_backward_layouts(
    compute_dgrad: bool, compute_wgrad: bool, input_columnwise: bool, weight_columnwise: bool
) -> None:
    """A gradient is computed only from the copy TE's GEMM reads; if the forward did not
    make that copy, say which one and why, rather than read another."""
    if compute_wgrad and not input_columnwise:
        raise RuntimeError(
            "quantized Linear backward: the weight gradient (wgrad GEMM) reads the input's column-wise copy, but the "
            "forward did not make it (input_columnwise=False: it ran with gradients disabled or with a weight that "
            "did not require grad); run the forward with input_columnwise=True"
        )
    if compute_dgrad and not weight_columnwise:
        raise RuntimeError(
            "quantized Linear backward: the input gradient (dgrad GEMM) reads the weight's column-wise copy, but the "
            "forward did not make it (weight_columnwise=False: it ran with gradients disabled or with an input that "
            "did not require grad); run the forward with weight_columnwise=True"
        )


def _grad_quantizer_for(grad_quantizer: Quantizer, compute_wgrad: bool, has_bias: bool) -> Quantizer:
    """TE's backward: the output gradient is always quantized row-wise (dgrad's operand;
    TE's kernels cannot make a column-wise copy alone) and column-wise for wgrad, or when
    the layer has a bias (TE's fused quantize-and-dbias kernel has no row-wise-only form
    before Blackwell, so TE keeps both there)."""
    return with_usage(grad_quantizer, columnwise=compute_wgrad or has_bias)


def _backward_impl(strategy: FakeImplStrategy):
    def backward(grad_output, input_buffers, weight_buffers, input_quantizer, weight_quantizer, grad_quantizer,
                 input_shape, weight_shape, dtype, has_bias, compute_dgrad, compute_wgrad,
                 input_columnwise, weight_columnwise, fast_accum, grad_amax):
        _check_backward_layouts(compute_dgrad, compute_wgrad, input_columnwise, weight_columnwise)
        g_q = _grad_quantizer_for(grad_quantizer, compute_wgrad, has_bias).quantize(grad_output.contiguous(),
                                                                                   **_amax_option(grad_amax))
        # TE's operand layouts: dgrad reads the weight column-wise, wgrad both operands
        # column-wise (quantized along the tokens; where NVFP4's RHT applies).
        dgrad = wgrad = None
        if compute_dgrad:
            w_quantizer = with_usage(weight_quantizer, columnwise=weight_columnwise)
            w_q = strategy.reassemble(strategy.fake_quantized(w_quantizer, weight_shape, dtype, "meta"), weight_buffers)
            dgrad = quantized_matmul(g_q, w_q, transpose_a=False, transpose_b=False, out_dtype=dtype,
                                     layout_a="rowwise", layout_b="columnwise", fast_accum=fast_accum[1]).to(dtype)
        if compute_wgrad:
            x_quantizer = with_usage(input_quantizer, columnwise=True)
            x_q = strategy.reassemble(strategy.fake_quantized(x_quantizer, input_shape, dtype, "meta"), input_buffers)
            wgrad = quantized_matmul(g_q, x_q, transpose_a=True, transpose_b=False, out_dtype=dtype,
                                     layout_a="columnwise", layout_b="columnwise", fast_accum=fast_accum[2]).to(dtype)
        dbias = grad_output.sum(0).to(dtype) if has_bias else None
        return dgrad, wgrad, dbias

    return backward


def _backward_fake(grad_output, input_buffers, weight_buffers, input_quantizer, weight_quantizer, grad_quantizer,
                   input_shape, weight_shape, dtype, has_bias, compute_dgrad, compute_wgrad,
                   input_columnwise, weight_columnwise, fast_accum, grad_amax):
    del fast_accum, grad_amax
    _check_backward_layouts(compute_dgrad, compute_wgrad, input_columnwise, weight_columnwise)
    dgrad = grad_output.new_empty(tuple(input_shape), dtype=dtype) if compute_dgrad else None
    wgrad = grad_output.new_empty(tuple(weight_shape), dtype=dtype) if compute_wgrad else None
    dbias = grad_output.new_empty((weight_shape[0],), dtype=dtype) if has_bias else None
    return dgrad, wgrad, dbias


def _setup_context(ctx, inputs, output) -> None:
    (x, weight, bias, weight_cache, input_quantizer, weight_quantizer, grad_quantizer,
     input_columnwise, weight_columnwise, fast_accum, input_amax, amax_group) = inputs
    del input_amax
    _, x_flat, w_flat = output
    # The cached weight came in as an input: save THAT, it was (rightly) not returned.
    w_saved = list(w_flat) if w_flat else list(weight_cache)
    ctx.save_for_backward(*x_flat, *w_saved)
    ctx.mark_non_differentiable(*x_flat, *w_flat)
    ctx.n_input_buffers = len(x_flat)
    ctx.n_cache = len(weight_cache)
    ctx.quantizers = (input_quantizer, weight_quantizer, grad_quantizer)
    ctx.columnwise = (input_columnwise, weight_columnwise)
    ctx.fast_accum = list(fast_accum)
    ctx.input_shape = tuple(x.shape)
    ctx.weight_shape = tuple(weight.shape)
    ctx.dtype = x.dtype
    ctx.has_bias = bias is not None
    ctx.amax_group = amax_group


def _autograd_backward(backward_op):
    def backward(ctx, grad_output, grad_x_flat, grad_w_flat):
        del grad_x_flat, grad_w_flat  # quantized buffers are not differentiable
        saved = ctx.saved_tensors
        n = ctx.n_input_buffers
        # TE's _Linear.backward: dgrad only for an input that requires grad, wgrad only for
        # a weight that does (None is the gradient autograd expects for the others).
        compute_dgrad, compute_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # The output gradient's amax, all-reduced over the Linear's group here, outside the
        # op: a functional collective, so under torch.compile a node of the backward graph.
        grad_amax = None
        if ctx.amax_group is not None:
            grad_amax = functional_all_reduce_max(numerics.amax(grad_output), ctx.amax_group)
        dgrad, wgrad, dbias = backward_op(
            grad_output, list(saved[:n]), list(saved[n:]), *ctx.quantizers,
            list(ctx.input_shape), list(ctx.weight_shape), ctx.dtype, ctx.has_bias,
            compute_dgrad, compute_wgrad, *ctx.columnwise, ctx.fast_accum, grad_amax,
        )
        return dgrad, wgrad, dbias, [None] * ctx.n_cache, None, None, None, None, None, None, None, None

    return backward


@functools.cache
def linear_ops(input_cls: type, weight_cls: type, grad_cls: type, fake_impl: str) -> LinearOps:
    """The (forward, backward) custom ops for these quantizer classes and fake-impl strategy."""
    strategy = get_strategy(fake_impl)
    qx, qw, qg = (opaque_type_name(c) for c in (input_cls, weight_cls, grad_cls))
    classes = (input_cls, weight_cls, grad_cls)
    suffix = "_".join((fake_impl, *(_tag(c) for c in (classes[:1] if len(set(classes)) == 1 else classes))))
    quantizers = f"{qx} input_quantizer, {qw} weight_quantizer, {qg} grad_quantizer"

    fwd = torch.library.custom_op(
        f"{OP_NAMESPACE}::linear_fwd_{suffix}",
        _forward_impl(strategy),
        mutates_args=(),
        schema=(
            f"(Tensor x, Tensor weight, Tensor? bias, Tensor[] weight_cache, {quantizers}, "
            "bool input_columnwise, bool weight_columnwise, bool[] fast_accum, Tensor? input_amax, str? amax_group) "
            "-> (Tensor, Tensor[], Tensor[])"
        ),
    )
    fwd.register_fake(_forward_fake(strategy))
    bwd = torch.library.custom_op(
        f"{OP_NAMESPACE}::linear_bwd_{suffix}",
        _backward_impl(strategy),
        mutates_args=(),
        schema=(
            f"(Tensor grad_output, Tensor[] input_buffers, Tensor[] weight_buffers, {quantizers}, "
            "SymInt[] input_shape, SymInt[] weight_shape, ScalarType dtype, bool has_bias, bool compute_dgrad, "
            "bool compute_wgrad, bool input_columnwise, bool weight_columnwise, bool[] fast_accum, Tensor? grad_amax) "
            "-> (Tensor?, Tensor?, Tensor?)"
        ),
    )
    bwd.register_fake(_backward_fake)
    fwd.register_autograd(_autograd_backward(bwd), setup_context=_setup_context)
    return LinearOps(fwd, bwd, fake_impl)
