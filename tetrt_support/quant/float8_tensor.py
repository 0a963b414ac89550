"""Per-tensor FP8: delayed scaling (identity) and current scaling (value), and Float8Tensor.

Both quantizers produce a :class:`Float8Tensor` (FP8 data, one fp32 ``scale_inv``).
:class:`Float8Quantizer` (delayed scaling) casts with a scale from the amax history of earlier
steps, held in live tensors, so it keeps identity semantics;
:class:`Float8CurrentScalingQuantizer` computes ``fp8_max / amax`` of the tensor itself
(optionally all-reduced per call) and is a value type. Numerics:
:func:`~tetrt_support.quant.numerics.float8_current_scaling_quantize` and
:func:`~tetrt_support.quant.numerics.delayed_scaling_update`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tetrt_support.quant import fused, numerics
from tetrt_support.quant.base import BufferSpec, QuantizedTensor, Quantizer, all_reduce_max, as_dims
from tetrt_support.quant.dynamo import register_value_quantizer


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
        if self.fp8_dtype not in numerics.FP8_DTYPES:
            raise ValueError(f"{type(self).__name__}: fp8_dtype must be one of {numerics.FP8_DTYPES}, got {self.fp8_dtype}")

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
        if group is None and fused.should_fuse(x2d):
            data, scale_inv = fused.compiled_current_scaling()(x2d, self.fp8_dtype, self.force_pow_2_scales, self.amax_epsilon)
        else:
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
