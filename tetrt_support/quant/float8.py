"""Per-tensor FP8 quantizers: delayed scaling (identity) and current scaling (value).

Both produce a :class:`~tetrt_support.quant.tensors.Float8Tensor`: FP8 data with one fp32
``scale_inv`` for the whole tensor. They differ in where the scale comes from:

- delayed scaling (:class:`Float8Quantizer`) uses a scale computed from the amax history
  of EARLIER steps and records this step's amax; the scale and history are live tensors
  that change between calls, so this quantizer keeps identity semantics;
- current scaling (:class:`Float8CurrentScalingQuantizer`) computes amax = max|x| of the
  tensor being quantized (optionally all-reduced over a process group passed per call)
  and scale = fp8_max / amax; it holds no state, so it has value semantics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from tetrt_support.quant import fused, numerics
from tetrt_support.quant.quantizer import BufferSpec, Quantizer
from tetrt_support.quant.tensors import Float8Tensor, QuantizedTensor


def _tensor_amax(x2d: torch.Tensor) -> torch.Tensor:
    if x2d.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x2d.device)
    return x2d.abs().amax().float()


def _all_reduce_max(amax: torch.Tensor, group: Any) -> torch.Tensor:
    """All-reduce (MAX) ``amax`` over ``group`` with torch.distributed; returns a new tensor."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("amax_reduction_group was given but torch.distributed is not initialized")
    reduced = amax.clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group)
    return reduced


class _PerTensorFloat8(Quantizer):
    """Shared layout of both per-tensor FP8 quantizers."""

    tensor_class = Float8Tensor
    fp8_dtype: torch.dtype

    def _check_dtype(self) -> None:
        if self.fp8_dtype not in numerics.FP8_DTYPES:
            raise ValueError(f"{type(self).__name__}: fp8_dtype must be one of {numerics.FP8_DTYPES}, got {self.fp8_dtype}")

    def _buffers_from_scale(self, x2d: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor | None]:
        data = numerics.cast_to_fp8(x2d, scale, self.fp8_dtype)
        return {
            "_data": data if self.rowwise_usage else None,
            "_transpose": data.t().contiguous() if self.columnwise_usage else None,
            "_scale_inv": (1.0 / scale).reshape(1).float(),
        }

    def _dequantize_2d(self, tensor: QuantizedTensor) -> torch.Tensor:
        data = tensor._data if tensor._data is not None else tensor._transpose.t()
        return data.float() * tensor._scale_inv

    def describe_buffers(self, shape: Sequence[int], *, device: torch.device | str = "cpu") -> BufferSpec:
        del device
        m, k = _rows_cols(shape)
        spec: BufferSpec = {}
        if self.rowwise_usage:
            spec["_data"] = ((m, k), self.fp8_dtype)
        if self.columnwise_usage:
            spec["_transpose"] = ((k, m), self.fp8_dtype)
        spec["_scale_inv"] = ((1,), torch.float32)
        return spec


def _rows_cols(shape: Sequence[int]) -> tuple[int, int]:
    if len(shape) == 0:
        raise ValueError("a quantized tensor needs at least one dimension")
    k = int(shape[-1])
    m = 1
    for s in shape[:-1]:
        m *= int(s)
    return m, k


