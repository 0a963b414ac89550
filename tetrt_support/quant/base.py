"""The base Quantizer and QuantizedTensor, and the buffer machinery the formats share.

:class:`Quantizer` turns a high-precision tensor into a quantized one (usages, ``quantize``,
``make_empty``, ``describe_buffers``, copies) and has opt-in value identity
(:func:`tetrt_support.quant.dynamo.register_value_quantizer`). :class:`QuantizedTensor` is a
traceable wrapper subclass that looks like the tensor it stands for; ops other than a few
kept quantized run on dequantized values. Details: ``docs/architecture.md`` ("Module notes").

No method here or in a subclass is a ``@staticmethod`` called through ``self``: Dynamo's
guard generation on a value-opaque object crashed on that. Helpers are module functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from tetrt_support.quant import numerics

SUPPORTED_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A frozen quantizer's cached value key (see Quantizer.freeze); its presence marks it frozen.
_FROZEN_KEY = "_frozen_value_key"
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


def annotated_fields(cls: type) -> tuple[str, ...]:
    """The public annotated attributes of a Quantizer class across its MRO, base first.

    The single declaration of what a quantizer's value is made of. ``ClassVar``
    annotations and names starting with ``_`` are not fields.
    """
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, Quantizer)):
            continue
        for name, annotation in klass.__dict__.get("__annotations__", {}).items():
            text = annotation if isinstance(annotation, str) else repr(annotation)
            if name.startswith("_") or "ClassVar" in text:
                continue
            names[name] = None
    return tuple(names)


def all_reduce_max(amax: torch.Tensor, group: Any) -> torch.Tensor:
    """All-reduce (MAX) ``amax`` over ``group`` with torch.distributed; returns a new tensor."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("amax_reduction_group was given but torch.distributed is not initialized")
    reduced = amax.clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group)
    return reduced


def group_name(group: Any) -> str:
    """The registered name of ``group`` (a ProcessGroup or its name): what functional
    collectives and custom-op schemas (``str``) take in its place."""
    if isinstance(group, str):
        return group
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("amax_reduction_group was given but torch.distributed is not initialized")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"amax_reduction_group must be a torch.distributed.ProcessGroup or its name, "
                        f"got {type(group).__name__}")
    return group.group_name


def functional_all_reduce_max(amax: torch.Tensor, group_name: str) -> torch.Tensor:
    """``amax`` all-reduced (MAX) over the group named ``group_name`` with a functional
    collective: under torch.compile the all-reduce and its wait are nodes of the graph
    (``_c10d_functional.all_reduce`` / ``wait_tensor``), in eager it runs at once."""
    import torch.distributed._functional_collectives as funcol

    reduced = funcol.all_reduce(amax, "max", group_name)  # traced: already waited on in the graph
    return reduced.wait() if isinstance(reduced, funcol.AsyncCollectiveTensor) else reduced


def as_dims(shape: Iterable[Any]) -> tuple[Any, ...]:
    """``shape`` as a tuple of ints, keeping a symbolic size (a fake impl's dynamic dimension
    under torch.compile) symbolic: ``int()`` on a SymInt specialises it, a guard on that one
    value, so every new batch size would recompile."""
    return tuple(s if isinstance(s, torch.SymInt) else int(s) for s in shape)


def rows_cols(shape: Sequence[int]) -> tuple[int, int]:
    """(M, K) of the 2-D view a quantizer works on: M the product of the leading dims
    (a 0-d tensor is one 1 x 1 row)."""
    if len(shape) == 0:
        return 1, 1
    dims = as_dims(shape)
    m = 1
    for s in dims[:-1]:  # a loop, not math.prod(genexpr): Dynamo traces this inside fake impls
        m *= s
    return m, dims[-1]


def construct_quantizer(cls: type[Quantizer], attributes: Iterable[tuple[str, Any]]) -> Quantizer:
    """The one way a quantizer is built without ``__init__`` (``copy`` and the FX rebuild):
    set the attributes, then rebuild the derived state from them."""
    obj = cls.__new__(cls)
    for name, value in attributes:
        object.__setattr__(obj, name, value)
    obj._rebuild_derived_state()
    return obj


