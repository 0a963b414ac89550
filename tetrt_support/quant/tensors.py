"""Quantized tensors: traceable wrapper subclasses holding a format's buffers.

A QuantizedTensor looks like the high-precision tensor it stands for (its logical shape
and a "fake dtype", the original dtype) while holding the quantized buffers inside. It
is a traceable wrapper subclass (``__tensor_flatten__`` / ``__tensor_unflatten__``), so
torch.compile and AOTAutograd can take it apart into plain tensors and rebuild it.

What ``__torch_dispatch__`` does with an op on a quantized tensor:

- ``detach`` / ``alias``: a new wrapper over the same buffers (stays quantized);
- ``clone``: a wrapper over cloned buffers;
- ``_to_copy`` (``.to``): a change of device moves the buffers and a change among the
  high-precision dtypes changes the fake dtype -- both stay quantized; anything else
  dequantizes;
- ``copy_`` INTO a quantized tensor re-quantizes the source with the destination's
  quantizer (TransformerEngine's behaviour for parameters);
- any other op mutating a quantized argument raises (it would only update a temporary);
- everything else -- views on the logical tensor included -- runs on ``dequantize()``d
  arguments and returns plain tensors. Slower, never silently wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.utils._pytree as pytree

if TYPE_CHECKING:
    from tetrt_support.quant.quantizer import Quantizer

aten = torch.ops.aten
_HIGH_PRECISION = (torch.float32, torch.bfloat16, torch.float16)


def _mutated_args(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[Any]:
    """The argument values ``func`` writes to (from its schema's alias annotations)."""
    mutated = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if arg.kwarg_only or i >= len(args):
            if arg.name in kwargs:
                mutated.append(kwargs[arg.name])
        else:
            mutated.append(args[i])
    return mutated


class QuantizedTensor(torch.Tensor):
    """Base of the per-format subclasses; see the module docstring for op semantics."""

    # Every inner buffer a format can have, in flatten order (None buffers are skipped).
    _FLATTEN_TENSOR_BUFFERS: ClassVar[tuple[str, ...]] = ()
    _quantizer: Quantizer

    @staticmethod
    def __new__(
        cls,
        *,
        shape: torch.Size | tuple[int, ...],
        dtype: torch.dtype,
        quantizer: Quantizer,
        requires_grad: bool = False,
        **buffers: torch.Tensor | None,
    ) -> QuantizedTensor:
        unknown = set(buffers) - set(cls._FLATTEN_TENSOR_BUFFERS)
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown buffer(s) {sorted(unknown)}; expected {cls._FLATTEN_TENSOR_BUFFERS}")
        present = [b for b in buffers.values() if b is not None]
        if not present:
            raise ValueError(f"{cls.__name__}: needs at least one buffer, got none")
        if dtype not in _HIGH_PRECISION:
            raise TypeError(f"{cls.__name__}: fake dtype must be one of {_HIGH_PRECISION}, got {dtype}")
        self = torch.Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=dtype, device=present[0].device, requires_grad=requires_grad
        )
        for name in cls._FLATTEN_TENSOR_BUFFERS:
            setattr(self, name, buffers.get(name))
        self._quantizer = quantizer
        return self

    # ------------------------------------------------------------- flatten
    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        names = [name for name in self._FLATTEN_TENSOR_BUFFERS if getattr(self, name) is not None]
        return names, {"quantizer": self._quantizer, "dtype": self.dtype}

    @classmethod
    def __tensor_unflatten__(
        cls, inner: dict[str, torch.Tensor], ctx: dict[str, Any], outer_size: Any, outer_stride: Any
    ) -> QuantizedTensor:
        del outer_stride  # the wrapper is always contiguous in its logical shape
        return cls(shape=outer_size, dtype=ctx["dtype"], quantizer=ctx["quantizer"], **inner)

    # ----------------------------------------------------------- dequantize
    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:  # type: ignore[override]
        """The high-precision tensor this one stands for, in ``dtype`` (default: the fake dtype)."""
        x2d = self._quantizer._dequantize_2d(self)
        return x2d.reshape(self.shape).to(dtype or self.dtype)

    def inner_buffers(self) -> dict[str, torch.Tensor]:
        """The present inner buffers by name, in flatten order."""
        return {n: getattr(self, n) for n in self._FLATTEN_TENSOR_BUFFERS if getattr(self, n) is not None}

    def _rewrap(self, fn: Any, **overrides: Any) -> QuantizedTensor:
        buffers = {n: (None if b is None else fn(b)) for n, b in ((n, getattr(self, n)) for n in self._FLATTEN_TENSOR_BUFFERS)}
        args = {"shape": self.shape, "dtype": self.dtype, "quantizer": self._quantizer, **overrides}
        return type(self)(**args, **buffers)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}, quantizer={self._quantizer!r})"

    # ------------------------------------------------------------- dispatch
    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.alias.default):
            return args[0]._rewrap(func)
        if func is aten.clone.default:
            return args[0]._rewrap(lambda b: b.clone())
        if func is aten._to_copy.default and _to_copy_keeps_quantized(kwargs):
            src = args[0]
            device = kwargs.get("device")
            moved = src._rewrap(lambda b: b.to(device) if device is not None else b.clone(), dtype=kwargs.get("dtype") or src.dtype)
            return moved
        if func is aten.copy_.default and isinstance(args[0], QuantizedTensor):
            dst, src = args[0], args[1]
            if isinstance(src, QuantizedTensor):
                src = src.dequantize()
            fresh = dst._quantizer.quantize(src.to(dst.dtype).expand(dst.shape))
            for name in cls._FLATTEN_TENSOR_BUFFERS:
                mine, theirs = getattr(dst, name), getattr(fresh, name)
                if (mine is None) != (theirs is None):
                    raise RuntimeError(f"{type(dst).__name__}.copy_: buffer {name} present in one side only")
                if mine is not None:
                    mine.copy_(theirs)
            return dst
        for target in _mutated_args(func, args, kwargs):
            if isinstance(target, QuantizedTensor):
                raise NotImplementedError(
                    f"{func}: in-place ops on a {type(target).__name__} are not supported (they would only "
                    "update a dequantized temporary); dequantize() first, or copy_() into it to re-quantize"
                )

        def unwrap(t: Any) -> Any:
            return t.dequantize() if isinstance(t, QuantizedTensor) else t

        return func(*pytree.tree_map(unwrap, args), **pytree.tree_map(unwrap, kwargs))

    __torch_function__ = torch._C._disabled_torch_function_impl


