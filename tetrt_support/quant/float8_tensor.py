"""Per-tensor FP8: delayed scaling (identity) and current scaling (value), and Float8Tensor.

Both quantizers produce a :class:`Float8Tensor` (FP8 data, one fp32 ``scale_inv``).
:class:`Float8Quantizer` (delayed scaling) casts with a scale from the amax history of earlier
steps, held in live tensors, so it keeps identity semantics;
:class:`Float8CurrentScalingQuantizer` computes ``fp8_max / amax`` of the tensor itself
(optionally all-reduced per call) and is a value type. Numerics:
:func:`~tetrt_support.quant.numerics.float8_current_scaling_quantize` and
:func:`~tetrt_support.quant.numerics.delayed_scaling_update`.
Its CUDA fast paths (quantize, GEMM) are registered at the end (:mod:`.kernels.dispatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tetrt_support.quant import fused, kernels, numerics
from tetrt_support.quant.base import BufferSpec, QuantizedTensor, Quantizer, all_reduce_max, as_dims
from tetrt_support.quant.dynamo import register_value_quantizer
from tetrt_support.quant.kernels import dispatch


class Float8Tensor(QuantizedTensor):
    """Per-tensor scaled FP8, in TE's layout: ``_data`` in the logical shape, ``_transpose``
    (the column-wise usage) with the last dim moved to the front ((K, M) for a matrix) and
    ``_scale_inv`` (1,) fp32, with x ~= data * scale_inv."""

    _FLATTEN_TENSOR_BUFFERS = ("_data", "_transpose", "_scale_inv")


def transpose_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """TE's column-wise shape of a per-tensor FP8 tensor: (d_n, d_1, ..., d_{n-1})."""
    shape = as_dims(shape)
    return shape if len(shape) <= 1 else (shape[-1], *shape[:-1])


class _PerTensorFloat8(Quantizer):
    """Shared layout of both per-tensor FP8 quantizers."""

    tensor_class = Float8Tensor
    fp8_dtype: torch.dtype

    def _check_dtype(self) -> None:
        numerics.check_fp8_dtype(self.fp8_dtype, type(self).__name__)

    def _layout_buffers(self, data2d: torch.Tensor, scale_inv: torch.Tensor, shape: tuple[int, ...]) -> dict[str, torch.Tensor | None]:
        data = data2d.reshape(shape)
        transpose = None
        if self.columnwise_usage:
            transpose = data if len(shape) <= 1 else data.movedim(-1, 0).contiguous()
        return {"_data": data if self.rowwise_usage else None, "_transpose": transpose, "_scale_inv": scale_inv}

    def _quantize_tensor(self, x: torch.Tensor, **options: Any) -> dict[str, torch.Tensor | None]:
        data2d, scale_inv = self._quantize_2d(numerics.flatten_2d(x), **options)
        return self._layout_buffers(data2d, scale_inv, tuple(x.shape))

    def _dequantize_2d(self, tensor: QuantizedTensor, layout: str | None = None) -> torch.Tensor:
        # One scale for the whole tensor: both layouts hold the same values.
        if layout not in (None, "rowwise", "columnwise"):
            raise ValueError(f"Float8Tensor.dequantize: layout must be 'rowwise', 'columnwise' or None, got {layout!r}")
        if tensor._data is not None:
            data = tensor._data
        else:
            data = tensor._transpose if tensor._transpose.dim() <= 1 else tensor._transpose.movedim(0, -1)
        return numerics.flatten_2d(data).float() * tensor._scale_inv

    def describe_buffers(self, shape: Sequence[int], *, device: torch.device | str = "cpu") -> BufferSpec:
        del device
        shape = as_dims(shape)
        spec: BufferSpec = {}
        if self.rowwise_usage:
            spec["_data"] = (shape, self.fp8_dtype)
        if self.columnwise_usage:
            spec["_transpose"] = (transpose_shape(shape), self.fp8_dtype)
        spec["_scale_inv"] = ((1,), torch.float32)
        return spec