class Quantizer(metaclass=_opaque_metaclass()):
    """Base class of every quantizer: how to turn a high-precision tensor into a quantized one.

    Subclasses implement ``_quantize_2d`` (an (M, K) tensor in the input's dtype -> the
    named buffers), ``_dequantize_2d`` and ``describe_buffers``; the base handles shapes,
    usages, copies and value identity. Value fields are annotations (see module docstring).
    """

    # Stamped True on a class (in its own __dict__) by dynamo.register_value_quantizer
    # when torch registered it as an opaque value type. A class attribute, not a registry
    # set: Dynamo folds a constant attribute read inside a compiled region. Reset to
    # False for every new subclass by __init_subclass__ (a subclass registers itself).
    _tetrt_value_opaque: ClassVar[bool] = False
    # The QuantizedTensor subclass this quantizer produces (set by each format module).
    tensor_class: ClassVar[type[QuantizedTensor]]

    rowwise_usage: bool
    columnwise_usage: bool
    internal: bool

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._tetrt_value_opaque = False

    def __init__(self, *, rowwise_usage: bool = True, columnwise_usage: bool = True, internal: bool = False) -> None:
        self.rowwise_usage = bool(rowwise_usage)
        self.columnwise_usage = bool(columnwise_usage)
        self.internal = bool(internal)
        self._check_usage()

    # ----------------------------------------------------------------- usage
    def _check_usage(self) -> None:
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError(f"{type(self).__name__}: at least one of rowwise_usage/columnwise_usage must be True")

    def set_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> None:
        """Change which layouts ``quantize`` produces. Mutates: copy first if this quantizer is
        shared (a frozen one refuses, see :meth:`freeze`)."""
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)
        self._check_usage()

    # -------------------------------------------------------------- quantize
    def quantize(self, x: torch.Tensor, **options: Any) -> QuantizedTensor:
        """Quantize ``x`` (fp32/bf16/fp16, any shape incl. 0-d, last dim K) into this format's tensor.

        ``options`` are per-call settings a format accepts (``amax_reduction_group``,
        NVFP4's ``generator``); they are never stored on the quantizer."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.quantize: expected a Tensor, got {type(x).__name__}")
        if x.dtype not in SUPPORTED_INPUT_DTYPES:
            raise TypeError(
                f"{type(self).__name__}.quantize: input dtype must be one of {SUPPORTED_INPUT_DTYPES}, got {x.dtype}"
            )
        self._check_shape(tuple(x.shape))
        self._check_input(x)
        from tetrt_support.quant.kernels.dispatch import fast_buffers  # CUDA kernels; None -> the reference

        buffers = fast_buffers(self, x.detach(), options)
        if buffers is None:
            buffers = self._quantize_tensor(x.detach(), **options)
        buffers = self._shape_buffers(buffers, tuple(x.shape))
        return self.tensor_class(shape=x.shape, dtype=x.dtype, quantizer=self._for_tensor(), **buffers)

    def _shape_buffers(self, buffers: dict[str, torch.Tensor | None], shape: tuple[int, ...]) -> dict[str, torch.Tensor | None]:
        """The buffers in the shapes TE allocates for a tensor of ``shape`` (default: as given)."""
        del shape
        return buffers

    def _quantize_tensor(self, x: torch.Tensor, **options: Any) -> dict[str, torch.Tensor | None]:
        """The buffers of ``x`` (any shape); by default those of its (M, K) view."""
        return self._quantize_2d(numerics.flatten_2d(x), **options)

    def _quantize_2d(self, x2d: torch.Tensor, **options: Any) -> dict[str, torch.Tensor | None]:
        raise NotImplementedError(f"{type(self).__name__} does not implement _quantize_2d")

    def _dequantize_2d(self, tensor: QuantizedTensor, layout: str | None = None) -> torch.Tensor:
        """The (M, K) fp32 values a tensor of this format stands for, read from ``layout``
        ("rowwise" / "columnwise"; None: the first one present)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _dequantize_2d")

    def _check_shape(self, shape: tuple[int, ...]) -> None:
        """Raise a ValueError naming the dimension a format cannot block (default: any shape)."""

    def _check_input(self, x: torch.Tensor) -> None:
        """Raise on an input this configuration does not take (default: none), before the
        kernels or the reference run, so that no path can skip the check."""

    def describe_buffers(self, shape: Sequence[int], *, device: torch.device | str = "cpu") -> BufferSpec:
        """Names, shapes and dtypes of the buffers ``quantize`` would produce for ``shape``,
        in the tensor class's flatten order (only the buffers present for this usage)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement describe_buffers")

    def make_empty(
        self, shape: Sequence[int], *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> QuantizedTensor:
        """An uninitialised quantized tensor with exactly the buffers ``quantize`` would give."""
        shape = as_dims(shape)
        self._check_shape(shape)
        buffers = {
            name: torch.empty(buf_shape, dtype=buf_dtype, device=device)
            for name, (buf_shape, buf_dtype) in self.describe_buffers(shape, device=device).items()
        }
        return self.tensor_class(shape=torch.Size(shape), dtype=dtype, quantizer=self._for_tensor(), **buffers)

    def _for_tensor(self) -> Quantizer:
        """The quantizer a new tensor keeps: this one if frozen, else a copy (so that a
        later ``set_usage`` on this one cannot change the tensor's)."""
        return self if _FROZEN_KEY in self.__dict__ else self.copy()

    # ------------------------------------------------------------------ copy
    def copy(self) -> Quantizer:
        """A new, mutable quantizer with equal value; derived state is rebuilt, never shared."""
        return construct_quantizer(
            type(self), ((k, v) for k, v in vars(self).items() if not k.startswith("_derived_") and k != _FROZEN_KEY)
        )

    # ---------------------------------------------------------------- freeze
    def freeze(self) -> Quantizer:
        """Make this value quantizer immutable, in place, and return it.

        Why: a compiled graph rebuilds its quantizer constants on every call
        (:func:`tetrt_support.quant.dynamo.rebuild_quantizer`). A frozen quantizer can be
        built once and shared instead -- by those calls, by :func:`~tetrt_support.quant.ops.with_usage`
        and by the tensors it quantizes (``quantize`` copies a mutable quantizer, and shares
        a frozen one) -- because nothing can change it afterwards: setting any attribute
        raises. Its value key is computed once, so ``==`` and ``hash`` are O(1). Identity
        quantizers (live state) cannot be frozen."""
        if self._value_fields() is None:
            raise TypeError(f"{type(self).__name__} has identity semantics (live state); only value quantizers can be frozen")
        if not self.is_frozen:
            object.__setattr__(self, _FROZEN_KEY, self._value_key())
        return self

    @property
    def is_frozen(self) -> bool:
        return _FROZEN_KEY in self.__dict__

    def __setattr__(self, name: str, value: Any) -> None:
        if _FROZEN_KEY in self.__dict__:
            raise AttributeError(
                f"{type(self).__name__} is frozen (a shared constant: rebuilt by compiled code, or a usage variant): "
                f"cannot set {name!r}. Change a mutable .copy() instead; a torch.compile'd region must not mutate a "
                "quantizer argument (its graph applies the change to this constant): derive the variant outside the "
                "region (q.copy(), then set_usage) or construct it there from constants"
            )
        object.__setattr__(self, name, value)

    # -------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        """What pickle and deepcopy keep: the fields, never the derived state (rebuilt on
        load) nor a stored process group (unpicklable; TE's quantizers' ``__getstate__``
        drop it too, ``float8_tensor.py`` / ``nvfp4_tensor.py``)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_derived_") and k != "amax_reduction_group"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        frozen = state.get(_FROZEN_KEY)
        for name, value in state.items():
            if name != _FROZEN_KEY:
                object.__setattr__(self, name, value)
        self._rebuild_derived_state()
        if frozen is not None:  # frozen last: the rebuild sets attributes
            object.__setattr__(self, _FROZEN_KEY, frozen)

    def _rebuild_derived_state(self) -> None:
        """Recompute state derived from the value fields (hook; nothing by default).

        Derived attributes are named ``_derived_*``: ``copy()`` skips them and calls this
        hook, so they are never shared between copies nor part of the value key."""

    # -------------------------------------------------------- value identity
    def _value_fields(self) -> tuple[str, ...] | None:
        """The value fields stored on THIS class at registration, or None (identity semantics)."""
        return type(self).__dict__.get("_value_field_names")

    def _value_key(self) -> tuple[Any, ...]:
        """The hashable value of this quantizer: (class, ((field, value), ...)).

        The single point ``__eq__``, ``__hash__`` and ``__fx_repr__`` go through, hence the
        one place that refuses a held ProcessGroup: the group is not (and cannot be) part of
        the key, so a quantizer holding one would compare equal to one without it and let
        torch.compile reuse a graph that skips the amax reduction. Pass the group per call.
        """
        frozen = self.__dict__.get(_FROZEN_KEY)
        if frozen is not None:
            return frozen
        cls = type(self)
        fields = self._value_fields()
        if fields is None:
            raise TypeError(
                f"{cls.__name__} has identity semantics (it is not registered as a value quantizer); it has no value key"
            )
        for name, value in vars(self).items():
            if _holds_process_group(value):
                raise TypeError(
                    f"{cls.__name__}.{name} holds a torch.distributed.ProcessGroup; a value quantizer must "
                    "not carry distributed state (it cannot be part of its value): pass the group per call, "
                    "e.g. quantize(x, amax_reduction_group=group)"
                )
        return (cls, tuple((name, getattr(self, name)) for name in fields))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self) or self._value_fields() is None:
            return NotImplemented if not isinstance(other, Quantizer) else False
        return self._value_key() == other._value_key()

    def __hash__(self) -> int:
        if self._value_fields() is None:
            return object.__hash__(self)
        return hash(self._value_key())

    def __repr__(self) -> str:
        shown = []
        for name in annotated_fields(type(self)):
            value = getattr(self, name, None)
            shown.append(f"{name}={value!r}" if not isinstance(value, torch.Tensor) else f"{name}=<tensor {tuple(value.shape)}>")
        return f"{type(self).__name__}({', '.join(shown)})"