def _to_copy_keeps_quantized(kwargs: dict) -> bool:
    dtype = kwargs.get("dtype")
    extra = set(kwargs) - {"dtype", "device", "layout", "pin_memory", "non_blocking", "memory_format"}
    return not extra and (dtype is None or dtype in _HIGH_PRECISION) and kwargs.get("layout") in (None, torch.strided)


class Float8Tensor(QuantizedTensor):
    """Per-tensor scaled FP8: ``_data`` (M, K) with M the product of the leading dims,
    ``_transpose`` ((K, M), the column-wise usage) and ``_scale_inv`` (1,) fp32, with
    x ~= data * scale_inv. (TransformerEngine keeps ``_data`` in the logical shape.)"""

    _FLATTEN_TENSOR_BUFFERS = ("_data", "_transpose", "_scale_inv")


class Float8BlockwiseTensor(QuantizedTensor):
    """FP8 with fp32 scales per 1x128 or 128x128 block; row-wise data (M, K), column-wise
    data (K, M) = the quantized transpose, each with its own scale_inv grid."""

    _FLATTEN_TENSOR_BUFFERS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


class MXFP8Tensor(QuantizedTensor):
    """MXFP8: FP8 data with one E8M0 exponent (uint8, biased by 127) per 1x32 block;
    column-wise data is the quantized transpose (K, M)."""

    _FLATTEN_TENSOR_BUFFERS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


class NVFP4Tensor(QuantizedTensor):
    """NVFP4: E2M1 codes packed two per byte (uint8 (M, K/2)), one E4M3 scale per 1x16
    block and a per-tensor fp32 amax (the global scale is 448*6/amax). Amax buffers last."""

    _FLATTEN_TENSOR_BUFFERS = (
        "_rowwise_data",
        "_rowwise_scale_inv",
        "_columnwise_data",
        "_columnwise_scale_inv",
        "_amax_rowwise",
        "_amax_columnwise",
    )
