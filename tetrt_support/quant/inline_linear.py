"""The quantized Linear's training step as ops a compiler can see into (``compile_as="inline"``).

Under ``torch.compile`` the custom-op Linear is two opaque graph nodes whose Python bodies
run on every call (usage copies, kernel dispatch, quantized-tensor construction, the
launchers). Where a recipe's quantization and GEMMs are plain ATen ops, the step can
instead be a ``torch.autograd.Function`` over plain tensors: Dynamo traces it, the
quantizer's settings become constants of the graph (Dynamo guards on the quantizer's
value, as it does for the custom ops' arguments), inductor fuses each quantization into
its own kernels and calls the GEMMs from its generated code, and no Python of this
package runs per call. The numerics are :mod:`~tetrt_support.quant.numerics` (the
reference) and the GEMM calls are the custom ops' own, so both paths give the same bytes.

Covered: FP8 current scaling (per-tensor scales, ``torch._scaled_mm``). Other recipes keep
the custom ops. Under torch 2.11's Dynamo a compiled step once got zero gradients (the
forward ended in a no-op ``.to``); that is fixed and checked on torch 2.11's CPU build
(``benchmarks/results/gpu_check_inline_torch211_cpu.json``), but not yet re-run on a GPU,
so ``compile_as="auto"`` keeps the custom ops on CUDA and an explicit ``"inline"`` there
warns (``docs/architecture.md`` says what to run).
What is saved for backward is what TransformerEngine keeps: the input's and the weight's
column-wise FP8 copies and their scales, not the high-precision tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import warnings

import torch

from tetrt_support.quant import numerics
from tetrt_support.quant.base import functional_all_reduce_max

#: device types where the inline step's whole-model gradients are checked (see the docstring)
VERIFIED_DEVICE_TYPES = ("cpu",)


def verified_on(device: torch.device | str) -> bool:
    """Whether ``compile_as="auto"`` may take the inline step for tensors on ``device``."""
    return torch.device(device).type in VERIFIED_DEVICE_TYPES


def warn_unverified(device: torch.device | str) -> None:
    """Warn that an explicit ``compile_as="inline"`` runs where the inline step is not verified."""
    warnings.warn(
        f"quant.Linear(compile_as='inline') on {torch.device(device).type}: the inline step is verified only on "
        f"{', '.join(VERIFIED_DEVICE_TYPES)}; a whole compiled model on CUDA got zero gradients under torch 2.11, "
        "fixed but not yet re-checked there (tetrt_support.quant.inline_linear's docstring); compile_as='auto' "
        "uses the custom ops there",
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


def supports_inline(quantizers: tuple[Any, Any, Any]) -> bool:
    """Whether (input, weight, grad) quantizers have an inline step: all FP8 current
    scaling, none holding a reduction group."""
    from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer

    return all(type(q) is Float8CurrentScalingQuantizer and "amax_reduction_group" not in vars(q) for q in quantizers)


def float8_plan(quantizers: tuple[Any, Any, Any], fast_accum: tuple[bool, bool, bool] = (False, False, False)) -> Float8Gemms:
    """The settings the inline step reads from (input, weight, grad) FP8 current-scaling
    quantizers (call inside the trace, so Dynamo guards on the quantizers' values)."""
    return Float8Gemms(
        dtypes=tuple(q.fp8_dtype for q in quantizers),  # type: ignore[arg-type]
        pow_2=tuple(q.force_pow_2_scales for q in quantizers),  # type: ignore[arg-type]
        epsilon=tuple(q.amax_epsilon for q in quantizers),  # type: ignore[arg-type]
        fast_accum=fast_accum,
    )


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
    """``lhs @ rhs_t.T`` of row-major FP8 matrices, as the custom ops' ``_scaled_mm`` call."""
    return torch._scaled_mm(lhs, rhs_t.t(), scale_a=lhs_scale, scale_b=rhs_scale, out_dtype=out_dtype,
                            use_fast_accum=fast)


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
        if ctx.needs_input_grad[0] and w_t is None:
            raise RuntimeError("inline quantized Linear: dgrad needs the weight's column-wise copy, which the forward "
                               "did not make (it ran with an input that did not require grad)")
        if ctx.needs_input_grad[1] and x_t is None:
            raise RuntimeError("inline quantized Linear: wgrad needs the input's column-wise copy, which the forward "
                               "did not make (it ran with a weight that did not require grad)")
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