# ====================================================================== tensors
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


aten = torch.ops.aten
_HIGH_PRECISION = SUPPORTED_INPUT_DTYPES
# One-byte float dtypes that __reduce_ex__ pickles as uint8 views.
_BYTE_VIEWED = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu") if hasattr(torch, n))


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
    def dequantize(self, dtype: torch.dtype | None = None, *, layout: str | None = None) -> torch.Tensor:  # type: ignore[override]
        """The high-precision tensor this one stands for, in ``dtype`` (default: the fake dtype).

        ``layout`` picks which quantized copy to read ("rowwise" / "columnwise"; None: the
        first present): they are quantized separately, so their values differ, as the
        operands of TE's forward and backward GEMMs do."""
        x2d = self._quantizer._dequantize_2d(self, layout)
        return x2d.reshape(self.shape).to(dtype or self.dtype)

    # ------------------------------------------------------------- pickling
    def __reduce_ex__(self, protocol: int) -> tuple:
        """Pickle (``torch.save`` / ``pickle``) the inner buffers, the quantizer and the fake
        dtype, as TE's tensors do (``Float8Tensor.__reduce_ex__`` and the module-level
        ``_make_float8_tensor_in_reduce_ex``): the default would pickle the wrapper's
        storage, which it does not have. FP8 buffers travel as uint8 views (TE keeps its FP8
        bytes in uint8 tensors): torch's legacy storage pickling, which ``pickle.dumps``
        uses, cannot load a float8 tensor ("'UntypedStorage' has no attribute 'dtype'").
        ``copy.deepcopy`` takes torch's default (``clone`` + a deep copy of the attributes),
        as in TE."""
        del protocol
        buffers = {name: (b.view(torch.uint8) if b.dtype in _BYTE_VIEWED else b, b.dtype)
                   for name, b in self.inner_buffers().items()}
        return (_make_quantized_tensor_in_reduce_ex,
                (type(self), tuple(self.shape), self.dtype, self._quantizer, self.requires_grad, buffers))

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