@register_value_quantizer
class Float8CurrentScalingQuantizer(_PerTensorFloat8):
    """FP8 with the scale computed from this tensor's own amax (value semantics).

    ``quantize(x, amax_reduction_group=group)`` all-reduces the amax (MAX) over ``group``
    first, so every rank uses the same scale. The group is a per-call argument on
    purpose: a stored group is not part of the value, so a value quantizer holding one
    raises TypeError from ``_value_key`` (see :mod:`tetrt_support.quant.base`).
    ``amax_reduction_group`` in the constructor exists only to show that failure.
    """

    fp8_dtype: torch.dtype
    force_pow_2_scales: bool
    amax_epsilon: float

    def __init__(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = True,
        internal: bool = False,
        force_pow_2_scales: bool = False,
        amax_epsilon: float = 0.0,
        amax_reduction_group: Any = None,
    ) -> None:
        super().__init__(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage, internal=internal)
        self.fp8_dtype = fp8_dtype
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)
        if amax_reduction_group is not None:
            self.amax_reduction_group = amax_reduction_group
        self._check_dtype()

    def compute_scale(self, x: torch.Tensor, *, amax_reduction_group: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(amax, scale) this quantizer would use for ``x`` (amax reduced over the group if given)."""
        amax = numerics.amax(x)
        group = amax_reduction_group if amax_reduction_group is not None else vars(self).get("amax_reduction_group")
        if group is not None:
            amax = all_reduce_max(amax, group)
        scale = numerics.compute_scale_from_amax(
            amax, numerics.fp8_max(self.fp8_dtype), force_pow_2_scales=self.force_pow_2_scales, epsilon=self.amax_epsilon
        )
        return amax, scale

    def _quantize_2d(self, x2d: torch.Tensor, *, amax_reduction_group: Any = None,
                     tensor_amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(data (M, K), scale_inv (1,)). ``tensor_amax``: an amax the caller already reduced
        over its group (the quantized Linear's functional all-reduce), used instead of this
        tensor's own; not with ``amax_reduction_group`` (that would reduce twice)."""
        group = amax_reduction_group if amax_reduction_group is not None else vars(self).get("amax_reduction_group")
        if tensor_amax is not None:
            if group is not None:
                raise ValueError(f"{type(self).__name__}.quantize: give tensor_amax (already reduced) or "
                                 "amax_reduction_group, not both")
            data, scale_inv, _ = numerics.float8_current_scaling_quantize(
                x2d, self.fp8_dtype, force_pow_2_scales=self.force_pow_2_scales,
                amax_epsilon=self.amax_epsilon, tensor_amax=tensor_amax,
            )
            return data, scale_inv
        amax, _ = self.compute_scale(x2d, amax_reduction_group=group)
        data, scale_inv, _ = numerics.float8_current_scaling_quantize(
            x2d, self.fp8_dtype, force_pow_2_scales=self.force_pow_2_scales,
            amax_epsilon=self.amax_epsilon, tensor_amax=amax,
        )
        return data, scale_inv


class Float8Quantizer(_PerTensorFloat8):
    """FP8 delayed scaling: quantize with the CURRENT ``scale`` tensor, record this amax.

    Holds live tensors (``scale`` (1,) and ``amax_history`` (L,)) that ``quantize`` and
    :meth:`update_scale` mutate, so it keeps identity semantics: two delayed-scaling
    quantizers with equal settings are still different quantizers. ``copy()`` clones the
    tensors (a snapshot), it never shares them. The defaults are TE's ``DelayedScaling``
    recipe's (history of 1024, ``"max"``, margin 0).
    """

    fp8_dtype: torch.dtype
    margin: int
    amax_history_len: int
    amax_compute_algo: str
    scale: torch.Tensor
    amax_history: torch.Tensor

    def __init__(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = True,
        internal: bool = False,
        margin: int = 0,
        amax_history_len: int = 1024,
        amax_compute_algo: str = "max",
        scale: torch.Tensor | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage, internal=internal)
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"Float8Quantizer: amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}")
        if amax_history_len < 1:
            raise ValueError(f"Float8Quantizer: amax_history_len must be >= 1, got {amax_history_len}")
        self.fp8_dtype = fp8_dtype
        self.margin = int(margin)
        self.amax_history_len = int(amax_history_len)
        self.amax_compute_algo = amax_compute_algo
        self.scale = (torch.ones(1) if scale is None else scale.detach().float().reshape(1).clone()).to(device)
        self.amax_history = torch.zeros(self.amax_history_len, device=device)
        self._check_dtype()

    def copy(self) -> Float8Quantizer:
        new = super().copy()
        new.scale = self.scale.clone()
        new.amax_history = self.amax_history.clone()
        return new

    def _quantize_2d(self, x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            self.amax_history[0] = torch.maximum(self.amax_history[0], numerics.amax(x2d).to(self.amax_history.device))
        scale = self.scale.to(x2d.device)
        return numerics.cast_to_fp8(x2d, scale, self.fp8_dtype), torch.reciprocal(scale)

    def update_scale(self, *, amax_reduction_group: Any = None) -> torch.Tensor:
        """End of step: all-reduce the newest amax (if a group is given), then TE's update
        (:func:`~tetrt_support.quant.numerics.delayed_scaling_update`) in place."""
        with torch.no_grad():
            if amax_reduction_group is not None:
                self.amax_history[0] = all_reduce_max(self.amax_history[0], amax_reduction_group)
            max_value = numerics.fp8_max(self.fp8_dtype) * 2.0 ** (-self.margin)
            history, scale = numerics.delayed_scaling_update(
                self.amax_history, self.scale, max_value=max_value, amax_compute_algo=self.amax_compute_algo
            )
            self.amax_history.copy_(history)
            self.scale.copy_(scale)
        return self.scale


# ------------------------------------------------------------------ CUDA fast paths
# Delayed scaling (Float8Quantizer) has none: its quantize updates live tensors.
#: ``torch._scaled_mm`` on CUDA takes only GEMMs whose reduction and output-column dims are
#: multiples of this; a Linear's three GEMMs reduce over in_features, out_features and tokens.
SCALED_MM_MULTIPLE = 16

_CURRENT_SCALING_OPTIONS = frozenset({"amax_reduction_group", "tensor_amax"})


def current_scaling_route(quantizer: Float8CurrentScalingQuantizer, x: torch.Tensor,
                          options: dict[str, Any]) -> str | None:
    """Which fast path ``quantizer.quantize(x, **options)`` takes: ``"kernel"`` (the Triton
    kernels of :mod:`~tetrt_support.quant.kernels.float8`), ``"compiled"`` (the reference
    compiled by inductor, :mod:`~tetrt_support.quant.fused`) or None (the eager reference).

    The one decision of FP8 current scaling, the same on every device: an amax given or
    reduced over a group (per call or stored), an option the quantizer does not take (the
    reference names it), an empty tensor or a trace run the reference; then the kernels
    wherever they apply (:func:`~tetrt_support.quant.kernels.enabled`: CUDA, or the CPU
    under Triton's interpreter); else, on CUDA with Triton (inductor's CUDA backend), the
    compiled reference, also under ``TETRT_QUANT_KERNELS=0``. All three give the same bytes."""
    if set(options) - _CURRENT_SCALING_OPTIONS or any(v is not None for v in options.values()):
        return None
    if vars(quantizer).get("amax_reduction_group") is not None:
        return None
    if x.numel() == 0 or torch.compiler.is_compiling():
        return None
    if kernels.enabled(x):
        return "kernel"
    if x.is_cuda and kernels.triton_available():
        return "compiled"
    return None


@dispatch.QUANTIZE.register(Float8CurrentScalingQuantizer)
def _current_scaling_buffers(q: Float8CurrentScalingQuantizer, x: torch.Tensor, x2d: torch.Tensor,
                             options: dict[str, Any]) -> dict[str, torch.Tensor | None] | None:
    route = current_scaling_route(q, x, options)
    if route == "compiled":
        compiled = fused.compiled_current_scaling()
        data, scale_inv = compiled(x2d, q.fp8_dtype, q.force_pow_2_scales, q.amax_epsilon)
        return q._layout_buffers(data, scale_inv, tuple(x.shape))
    if route != "kernel":
        return None
    from tetrt_support.quant.kernels.float8 import current_scaling_quantize

    data, transpose, scale_inv, _ = current_scaling_quantize(
        x2d, q.fp8_dtype, force_pow_2_scales=q.force_pow_2_scales, amax_epsilon=q.amax_epsilon,
        rowwise=True, columnwise=q.columnwise_usage,
    )
    shape = tuple(x.shape)
    if transpose is not None and len(shape) > 2:
        transpose = transpose.reshape(shape[-1], *shape[:-1])
    return {"_data": data.reshape(shape) if q.rowwise_usage else None, "_transpose": transpose,
            "_scale_inv": scale_inv}


def _float8_parts(t: Float8Tensor, layout: str | None) -> dispatch.Parts | None:
    """(2-D data, scale_inv, None, layout) of the named copy (None: the first present):
    row-wise ``_data`` (M, K) or column-wise ``_transpose`` (K, M); None when absent or not 2-D."""
    names = {"rowwise": "_data", "columnwise": "_transpose"}
    for name in ([layout] if layout else ["rowwise", "columnwise"]):
        data = getattr(t, names[name], None)
        if data is not None:
            return (data, t._scale_inv, None, name) if data.dim() == 2 else None
    return None


@dispatch.GEMM.register(Float8Tensor)
def _tensorwise_mm(a: Float8Tensor, b: Float8Tensor, *, layout_a: str | None, layout_b: str | None,
                   transpose_a: bool, transpose_b: bool, out_dtype: torch.dtype,
                   fast_accum: bool) -> torch.Tensor | None:
    """``_scaled_mm(lhs row-major, rhs column-major)``; a per-tensor scale makes every
    transpose exact, so the other copy (or a transpose kernel) serves when one is missing."""
    both = dispatch.operands(a, b, layout_a, layout_b, _float8_parts)
    if both is None or a._scale_inv.numel() != 1 or b._scale_inv.numel() != 1:
        return None
    pa, pb = both
    from tetrt_support.quant.kernels.transpose import transpose_fp8

    def row_major(t: Float8Tensor, parts: dispatch.Parts, transposed: bool) -> torch.Tensor:
        """op(t) as a row-major matrix, from the stored copy ``parts`` (or the other one)."""
        data, layout = parts[0], parts[3]
        if (layout == "columnwise") == transposed:
            return data
        other = t._transpose if layout == "rowwise" else t._data
        if other is not None and other.dim() == 2:
            return other
        return transpose_fp8(data)

    lhs = row_major(a, pa, transpose_a)
    rhs_t = row_major(b, pb, not transpose_b)  # op(b)^T row-major == op(b) column-major
    if lhs.shape[1] % SCALED_MM_MULTIPLE or rhs_t.shape[0] % SCALED_MM_MULTIPLE:
        return None  # (M, K) @ (K, N) with K or N off the multiple: cuBLAS has no kernel
    return numerics.tensorwise_fp8_mm(lhs, rhs_t.t(), a._scale_inv.reshape(()), b._scale_inv.reshape(()),
                                      out_dtype, use_fast_accum=fast_accum)
