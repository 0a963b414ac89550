"""The quantized Linear's training step as ops a compiler can see into (``compile_as="inline"``).

Under ``torch.compile`` the custom-op Linear is two opaque graph nodes whose Python bodies
run on every call. Where a recipe's quantization and GEMMs are plain ATen ops, the step is
instead a ``torch.autograd.Function`` over plain tensors: Dynamo traces it, the
quantizers' settings become constants of the graph (guarded on their values), inductor
fuses each quantization into its own kernels and calls the GEMMs from generated code.
The numerics are :mod:`~tetrt_support.quant.numerics` (the reference) and the GEMMs are
the custom ops' own calls, so both paths give the same bytes.

Covered: FP8 current scaling (``torch._scaled_mm`` on CUDA, its definition on the fp32 GEMM
on CPU) and FP8 block scaling (1x128 input and grad, 1x128 or 128x128 weight; cuBLASLt's
blockwise GEMM on CUDA where every dim is a multiple of 128 and there is no bias, the fp32
reference GEMM on CPU). Others keep the
custom ops. Saved for backward: what TransformerEngine keeps, the input's and the weight's
column-wise FP8 copies and their scales. ``docs/architecture.md`` records which devices
each family is checked on (:data:`VERIFIED_DEVICE_TYPES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import warnings

import torch

from tetrt_support.quant import numerics
from tetrt_support.quant.base import functional_all_reduce_max

#: per recipe family, the device types where the inline step's whole-model gradients are
#: checked against the custom ops (``scripts/gpu_check.py --only inline,inline_decoder,inline_cases``;
#: CPU under torch 2.14 and 2.11: ``benchmarks/results/gpu_check_inline_torch211_cpu.json``;
#: CUDA on an H100 under torch 2.11: ``benchmarks/results/gpu_check_inline_cuda_h100.json``).
VERIFIED_DEVICE_TYPES: dict[str, tuple[str, ...]] = {"fp8_current": ("cpu", "cuda"), "fp8_block": ("cpu", "cuda")}


def verified_on(device: torch.device | str, family: str = "fp8_current") -> bool:
    """Whether ``compile_as="auto"`` may take ``family``'s inline step for tensors on ``device``."""
    return torch.device(device).type in VERIFIED_DEVICE_TYPES.get(family, ())


def warn_unverified(device: torch.device | str, family: str = "fp8_current") -> None:
    """Warn that an explicit ``compile_as="inline"`` runs where the inline step is not verified."""
    warnings.warn(
        f"quant.Linear(compile_as='inline') on {torch.device(device).type}: the {family} inline step is verified "
        f"only on {', '.join(VERIFIED_DEVICE_TYPES.get(family, ())) or 'no device'} (its compiled gradients checked "
        "against the custom ops'); compile_as='auto' uses the custom ops there",
        RuntimeWarning, stacklevel=3)


@dataclass(frozen=True)
class Float8Gemms:
    """Per-tensor FP8 settings of one Linear: a role's FP8 dtype, power-of-2 rounding and
    amax epsilon for (input, weight, grad), and whether each GEMM (fprop, dgrad, wgrad)
    accumulates in fast mode (``torch._scaled_mm``'s ``use_fast_accum``; TE's
    ``MMParams(use_split_accumulator=not fast)``)."""

    dtypes: tuple[torch.dtype, torch.dtype, torch.dtype]
    pow_2: tuple[bool, bool, bool]
    epsilon: tuple[float, float, float]
    fast_accum: tuple[bool, bool, bool] = (False, False, False)


@dataclass(frozen=True)
class BlockGemms:
    """FP8 block-scaling settings of one Linear for (input, weight, grad): each role's FP8
    dtype, block scaling dim (1: 1x128, 2: 128x128; the input and grad are 1x128, as the
    blockwise GEMM's first operand must be), power-of-2 rounding and amax epsilon."""

    dtypes: tuple[torch.dtype, torch.dtype, torch.dtype]
    block_dims: tuple[int, int, int]
    pow_2: tuple[bool, bool, bool]
    epsilon: tuple[float, float, float]


Plan = Float8Gemms | BlockGemms


def inline_family(quantizers: tuple[Any, Any, Any]) -> str | None:
    """The recipe family whose inline step (input, weight, grad) quantizers take, or None:
    ``"fp8_current"`` (all FP8 current scaling, no stored reduction group) or ``"fp8_block"``
    (all FP8 block scaling, 1x128 input and grad). Decided from their classes outside any
    trace: inside one, torch 2.11's Dynamo sees a value-opaque quantizer as an opaque
    object whose ``type()`` is not its class."""
    from tetrt_support.quant.float8_blockwise_tensor import Float8BlockQuantizer
    from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer

    if all(type(q) is Float8CurrentScalingQuantizer and "amax_reduction_group" not in vars(q) for q in quantizers):
        return "fp8_current"
    if (all(type(q) is Float8BlockQuantizer for q in quantizers)
            and quantizers[0].block_scaling_dim == 1 and quantizers[2].block_scaling_dim == 1):
        return "fp8_block"
    return None