def _make_quantized_tensor_in_reduce_ex(
    cls: type[QuantizedTensor], shape: tuple[int, ...], dtype: torch.dtype, quantizer: Quantizer,
    requires_grad: bool, buffers: dict[str, tuple[torch.Tensor, torch.dtype]],
) -> QuantizedTensor:
    """Rebuild a quantized tensor from its ``__reduce_ex__`` payload (a module-level function,
    so the pickle names it with one global, as TE's reconstructors)."""
    inner = {name: b if b.dtype == buf_dtype else b.view(buf_dtype) for name, (b, buf_dtype) in buffers.items()}
    return cls(shape=torch.Size(shape), dtype=dtype, quantizer=quantizer, requires_grad=requires_grad, **inner)


def _to_copy_keeps_quantized(kwargs: dict) -> bool:
    dtype = kwargs.get("dtype")
    extra = set(kwargs) - {"dtype", "device", "layout", "pin_memory", "non_blocking", "memory_format"}
    return not extra and (dtype is None or dtype in _HIGH_PRECISION) and kwargs.get("layout") in (None, torch.strided)




# ============================================================ block-format layouts
def layout_buffer_name(layout: str, part: str) -> str:
    """Buffer attribute names as TransformerEngine spells them: ``_rowwise_data``, ``_amax_rowwise``."""
    return f"_amax_{layout}" if part == "amax" else f"_{layout}_{part}"


