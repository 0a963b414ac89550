"""The fast-path tables: which CUDA (Triton) path a quantizer or a quantized GEMM takes.

Each format module registers its quantize fast path (keyed by quantizer class) in
:data:`QUANTIZE` and its GEMM fast path (keyed by tensor class) in :data:`GEMM`.
:func:`fast_buffers` (from ``Quantizer.quantize``) and :func:`fast_matmul` (from
``ops.quantized_matmul``) look the handler up by exact type; a handler, or a missing one,
answers ``None`` when the reference must run. Kernels are imported inside the handlers, so
importing this module needs no Triton. Coverage: ``docs/architecture.md`` ("Module notes").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from tetrt_support.quant.base import QuantizedTensor, Quantizer
from tetrt_support.quant.kernels import enabled

Handler = TypeVar("Handler", bound=Callable[..., Any])


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class FastPathTable:
    """One handler per class, found by the EXACT type of the object at hand.

    No MRO walk: a subclass may change what its parent's numerics produce, so it runs the
    reference until it registers a fast path of its own (as it registers its own value
    identity, :func:`~tetrt_support.quant.dynamo.register_value_quantizer`). A class is
    registered once; a second registration is refused, naming both handlers."""

    def __init__(self, name: str, key_base: type) -> None:
        self.name = name
        self._key_base = key_base
        self._handlers: dict[type, Callable[..., Any]] = {}

    def register(self, cls: type) -> Callable[[Handler], Handler]:
        """Decorator: make the decorated function ``cls``'s fast path."""
        if not (isinstance(cls, type) and issubclass(cls, self._key_base)):
            raise TypeError(f"{self.name} fast paths are keyed by subclasses of "
                            f"{self._key_base.__name__}, got {cls!r}")

        def add(handler: Handler) -> Handler:
            held = self._handlers.get(cls)
            if held is not None:
                raise ValueError(f"{self.name} fast path for {_qualified(cls)} is already "
                                 f"registered ({_qualified(held)}); refusing a second one "
                                 f"({_qualified(handler)})")
            self._handlers[cls] = handler
            return handler

        return add

    def lookup(self, cls: type) -> Callable[..., Any] | None:
        """The handler registered for exactly ``cls``, or None."""
        return self._handlers.get(cls)

    def __contains__(self, cls: object) -> bool:
        return cls in self._handlers

    def registered(self) -> dict[type, Callable[..., Any]]:
        """A copy of the table: class -> handler."""
        return dict(self._handlers)


#: Quantizer class -> ``handler(quantizer, x, x2d, options) -> buffers | None``.
QUANTIZE = FastPathTable("quantize", Quantizer)
#: Tensor class -> ``handler(a, b, *, layout_a, layout_b, transpose_a, transpose_b,
#: out_dtype, fast_accum) -> Tensor | None`` (``a`` and ``b`` of that class).
GEMM = FastPathTable("GEMM", QuantizedTensor)


# ------------------------------------------------------------------------- quantize
def fast_buffers(quantizer: Any, x: torch.Tensor,
                 options: dict[str, Any]) -> dict[str, torch.Tensor | None] | None:
    """The buffers ``quantizer.quantize(x, **options)`` stores, or None (use the reference).

    Never inside a trace (the tracer sees the reference ops); the handler decides the rest
    (:func:`~tetrt_support.quant.kernels.enabled` for the Triton kernels)."""
    if torch.compiler.is_compiling() or x.numel() == 0 or x.dim() == 0:
        return None
    handler = QUANTIZE.lookup(type(quantizer))
    if handler is None:
        return None
    x2d = x.reshape(-1, x.shape[-1])
    if x2d.stride(1) != 1:
        x2d = x2d.contiguous()
    return handler(quantizer, x, x2d, options)


def kernel_layouts(q: Any, rd: Any, rs: Any, cd: Any, cs: Any, *,
                   stored: bool = False) -> dict[str, torch.Tensor | None]:
    """A row/column quantizer's buffers from a kernel's outputs. Compact scales go into TE's
    (padded, GEMM-ready or swizzled) layout through the same function the reference path
    uses; ``stored``: the kernel already wrote that layout."""
    def keep(scales: Any, layout: str) -> Any:
        return scales if stored else q._store_scale_inv(scales, layout)

    out: dict[str, torch.Tensor | None] = {}
    if q.rowwise_usage:
        out.update(_rowwise_data=rd, _rowwise_scale_inv=keep(rs, "rowwise"))
    if q.columnwise_usage:
        out.update(_columnwise_data=cd, _columnwise_scale_inv=keep(cs, "columnwise"))
    return out


# --------------------------------------------------------------------------- GEMMs
def fast_matmul(a: Any, b: Any, *, transpose_a: bool, transpose_b: bool, out_dtype: torch.dtype,
                layout_a: str | None = None, layout_b: str | None = None,
                fast_accum: bool = False) -> torch.Tensor | None:
    """``op(a) @ op(b)`` of two 2-D quantized tensors of one class on its fast GEMM, or None
    (use the reference).

    ``layout_a`` / ``layout_b`` name the quantized copy of each operand to read, as for
    ``ops.quantized_matmul`` (None: the first present, row-wise before column-wise)."""
    if torch.compiler.is_compiling() or type(a) is not type(b):
        return None
    handler = GEMM.lookup(type(a))
    if handler is None:
        return None
    return handler(a, b, layout_a=layout_a, layout_b=layout_b, transpose_a=transpose_a,
                   transpose_b=transpose_b, out_dtype=out_dtype, fast_accum=fast_accum)


Parts = tuple[torch.Tensor, Any, Any, str]


def operands(a: Any, b: Any, layout_a: str | None, layout_b: str | None,
             parts: Callable[[Any, str | None], Parts | None]) -> tuple[Parts, Parts] | None:
    """Both operands' parts (``parts(t, layout)``), or None when a copy is missing or the
    kernels do not apply to the data (:func:`~tetrt_support.quant.kernels.enabled`)."""
    pa, pb = parts(a, layout_a), parts(b, layout_b)
    if pa is None or pb is None or not enabled(pa[0]):
        return None
    return pa, pb


def row_column_parts(t: Any, layout: str | None, *, compact_scales: bool = True) -> Parts | None:
    """(2-D data, COMPACT scale_inv or None, amax or None, layout) of a row/column format's
    named copy (None: the first present), None when it is absent. The data is the 2-D view
    the quantizer gives of its stored (TE's N-D) buffer: column-wise (K, M) for the formats
    that store it transposed, (M, K) for MXFP8 (32 x 1 blocks).
    ``compact_scales=False``: no scales (a GEMM that reads the stored buffers)."""
    for name in ([layout] if layout else ["rowwise", "columnwise"]):
        if getattr(t, f"_{name}_data", None) is not None:
            data = t._quantizer.data_2d(t, name)
            scale = t._quantizer.compact_scale_inv(t, name) if compact_scales else None
            return data, scale, getattr(t, f"_amax_{name}", None), name
    return None