def plan_for(quantizers: tuple[Any, Any, Any], family: str,
             fast_accum: tuple[bool, bool, bool] = (False, False, False)) -> Plan:
    """The settings ``family``'s inline step (:func:`inline_family`) reads from (input,
    weight, grad) quantizers (call inside the trace, so Dynamo guards on their values).
    The block formats' GEMM has no fast-accumulation mode (their recipe requires split
    accumulation), so ``fast_accum`` applies to FP8 current scaling only."""
    settings = {"dtypes": tuple(q.fp8_dtype for q in quantizers),
                "pow_2": tuple(q.force_pow_2_scales for q in quantizers),
                "epsilon": tuple(q.amax_epsilon for q in quantizers)}
    if family == "fp8_current":
        return Float8Gemms(**settings, fast_accum=fast_accum)  # type: ignore[arg-type]
    if family == "fp8_block":
        return BlockGemms(**settings, block_dims=tuple(q.block_scaling_dim for q in quantizers))  # type: ignore[arg-type]
    raise ValueError(f"plan_for: no inline step for family {family!r}; expected 'fp8_current' or 'fp8_block'")


def unfit(plan: Plan, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """Why the inline step cannot run this call (None: it can). On the CPU it runs any call.
    On CUDA, FP8 current scaling's ``torch._scaled_mm`` needs every dim (tokens, in and out
    features: each is a reduction or output-column dim of one of the three GEMMs) a multiple
    of 16; the block formats' GEMM (cuBLASLt's blockwise kernel, as the custom ops call it)
    needs bf16 operands, no bias (the custom ops take another GEMM for an fp32 output) and
    every dim a multiple of 128."""
    if not x2d.is_cuda:
        return None
    dims = {"tokens": x2d.shape[0], "in_features": weight.shape[1], "out_features": weight.shape[0]}
    if isinstance(plan, Float8Gemms):
        from tetrt_support.quant.float8_tensor import SCALED_MM_MULTIPLE

        odd = [f"{name}={size}" for name, size in dims.items() if size % SCALED_MM_MULTIPLE]
        return f"torch._scaled_mm on CUDA needs multiples of {SCALED_MM_MULTIPLE}: {', '.join(odd)}" if odd else None
    from tetrt_support.quant.kernels.gemm import BLOCK

    if x2d.dtype != torch.bfloat16:
        return f"the blockwise GEMM on CUDA takes bf16, the input is {str(x2d.dtype).removeprefix('torch.')}"
    if bias is not None:
        return "the blockwise GEMM on CUDA writes bf16, a bias needs the fp32 output"
    odd = [f"{name}={size}" for name, size in dims.items() if size % BLOCK != 0]
    return f"the blockwise GEMM on CUDA needs multiples of {BLOCK}: {', '.join(odd)}" if odd else None


def _quantize(x2d: torch.Tensor, dtype: torch.dtype, pow_2: bool, epsilon: float,
              group_name: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scale_inv ())``: the reference current-scaling quantization, traced; with
    ``group_name``, the amax all-reduced (MAX) over that group first (a functional
    collective, so a node of the compiled graph)."""
    tensor_amax = None
    if group_name is not None:
        tensor_amax = functional_all_reduce_max(numerics.amax(x2d), group_name)
    data, scale_inv, _ = numerics.float8_current_scaling_quantize(
        x2d, dtype, force_pow_2_scales=pow_2, amax_epsilon=epsilon, tensor_amax=tensor_amax
    )
    return data, scale_inv.reshape(())


def _gemm(lhs: torch.Tensor, lhs_scale: torch.Tensor, rhs_t: torch.Tensor, rhs_scale: torch.Tensor,
          out_dtype: torch.dtype, fast: bool) -> torch.Tensor:
    """``lhs @ rhs_t.T`` of row-major FP8 matrices, as the custom ops' GEMM
    (:func:`numerics.tensorwise_fp8_mm`)."""
    return numerics.tensorwise_fp8_mm(lhs, rhs_t.t(), lhs_scale, rhs_scale, out_dtype, use_fast_accum=fast)


def _check_saved(ctx: Any, x_t: torch.Tensor | None, w_t: torch.Tensor | None) -> None:
    """Refuse a backward the forward saved no copy for (it ran without grad for that operand)."""
    if ctx.needs_input_grad[0] and w_t is None:
        raise RuntimeError("inline quantized Linear: dgrad needs the weight's column-wise copy, which the forward "
                           "did not make (it ran with an input that did not require grad)")
    if ctx.needs_input_grad[1] and x_t is None:
        raise RuntimeError("inline quantized Linear: wgrad needs the input's column-wise copy, which the forward "
                           "did not make (it ran with a weight that did not require grad)")


class _Float8Linear(torch.autograd.Function):
    """``y = x @ W.T + b`` with per-tensor FP8 operands; the settings are plain constants."""

    @staticmethod
    def forward(ctx: Any, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                dtypes: tuple, pow_2: tuple, epsilon: tuple, fast_accum: tuple,
                input_columnwise: bool, weight_columnwise: bool, group_name: str | None) -> torch.Tensor:
        # The input's and the output gradient's amaxes reduce over the group, as TE's
        # amax_reduction_group; the weight's is its own (TE's too).
        x_data, x_scale = _quantize(x2d, dtypes[0], pow_2[0], epsilon[0], group_name)
        w_data, w_scale = _quantize(weight, dtypes[1], pow_2[1], epsilon[1])
        out_dtype = x2d.dtype if bias is None else torch.float32
        out = _gemm(x_data, x_scale, w_data, w_scale, out_dtype, fast_accum[0])
        if bias is not None:
            out = out + bias.float()
        # Only the copies backward reads, as TE saves them: wgrad reads x column-wise,
        # dgrad reads W column-wise (per-tensor scales make the transposes exact).
        x_t = x_data.t().contiguous() if input_columnwise else None
        w_t = w_data.t().contiguous() if weight_columnwise else None
        ctx.save_for_backward(x_t, x_scale, w_t, w_scale)
        ctx.settings = (dtypes[2], pow_2[2], epsilon[2], fast_accum[1], fast_accum[2])
        ctx.group_name = group_name
        ctx.has_bias = bias is not None
        ctx.dtype = x2d.dtype
        # No `.to` when the GEMM already wrote x's dtype: torch 2.11's Dynamo took the no-op
        # `.to` (which returns its input) for an output that needs no gradient, and the
        # compiled backward got zeros (benchmarks/results/gpu_check_inline_decoder_cuda.json;
        # torch 2.14 does not; tests/quant/test_inline_linear.py reproduces it on 2.11's CPU build).
        return out if out.dtype == x2d.dtype else out.to(x2d.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        x_t, x_scale, w_t, w_scale = ctx.saved_tensors
        grad_dtype, pow_2, epsilon, dgrad_fast, wgrad_fast = ctx.settings
        _check_saved(ctx, x_t, w_t)
        # What to compute is what the forward decided (TE's rule, from grad mode and
        # requires_grad, passed in as constants): dgrad where it saved the weight's
        # column-wise copy, wgrad where it saved the input's -- not ctx.needs_input_grad,
        # whose value inside a compiled graph is the tracer's to decide.
        compute_dgrad, compute_wgrad = w_t is not None, x_t is not None
        g = grad_output.contiguous()
        g_data, g_scale = _quantize(g, grad_dtype, pow_2, epsilon, ctx.group_name)
        dgrad = wgrad = None
        if compute_dgrad:  # row-wise grad x column-wise weight
            dgrad = _gemm(g_data, g_scale, w_t, w_scale, ctx.dtype, dgrad_fast).to(ctx.dtype)
        if compute_wgrad:  # column-wise grad x column-wise input
            wgrad = _gemm(g_data.t().contiguous(), g_scale, x_t, x_scale, ctx.dtype, wgrad_fast).to(ctx.dtype)
        dbias = grad_output.sum(0).to(ctx.dtype) if ctx.has_bias else None
        return dgrad, wgrad, dbias, None, None, None, None, None, None, None


def float8_linear(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, plan: Float8Gemms,
                  *, input_columnwise: bool, weight_columnwise: bool, group_name: str | None = None) -> torch.Tensor:
    """The inline step of a per-tensor FP8 Linear on a 2-D input (autograd-aware); the input's
    and the gradient's amaxes all-reduced over the group named ``group_name`` if given."""
    return _Float8Linear.apply(x2d, weight, bias, plan.dtypes, plan.pow_2, plan.epsilon, plan.fast_accum,
                               input_columnwise, weight_columnwise, group_name)


# ----------------------------------------------------------------- FP8 block scaling
def _block_shape(dim: int) -> tuple[int, int]:
    return (1, 128) if dim == 1 else (128, 128)


def _block_quantize(x2d: torch.Tensor, dtype: torch.dtype, dim: int, pow_2: bool, epsilon: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, compact scale_inv)``: the reference blockwise quantization, traced."""
    return numerics.float8_blockwise_quantize(x2d, dtype, *_block_shape(dim), force_pow_2_scales=pow_2,
                                              amax_epsilon=epsilon)


def _block_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, b_dim: int,
                out_dtype: torch.dtype) -> torch.Tensor:
    """``dequant(a) @ dequant(b).T`` for row-major FP8 ``a`` (M, K) with 1x128 scales and ``b``
    (N, K) with ``b_dim`` scales, as the custom ops compute it: cuBLASLt's blockwise GEMM on
    CUDA (writes ``out_dtype``), the fp32 product of the dequantized operands elsewhere."""
    if a.is_cuda:
        from tetrt_support.quant.kernels.gemm import blockwise_fp8_mm

        return blockwise_fp8_mm(a, a_scale, b, b_scale, b_two_d=b_dim == 2, out_dtype=out_dtype)
    lhs = numerics.float8_blockwise_dequantize(a, a_scale, 1, 128)
    rhs = numerics.float8_blockwise_dequantize(b, b_scale, *_block_shape(b_dim))
    return lhs @ rhs.t()


class _BlockLinear(torch.autograd.Function):
    """``y = x @ W.T + b`` with FP8 block-scaled operands; the settings are plain constants."""

    @staticmethod
    def forward(ctx: Any, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                dtypes: tuple, dims: tuple, pow_2: tuple, epsilon: tuple,
                input_columnwise: bool, weight_columnwise: bool) -> torch.Tensor:
        x_data, x_scale = _block_quantize(x2d, dtypes[0], dims[0], pow_2[0], epsilon[0])
        w_data, w_scale = _block_quantize(weight, dtypes[1], dims[1], pow_2[1], epsilon[1])
        out = _block_gemm(x_data, x_scale, w_data, w_scale, dims[1], x2d.dtype if bias is None else torch.float32)
        if bias is not None:
            out = out + bias.float()
        # TE's backward copies: wgrad reads x quantized along the tokens (x^T, 1x128), dgrad
        # reads W^T (a 128x128 copy is the row-wise one transposed, bytes and scales alike).
        x_t = x_t_scale = w_t = w_t_scale = None
        if input_columnwise:
            x_t, x_t_scale = _block_quantize(x2d.t().contiguous(), dtypes[0], dims[0], pow_2[0], epsilon[0])
        if weight_columnwise and dims[1] == 2:
            w_t, w_t_scale = w_data.t().contiguous(), w_scale.t().contiguous()
        elif weight_columnwise:
            w_t, w_t_scale = _block_quantize(weight.t().contiguous(), dtypes[1], dims[1], pow_2[1], epsilon[1])
        ctx.save_for_backward(x_t, x_t_scale, w_t, w_t_scale)
        ctx.settings = (dtypes, dims, pow_2, epsilon)
        ctx.has_bias = bias is not None
        ctx.dtype = x2d.dtype
        # no no-op `.to` at the end (see _Float8Linear.forward)
        return out if out.dtype == x2d.dtype else out.to(x2d.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        x_t, x_t_scale, w_t, w_t_scale = ctx.saved_tensors
        dtypes, dims, pow_2, epsilon = ctx.settings
        _check_saved(ctx, x_t, w_t)
        g = grad_output.contiguous()
        dgrad = wgrad = None
        if w_t is not None:  # row-wise grad (1x128 along N) x W^T
            g_data, g_scale = _block_quantize(g, dtypes[2], dims[2], pow_2[2], epsilon[2])
            dgrad = _block_gemm(g_data, g_scale, w_t, w_t_scale, dims[1], ctx.dtype).to(ctx.dtype)
        if x_t is not None:  # grad and input both quantized along the tokens
            gt_data, gt_scale = _block_quantize(g.t().contiguous(), dtypes[2], dims[2], pow_2[2], epsilon[2])
            wgrad = _block_gemm(gt_data, gt_scale, x_t, x_t_scale, dims[0], ctx.dtype).to(ctx.dtype)
        dbias = grad_output.sum(0).to(ctx.dtype) if ctx.has_bias else None
        return dgrad, wgrad, dbias, None, None, None, None, None, None


def linear(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, plan: Plan,
           *, input_columnwise: bool, weight_columnwise: bool, group_name: str | None = None) -> torch.Tensor:
    """The inline step of a quantized Linear on a 2-D input (autograd-aware); ``plan`` from
    :func:`plan_for`, and :func:`unfit` None for these tensors. ``group_name``: FP8 current
    scaling's amax reduction group (the block formats take none)."""
    if isinstance(plan, Float8Gemms):
        return float8_linear(x2d, weight, bias, plan, input_columnwise=input_columnwise,
                             weight_columnwise=weight_columnwise, group_name=group_name)
    if group_name is not None:
        raise ValueError("inline quantized Linear: FP8 block scaling takes no amax reduction group")
    return _BlockLinear.apply(x2d, weight, bias, plan.dtypes, plan.block_dims, plan.pow_2, plan.epsilon,
                              input_columnwise, weight_columnwise)