LAYOUTS = ("rowwise", "columnwise")


class RowColumnQuantizer(Quantizer):
    """A block format with separately quantized row-wise and column-wise layouts.

    By default the column-wise layout is the row-wise recipe applied to x^T (TE's
    blockwise FP8 and NVFP4 store it transposed, (K, M)); a format whose column-wise
    data keeps the (M, K) layout (MXFP8) overrides the hooks. Subclasses implement, for
    one layout, ``_quantize_layout(matrix, layout, **options)`` / ``_dequantize_layout`` /
    ``_describe_layout``, with parts named ``data``, ``scale_inv`` and optionally ``amax``,
    all on 2-D matrices. Data is STORED in TE's N-D shape (:meth:`_data_shape`) and read
    back through its 2-D view (:meth:`data_2d`); scale buffers are 2-D, as TE's.
    """

    #: Whether the column-wise layout is stored as x^T, (K, M). A class attribute, not a
    #: shape comparison: for a square tensor the shapes cannot tell the two apart.
    _COLUMNWISE_TRANSPOSED = True

    def _is_transposed(self, layout: str) -> bool:
        return layout == "columnwise" and self._COLUMNWISE_TRANSPOSED

    def _layout_matrix(self, x2d: torch.Tensor, layout: str) -> torch.Tensor:
        """The matrix a layout's recipe runs on (x or x^T)."""
        return x2d.t().contiguous() if self._is_transposed(layout) else x2d

    def _layout_shape(self, m: int, k: int, layout: str) -> tuple[int, int]:
        return (k, m) if self._is_transposed(layout) else (m, k)

    def _data_shape(self, shape: Sequence[int], layout: str) -> tuple[Any, ...]:
        """The shape of a layout's data for a tensor of logical ``shape``, as TE's
        ``create_tensor`` allocates it (``pytorch/csrc/quantizer.cpp``): the N-D shape itself,
        or ``(shape[-1], *shape[:-1])`` for a transposed column-wise layout."""
        shape = as_dims(shape)
        if self._is_transposed(layout) and len(shape) > 0:
            return (shape[-1], *shape[:-1])
        return shape

    def _data_2d(self, data: torch.Tensor, layout: str) -> torch.Tensor:
        """The (rows, cols) matrix view of a layout's stored data -- (M, K), or (K, M) when
        transposed -- that the numerics, the scale layouts and the GEMMs read."""
        if not self._is_transposed(layout):
            return numerics.flatten_2d(data)
        if data.dim() == 0:
            return data.reshape(1, 1)
        return data.unsqueeze(1) if data.dim() == 1 else data.flatten(1)

    def data_2d(self, tensor: QuantizedTensor, layout: str) -> torch.Tensor:
        """``tensor``'s ``layout`` data as the 2-D matrix the numerics and GEMMs read (a view)."""
        data = getattr(tensor, layout_buffer_name(layout, "data"))
        if data is None:
            raise ValueError(f"{type(tensor).__name__}: no {layout!r} data")
        return self._data_2d(data, layout)

    def _shape_buffers(self, buffers: dict[str, torch.Tensor | None], shape: tuple[int, ...]) -> dict[str, torch.Tensor | None]:
        out = dict(buffers)
        for layout in LAYOUTS:
            name = layout_buffer_name(layout, "data")
            if out.get(name) is not None:
                out[name] = out[name].reshape(self._data_shape(shape, layout))
        return out

    def _quantize_layout(self, matrix: torch.Tensor, layout: str, **options: Any) -> dict[str, torch.Tensor]:
        """The parts of one layout; ``options`` are the per-call options the format accepts
        (a format that accepts none declares none, so a stray option raises TypeError)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _quantize_layout")

    def _dequantize_layout(self, parts: dict[str, torch.Tensor], layout: str) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement _dequantize_layout")

    def _describe_layout(self, rows: int, cols: int, layout: str) -> BufferSpec:
        raise NotImplementedError(f"{type(self).__name__} does not implement _describe_layout")

    def _store_scale_inv(self, compact: torch.Tensor, layout: str) -> torch.Tensor:
        """Compact per-block scales (what the numerics return) -> the stored buffer in TE's
        layout (:mod:`tetrt_support.quant.scale_layouts`); the identity by default."""
        del layout
        return compact

    def _load_scale_inv(self, buffer: torch.Tensor, data: torch.Tensor, layout: str) -> torch.Tensor:
        """Inverse of :meth:`_store_scale_inv` (``data``: the layout's stored data, for its shape)."""
        del data, layout
        return buffer

    def compact_scale_inv(self, tensor: QuantizedTensor, layout: str) -> torch.Tensor:
        """The valid region of ``tensor``'s ``layout`` scales, one entry per block, row-major
        (TE's padding and swizzling undone): what the numerics and a GEMM emulation read."""
        data = self.data_2d(tensor, layout)
        return self._load_scale_inv(getattr(tensor, layout_buffer_name(layout, "scale_inv")), data, layout)

    def _used_layouts(self) -> tuple[str, ...]:
        return tuple(layout for layout, used in zip(LAYOUTS, (self.rowwise_usage, self.columnwise_usage)) if used)

    def _quantize_2d(self, x2d: torch.Tensor, **options: Any) -> dict[str, torch.Tensor | None]:
        out: dict[str, torch.Tensor | None] = {}
        for layout in self._used_layouts():
            parts = self._quantize_layout(self._layout_matrix(x2d, layout), layout, **options)
            parts["scale_inv"] = self._store_scale_inv(parts["scale_inv"], layout)
            out.update({layout_buffer_name(layout, part): buf for part, buf in parts.items()})
        return out

    def _layout_parts(self, tensor: QuantizedTensor, layout: str | None) -> tuple[str, dict[str, torch.Tensor]]:
        """(layout, its parts with COMPACT scales) of ``tensor`` (layout None: the first present)."""
        present = [name for name in LAYOUTS if getattr(tensor, layout_buffer_name(name, "data")) is not None]
        if layout is None:
            if not present:
                raise RuntimeError(f"{type(tensor).__name__} has neither row-wise nor column-wise data")
            layout = present[0]
        elif layout not in present:
            raise ValueError(f"{type(tensor).__name__}.dequantize: no {layout!r} data (present: {present})")
        parts = {
            part: getattr(tensor, layout_buffer_name(layout, part))
            for part in ("data", "scale_inv", "amax")
            if layout_buffer_name(layout, part) in tensor._FLATTEN_TENSOR_BUFFERS
        }
        parts["data"] = self._data_2d(parts["data"], layout)
        parts["scale_inv"] = self._load_scale_inv(parts["scale_inv"], parts["data"], layout)
        return layout, parts

    def _dequantize_2d(self, tensor: QuantizedTensor, layout: str | None = None) -> torch.Tensor:
        layout, parts = self._layout_parts(tensor, layout)
        values = self._dequantize_layout(parts, layout)
        return values.t() if self._is_transposed(layout) else values

    def describe_buffers(self, shape: Sequence[int], *, device: torch.device | str = "cpu") -> BufferSpec:
        del device
        shape = as_dims(shape)
        self._check_shape(shape)
        m, k = rows_cols(shape)
        spec: BufferSpec = {}
        for layout in self._used_layouts():
            rows, cols = self._layout_shape(m, k, layout)
            parts = self._describe_layout(rows, cols, layout)
            parts["data"] = (self._data_shape(shape, layout), parts["data"][1])  # TE's N-D data shape
            spec.update({layout_buffer_name(layout, part): s for part, s in parts.items()})
        order = self.tensor_class._FLATTEN_TENSOR_BUFFERS
        return {name: spec[name] for name in order if name in spec}


def check_block_multiple(owner: str, shape: tuple[int, ...], block: int) -> None:
    """Both dims of the 2-D view a multiple of ``block``, whatever the usages: TE's
    ``create_tensor`` checks the product of the leading dims (the column-wise blocks' dim)
    and the last dim (the row-wise blocks') before it allocates anything, so a row-wise-only
    tensor of one row is refused too (``pytorch/csrc/quantizer.cpp``, MXFP8 and NVFP4)."""
    m, k = rows_cols(shape)
    if m % block:
        raise ValueError(
            f"{owner}: the product of the leading dims must be a multiple of {block} for any usage, as "
            f"TransformerEngine's create_tensor requires (\"First dim ... must be divisible by {block}\"); "
            f"got shape {shape} (first dim {m})"
        )
    if k % block:
        raise ValueError(
            f"{owner}: the last dim must be a multiple of {block} for any usage, as TransformerEngine's "
            f"create_tensor requires (\"requires tensor dims that are divisible by {block}\"); got shape {shape}"
        )
