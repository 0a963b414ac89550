"""The Quantizer base class: usages, quantize/make_empty, and opt-in value identity.

Why value identity: torch.compile guards on the objects a compiled function reads. A
quantizer compared by identity makes every new-but-equal quantizer (a copy, one rebuilt
per step) a guard failure and a recompile; one compared by value lets equal quantizers
share one graph and a different configuration recompile exactly once. Value identity is
OPT-IN (``_value_semantics = True``): a quantizer holding live tensors (FP8 delayed
scaling's scale and amax history) must keep identity semantics, since two of them with
equal configuration still scale differently.

The value machinery is one chain: :meth:`Quantizer._value_fields` names the fields,
:meth:`Quantizer._value_key` turns them into a hashable key (and is the single place that
refuses a held ``torch.distributed.ProcessGroup``), and ``__eq__``, ``__hash__`` and
``__fx_repr__`` all go through the key. ``__fx_repr__`` rebuilds the quantizer in FX code
from its class and fields WITHOUT ``__init__`` (the class travels in the FX globals, no
module-level registry), then :meth:`Quantizer._rebuild_derived_state` recomputes what is
derived from the fields (NVFP4's Hadamard matrix), which is never part of the key.

Hazard avoided by design: no method here or in a subclass is a ``@staticmethod`` called
through ``self``; Dynamo's guard generation on a value-opaque object crashed on that
(``'function' object has no attribute '__func__'``). Helpers are module functions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from tetrt_support.quant import numerics

if TYPE_CHECKING:
    from tetrt_support.quant.tensors import QuantizedTensor

SUPPORTED_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BufferSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def _opaque_metaclass() -> type:
    """torch 2.11/2.12 need value-opaque classes to use OpaqueBaseMeta; from 2.13 plain ``type``."""
    version = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
    if version >= (2, 13):
        return type
    try:  # only the old releases reach this; the module is deprecated (and warns) later
        from torch._opaque_base import OpaqueBaseMeta  # type: ignore[import-not-found]
    except ImportError:
        return type
    return OpaqueBaseMeta


def _holds_process_group(value: Any) -> bool:
    if not torch.distributed.is_available():
        return False
    if isinstance(value, torch.distributed.ProcessGroup):
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return any(_holds_process_group(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_process_group(v) for v in value.values())
    return False


def _literal(value: Any, *, field: str) -> str:
    """A Python expression that evaluates back to ``value`` in FX code (``torch`` in scope)."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, torch.dtype):
        return str(value)  # "torch.float8_e4m3fn"
    if isinstance(value, tuple):
        inner = ", ".join(_literal(v, field=field) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    raise TypeError(
        f"__fx_repr__: value field {field!r} holds a {type(value).__name__}, which has no literal "
        "form in FX code; value fields must be None/bool/int/float/str/torch.dtype or tuples of them"
    )


def class_value_fields(cls: type[Quantizer]) -> tuple[str, ...]:
    """The value fields of a quantizer class: the common usages, then its format fields."""
    return ("rowwise_usage", "columnwise_usage", "internal", *cls._format_fields)


def rebuild_quantizer(cls: type[Quantizer], items: Sequence[tuple[str, Any]]) -> Quantizer:
    """Rebuild a value quantizer from its class and value fields, bypassing ``__init__``.

    Used by the expressions :meth:`Quantizer.__fx_repr__` writes into FX code; the class
    comes in as an argument (captured in the FX globals), so there is no name registry.
    """
    obj = cls.__new__(cls)
    for name, value in items:
        object.__setattr__(obj, name, value)
    obj._rebuild_derived_state()
    return obj


class Quantizer(metaclass=_opaque_metaclass()):
    """Base class of every quantizer: how to turn a high-precision tensor into a quantized one.

    Subclasses implement ``_quantize_2d`` (an (M, K) tensor, fp32 unless the class sets
    ``_upcasts_input = False`` -> the named buffers)
    and ``describe_buffers``; the base handles shapes, usages, copies and value identity.
    """

    # Opt-in value identity; see the module docstring.
    _value_semantics: ClassVar[bool] = False
    # Stamped True by opaque.register_value_opaque_quantizer on the registered class; a
    # class attribute (not a registry set) because Dynamo can read a constant attribute
    # inside a compiled region but cannot evaluate ``type(q) in some_set``.
    _tetrt_value_opaque: ClassVar[bool] = False
    # The QuantizedTensor subclass this quantizer produces (set by each format module).
    tensor_class: ClassVar[type[QuantizedTensor]]
    # Whether quantize hands _quantize_2d an fp32 copy of the input (a format whose numerics
    # are exact on bf16/fp16 input may opt out and save a full pass over the tensor).
    _upcasts_input: ClassVar[bool] = True
    # Format-specific value fields, appended to the common ones.
    _format_fields: ClassVar[tuple[str, ...]] = ()

    rowwise_usage: bool
    columnwise_usage: bool
    internal: bool

    def __init__(self, *, rowwise_usage: bool = True, columnwise_usage: bool = False, internal: bool = False) -> None:
        self.rowwise_usage = bool(rowwise_usage)
        self.columnwise_usage = bool(columnwise_usage)
        self.internal = bool(internal)
        self._check_usage()

    # ----------------------------------------------------------------- usage
    def _check_usage(self) -> None:
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError(f"{type(self).__name__}: at least one of rowwise_usage/columnwise_usage must be True")

    def set_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> None:
        """Change which layouts ``quantize`` produces. Mutates: copy first if this quantizer is shared."""
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)
        self._check_usage()

    # -------------------------------------------------------------- quantize
    def quantize(self, x: torch.Tensor, **options: Any) -> QuantizedTensor:
        """Quantize ``x`` (fp32/bf16/fp16, any leading dims, last dim K) into this format's tensor.

        ``options`` are per-call settings a format accepts (FP8 current scaling:
        ``amax_reduction_group``); they are never stored on the quantizer."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.quantize: expected a Tensor, got {type(x).__name__}")
        if x.dtype not in SUPPORTED_INPUT_DTYPES:
            raise TypeError(
                f"{type(self).__name__}.quantize: input dtype must be one of {SUPPORTED_INPUT_DTYPES}, got {x.dtype}"
            )
        if x.dim() == 0:
            raise ValueError(f"{type(self).__name__}.quantize: input must have at least one dimension")
        self._check_shape(tuple(x.shape))
        x2d = numerics.flatten_2d(x.detach())
        x2d = x2d.float() if self._upcasts_input else x2d
        buffers = self._quantize_2d(x2d, **options)
        return self.tensor_class(shape=x.shape, dtype=x.dtype, quantizer=self.copy(), **buffers)

    def _quantize_2d(self, x2d: torch.Tensor, **options: Any) -> dict[str, torch.Tensor | None]:
        raise NotImplementedError(f"{type(self).__name__} does not implement _quantize_2d")

    def _dequantize_2d(self, tensor: QuantizedTensor) -> torch.Tensor:
        """The (M, K) fp32 values a tensor of this format stands for."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _dequantize_2d")

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        """Raise a ValueError naming the dimension a format cannot block (default: any shape)."""

    def describe_buffers(self, shape: Sequence[int], *, device: torch.device | str = "cpu") -> BufferSpec:
        """Names, shapes and dtypes of the buffers ``quantize`` would produce for ``shape``,
        in the tensor class's flatten order (only the buffers present for this usage)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement describe_buffers")

    def make_empty(
        self, shape: Sequence[int], *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> QuantizedTensor:
        """An uninitialised quantized tensor with exactly the buffers ``quantize`` would give."""
        shape = tuple(int(s) for s in shape)
        self._check_shape(shape)
        buffers = {
            name: torch.empty(buf_shape, dtype=buf_dtype, device=device)
            for name, (buf_shape, buf_dtype) in self.describe_buffers(shape, device=device).items()
        }
        return self.tensor_class(shape=torch.Size(shape), dtype=dtype, quantizer=self.copy(), **buffers)

    # ------------------------------------------------------------------ copy
    def copy(self) -> Quantizer:
        """A new quantizer with equal value; derived state is rebuilt, never shared."""
        new = type(self).__new__(type(self))
        for name, value in vars(self).items():
            if not name.startswith("_derived_"):
                object.__setattr__(new, name, value)
        new._rebuild_derived_state()
        return new

    def _rebuild_derived_state(self) -> None:
        """Recompute state derived from the value fields (hook; nothing by default).

        Derived attributes are named ``_derived_*``: ``copy()`` skips them and calls this
        hook, so they are never shared between copies nor part of the value key."""

    # -------------------------------------------------------- value identity
    def _value_fields(self) -> tuple[str, ...]:
        return class_value_fields(type(self))

    def _value_items(self) -> tuple[tuple[str, Any], ...]:
        return tuple((name, getattr(self, name)) for name in self._value_fields())

    def _value_key(self) -> tuple[Any, ...]:
        """The hashable value of this quantizer: (class, (field, value)...).

        The single point ``__eq__``, ``__hash__`` and ``__fx_repr__`` go through, hence the
        one place that refuses a held ProcessGroup: the group is not (and cannot be) part of
        the key, so a quantizer holding one would compare equal to one without it and let
        torch.compile reuse a graph that skips the amax reduction. Pass the group per call.
        """
        cls = type(self)
        if not cls._value_semantics:
            raise TypeError(f"{cls.__name__} has identity semantics (it holds live state); it has no value key")
        for name, value in vars(self).items():
            if _holds_process_group(value):
                raise TypeError(
                    f"{cls.__name__}.{name} holds a torch.distributed.ProcessGroup; a value quantizer must "
                    "not carry distributed state (it cannot be part of its value): pass the group per call, "
                    "e.g. quantize(x, amax_reduction_group=group)"
                )
        return (cls, self._value_items())

    def __eq__(self, other: object) -> bool:
        if not type(self)._value_semantics:
            return self is other
        if not isinstance(other, Quantizer) or type(other) is not type(self):
            return NotImplemented if not isinstance(other, Quantizer) else False
        return self._value_key() == other._value_key()

    def __hash__(self) -> int:
        if not type(self)._value_semantics:
            return object.__hash__(self)
        return hash(self._value_key())

    def __fx_repr__(self) -> tuple[str, dict[str, Any]]:
        """``(expression, globals)`` that rebuilds this quantizer in FX-generated code."""
        cls, items = self._value_key()
        class_name = "tetrt_q_" + re.sub(r"\W", "_", f"{cls.__module__}.{cls.__qualname__}")
        fields = ", ".join(f"({name!r}, {_literal(value, field=name)})" for name, value in items)
        expr = f"tetrt_rebuild_quantizer({class_name}, ({fields},))"
        # ``torch`` (for dtype literals) is always in FX code's globals; adding the module
        # here would make inductor's FX graph cache fail to pickle the compiled graph.
        return expr, {"tetrt_rebuild_quantizer": rebuild_quantizer, class_name: cls}

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self._value_items())
        return f"{type(self).__name__}({fields})"


def _layout_buffer_name(layout: str, part: str) -> str:
    """Buffer attribute names as TransformerEngine spells them: ``_rowwise_data``, ``_amax_rowwise``."""
    return f"_amax_{layout}" if part == "amax" else f"_{layout}_{part}"


class RowColumnQuantizer(Quantizer):
    """A block format whose column-wise layout is the row-wise recipe applied to x^T.

    Row-wise buffers: ``_rowwise_data`` (M, ...) and ``_rowwise_scale_inv``; column-wise:
    the same recipe on the (K, M) transpose, ``_columnwise_data`` / ``_columnwise_scale_inv``.
    Subclasses implement ``_quantize_rows`` / ``_dequantize_rows`` / ``_describe_rows``
    for one (R, C) matrix, with parts named ``data``, ``scale_inv`` and optionally ``amax``. (TransformerEngine also swizzles and pads scales for its GEMM
    kernels; these buffers keep the plain row-major layout.)
    """

    def _quantize_rows(self, x2d: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} does not implement _quantize_rows")

    def _dequantize_rows(self, buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement _dequantize_rows")

    def _describe_rows(self, rows: int, cols: int) -> BufferSpec:
        raise NotImplementedError(f"{type(self).__name__} does not implement _describe_rows")

    def _quantize_2d(self, x2d: torch.Tensor) -> dict[str, torch.Tensor | None]:
        out: dict[str, torch.Tensor | None] = {}
        for layout, used, matrix in (("rowwise", self.rowwise_usage, x2d), ("columnwise", self.columnwise_usage, x2d.t())):
            if used:
                rows = self._quantize_rows(matrix.contiguous())
                out.update({_layout_buffer_name(layout, part): buf for part, buf in rows.items()})
        return out

    def _dequantize_2d(self, tensor: QuantizedTensor) -> torch.Tensor:
        for layout in ("rowwise", "columnwise"):
            if getattr(tensor, _layout_buffer_name(layout, "data")) is None:
                continue
            parts = {}
            for name in tensor._FLATTEN_TENSOR_BUFFERS:
                for part in ("data", "scale_inv", "amax"):
                    if name == _layout_buffer_name(layout, part):
                        parts[part] = getattr(tensor, name)
            values = self._dequantize_rows(parts)
            return values if layout == "rowwise" else values.t()
        raise RuntimeError(f"{type(tensor).__name__} has neither row-wise nor column-wise data")

    def describe_buffers(self, shape: Sequence[int], *, device: torch.device | str = "cpu") -> BufferSpec:
        del device
        shape = tuple(int(s) for s in shape)
        self._check_shape(shape)
        m = math.prod(shape[:-1])
        k = shape[-1]
        spec: BufferSpec = {}
        for layout, used, (rows, cols) in (("rowwise", self.rowwise_usage, (m, k)), ("columnwise", self.columnwise_usage, (k, m))):
            if used:
                spec.update({_layout_buffer_name(layout, part): s for part, s in self._describe_rows(rows, cols).items()})
        order = self.tensor_class._FLATTEN_TENSOR_BUFFERS
        return {name: spec[name] for name in order if name in spec}