class Float8CurrentScalingQuantizer(_PerTensorFloat8):
    """FP8 with the scale computed from this tensor's own amax (value semantics).

    ``quantize(x, amax_reduction_group=group)`` all-reduces the amax (MAX) over ``group``
    first, so every rank uses the same scale. The group is a per-call argument on
    purpose: a stored group is not part of the value, so a value quantizer holding one
    raises TypeError from ``_value_key`` (see :mod:`tetrt_support.quant.quantizer`).
    ``amax_reduction_group`` in the constructor exists only to show that failure.
    """

    _value_semantics = True
    _format_fields = ("fp8_dtype", "force_pow_2_scales", "amax_epsilon")
    # abs/amax are exact in the input's dtype and cast_to_fp8 upcasts itself: no fp32 copy.
    _upcasts_input: ClassVar[bool] = False

    def __init__(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = False,
        internal: bool = False,
        force_pow_2_scales: bool = False,
        amax_epsilon: float = 0.0,
        amax_reduction_group: Any = None,
    ) -> None:
        super().__init__(rowwise_usage=rowwise_usage, columnwise_usage=columnwise_usage, internal=internal)
        self.fp8_dtype = fp8_dtype
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)
        if amax_reduction_group is not None:  # deprecated: pass it per call
            self.amax_reduction_group = amax_reduction_group
        self._check_dtype()

    def compute_scale(self, x: torch.Tensor, *, amax_reduction_group: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(amax, scale) this quantizer would use for ``x`` (amax reduced over the group if given)."""
        amax = _tensor_amax(numerics.flatten_2d(x.detach()))
        group = amax_reduction_group if amax_reduction_group is not None else vars(self).get("amax_reduction_group")
        if group is not None:
            amax = _all_reduce_max(amax, group)
        scale = numerics.scale_from_amax(
            amax, numerics.fp8_max(self.fp8_dtype), power_of_2=self.force_pow_2_scales, epsilon=self.amax_epsilon
        )
        return amax, scale

    def _quantize_2d(self, x2d: torch.Tensor, *, amax_reduction_group: Any = None) -> dict[str, torch.Tensor | None]:
        group = amax_reduction_group if amax_reduction_group is not None else vars(self).get("amax_reduction_group")
        if group is None and fused.should_fuse(x2d):
            data, transpose, scale_inv = fused.compiled_current_scaling_buffers()(
                x2d, self.fp8_dtype, self.force_pow_2_scales, self.amax_epsilon, self.rowwise_usage, self.columnwise_usage
            )
            return {"_data": data, "_transpose": transpose, "_scale_inv": scale_inv}
        _, scale = self.compute_scale(x2d, amax_reduction_group=amax_reduction_group)
        return self._buffers_from_scale(x2d, scale)


class Float8Quantizer(_PerTensorFloat8):
    """FP8 delayed scaling: quantize with the CURRENT ``scale`` tensor, record this amax.

    Holds live tensors (``scale`` (1,) and ``amax_history`` (L,)) that ``quantize`` and
    :meth:`update_scale` mutate, so it keeps identity semantics: two delayed-scaling
    quantizers with equal settings are still different quantizers. ``copy()`` clones the
    tensors (a snapshot), it never shares them.
    """

    _format_fields = ("fp8_dtype", "margin", "amax_history_len", "amax_compute_algo")

    def __init__(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        rowwise_usage: bool = True,
        columnwise_usage: bool = False,
        internal: bool = False,
        margin: int = 0,
        amax_history_len: int = 16,
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

    def _quantize_2d(self, x2d: torch.Tensor) -> dict[str, torch.Tensor | None]:
        with torch.no_grad():
            self.amax_history[0] = torch.maximum(self.amax_history[0], _tensor_amax(x2d).to(self.amax_history.device))
        return self._buffers_from_scale(x2d, self.scale.to(x2d.device))

    def update_scale(self, *, amax_reduction_group: Any = None) -> torch.Tensor:
        """End of step: scale = (fp8_max / 2**margin) / amax from the history, then roll it."""
        with torch.no_grad():
            history = self.amax_history
            amax = history.amax() if self.amax_compute_algo == "max" else history[0]
            if amax_reduction_group is not None:
                amax = _all_reduce_max(amax, amax_reduction_group)
            max_value = numerics.fp8_max(self.fp8_dtype) / (2.0**self.margin)
            self.scale.copy_(numerics.scale_from_amax(amax, max_value).reshape(1))
            history.copy_(torch.roll(history, 1))
            history[0] = 0.0
        return self.scale
