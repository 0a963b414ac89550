"""The custom ops behind :class:`tetrt_support.quant.linear.Linear`, and how quantized
tensors cross them.

Why custom ops: the quantize + GEMM of a quantized Linear is opaque to the compiler (on
a GPU it is a library kernel), so it enters a compiled graph as ONE node with a fake
impl for shape propagation and a registered autograd formula -- like TransformerEngine's
torch.compile path.

Why flat tensors: a quantized tensor subclass must not cross the custom-op boundary.
Returned directly from a custom op it comes back under ``aot_eager`` holding FakeTensor
buffers (silently wrong data), and taking it apart in traced code through
``__tensor_flatten__`` graph-breaks ("torch.* op returned non-Tensor"). So each op
returns the quantized tensors it saves as lists of plain tensors (their inner buffers in
flatten order) and takes them back the same way; the fake-impl STRATEGY
(:mod:`tetrt_support.quant.fake_impls`) says which buffers a quantizer makes without
running it, and reassembles buffers into a quantized tensor.

The aliasing rule: no output may alias an input or another output. The cached
quantized weight is therefore never returned when it came in: the forward op returns
weight buffers only when it quantized the weight itself, and the autograd
``setup_context`` saves the INPUT buffers otherwise (mark and reconstruct, not return
twice). :func:`_without_aliases` enforces the rule on whatever a quantizer returns.

Op schemas are explicit and name the quantizers' registered opaque types, so one pair
of ops exists per (input, weight, grad) quantizer classes and fake-impl strategy, made
on first use by :func:`linear_ops`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tetrt_support.quant.fake_impls import FakeImplStrategy, get_strategy

if TYPE_CHECKING:
    from tetrt_support.quant.base import QuantizedTensor

OP_NAMESPACE = "tetrt_quant"


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
        if t.numel() > 0 and _storage_key(t) in seen:
            t = t.clone()
        if t.numel() > 0:
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
) -> torch.Tensor:
    """``op(a) @ op(b)`` of two 2-D quantized tensors (``op`` = transpose or not).

    ``layout_a`` / ``layout_b`` name the quantized copy each operand is read from, as TE's
    GEMMs pick them: fprop row-wise x row-wise, dgrad row-wise grad x column-wise weight,
    wgrad column-wise grad x column-wise input (None: the first copy present).

    The FP8 GEMM writes ``out_dtype`` directly; the emulated path returns fp32.

    Per-tensor FP8 operands go through ``torch._scaled_mm`` (runs on CPU in torch >= 2.13;
    checked once on an H200 with torch 2.11, where it differs from the fp32 product of the
    dequantized operands only by accumulation order; a per-tensor scale makes the
    transposes exact). Block-scaled formats
    (FP8 blockwise, MXFP8, NVFP4) are dequantized and multiplied in fp32 here:
    TransformerEngine calls cuBLASLt's block-scaled GEMMs instead, which were not run here.
    """
    from tetrt_support.quant.kernels.dispatch import fast_matmul  # the GPU's GEMMs; None -> the reference

    fast = fast_matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b, out_dtype=out_dtype,
                       layout_a=layout_a, layout_b=layout_b)
    if fast is not None:
        return fast
    fa, fb = _tensorwise_fp8(a), _tensorwise_fp8(b)
    if fa is not None and fb is not None and hasattr(torch, "_scaled_mm"):
        (a_data, a_scale), (b_data, b_scale) = fa, fb
        lhs = a_data.t().contiguous() if transpose_a else a_data.contiguous()
        rhs = b_data.t() if transpose_b else b_data
        rhs = rhs if rhs.stride(0) == 1 else _column_major(rhs)  # cuBLASLt wants a column-major mat2
        # out_dtype straight from the GEMM: an fp32 result and a separate cast would be two
        # more passes over the output (at 8192^2 as much traffic as quantizing an operand).
        return torch._scaled_mm(lhs, rhs, scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype)
    lhs = a.dequantize(torch.float32, layout=layout_a)
    rhs = b.dequantize(torch.float32, layout=layout_b)
    return (lhs.t() if transpose_a else lhs) @ (rhs.t() if transpose_b else rhs)


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
    def forward(x, weight, bias, weight_cache, input_quantizer, weight_quantizer, grad_quantizer):
        del grad_quantizer  # an input only so that setup_context sees it
        x_q = input_quantizer.quantize(x)
        if weight_cache:
            w_q = strategy.reassemble(strategy.fake_quantized(weight_quantizer, weight.shape, weight.dtype, "meta"), weight_cache)
        else:
            w_q = weight_quantizer.quantize(weight)
        out = quantized_matmul(x_q, w_q, transpose_a=False, transpose_b=True, layout_a="rowwise", layout_b="rowwise",
                               out_dtype=x.dtype if bias is None else torch.float32)
        if bias is not None:
            out = out + bias.float()
        x_flat = flatten_quantized(x_q)
        w_flat = [] if weight_cache else flatten_quantized(w_q)
        inputs = [x, weight, bias, *weight_cache]
        fresh = _without_aliases([*x_flat, *w_flat], inputs)
        return out.to(x.dtype), fresh[: len(x_flat)], fresh[len(x_flat) :]

    return forward


def _forward_fake(strategy: FakeImplStrategy):
    def forward(x, weight, bias, weight_cache, input_quantizer, weight_quantizer, grad_quantizer):
        del bias, grad_quantizer
        out = x.new_empty((x.shape[0], weight.shape[0]))
        x_flat = strategy.flat_fake(strategy.fake_quantized(input_quantizer, x.shape, x.dtype, x.device))
        if weight_cache:
            return out, x_flat, []
        w_value = strategy.fake_quantized(weight_quantizer, weight.shape, weight.dtype, weight.device)
        return out, x_flat, strategy.flat_fake(w_value)

    return forward


def _backward_impl(strategy: FakeImplStrategy):
    def backward(grad_output, input_buffers, weight_buffers, input_quantizer, weight_quantizer, grad_quantizer,
                 input_shape, weight_shape, dtype, has_bias):
        x_q = strategy.reassemble(strategy.fake_quantized(input_quantizer, input_shape, dtype, "meta"), input_buffers)
        w_q = strategy.reassemble(strategy.fake_quantized(weight_quantizer, weight_shape, dtype, "meta"), weight_buffers)
        g_q = grad_quantizer.quantize(grad_output.contiguous())
        # TE's operand layouts: dgrad reads the weight column-wise, wgrad both operands
        # column-wise (quantized along the tokens; where NVFP4's RHT applies).
        dgrad = quantized_matmul(g_q, w_q, transpose_a=False, transpose_b=False, out_dtype=dtype,
                                 layout_a="rowwise", layout_b="columnwise").to(dtype)
        wgrad = quantized_matmul(g_q, x_q, transpose_a=True, transpose_b=False, out_dtype=dtype,
                                 layout_a="columnwise", layout_b="columnwise").to(dtype)
        dbias = grad_output.sum(0).to(dtype) if has_bias else None
        return dgrad, wgrad, dbias

    return backward


def _backward_fake(grad_output, input_buffers, weight_buffers, input_quantizer, weight_quantizer, grad_quantizer,
                   input_shape, weight_shape, dtype, has_bias):
    dgrad = grad_output.new_empty(tuple(input_shape), dtype=dtype)
    wgrad = grad_output.new_empty(tuple(weight_shape), dtype=dtype)
    dbias = grad_output.new_empty((weight_shape[0],), dtype=dtype) if has_bias else None
    return dgrad, wgrad, dbias


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, weight_cache, input_quantizer, weight_quantizer, grad_quantizer = inputs
    _, x_flat, w_flat = output
    # The cached weight came in as an input: save THAT, it was (rightly) not returned.
    w_saved = list(w_flat) if w_flat else list(weight_cache)
    ctx.save_for_backward(*x_flat, *w_saved)
    ctx.mark_non_differentiable(*x_flat, *w_flat)
    ctx.n_input_buffers = len(x_flat)
    ctx.n_cache = len(weight_cache)
    ctx.quantizers = (input_quantizer, weight_quantizer, grad_quantizer)
    ctx.input_shape = tuple(x.shape)
    ctx.weight_shape = tuple(weight.shape)
    ctx.dtype = x.dtype
    ctx.has_bias = bias is not None


def _autograd_backward(backward_op):
    def backward(ctx, grad_output, grad_x_flat, grad_w_flat):
        del grad_x_flat, grad_w_flat  # quantized buffers are not differentiable
        saved = ctx.saved_tensors
        n = ctx.n_input_buffers
        dgrad, wgrad, dbias = backward_op(
            grad_output, list(saved[:n]), list(saved[n:]), *ctx.quantizers,
            list(ctx.input_shape), list(ctx.weight_shape), ctx.dtype, ctx.has_bias,
        )
        return dgrad, wgrad, dbias, [None] * ctx.n_cache, None, None, None

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
        schema=f"(Tensor x, Tensor weight, Tensor? bias, Tensor[] weight_cache, {quantizers}) -> (Tensor, Tensor[], Tensor[])",
    )
    fwd.register_fake(_forward_fake(strategy))
    bwd = torch.library.custom_op(
        f"{OP_NAMESPACE}::linear_bwd_{suffix}",
        _backward_impl(strategy),
        mutates_args=(),
        schema=(
            f"(Tensor grad_output, Tensor[] input_buffers, Tensor[] weight_buffers, {quantizers}, "
            "SymInt[] input_shape, SymInt[] weight_shape, ScalarType dtype, bool has_bias) -> (Tensor, Tensor, Tensor?)"
        ),
    )
    bwd.register_fake(_backward_fake)
    fwd.register_autograd(_autograd_backward(bwd), setup_context=_setup_context)
    return LinearOps(fwd, bwd, fake_impl)
