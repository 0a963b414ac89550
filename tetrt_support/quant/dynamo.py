"""The torch.compile glue: value-quantizer registration, ``__fx_repr__`` and its rebuild.

A value opaque type is a constant of the compiled graph: Dynamo guards on ``__eq__``,
FakeTensor caching uses ``__hash__``, FX code rebuilds it from ``__fx_repr__``, and a custom
op can take the quantizer as an argument. :func:`register_value_quantizer` is the one opt-in
point; it handles torch's API differences across versions and never crashes import
(``docs/architecture.md``, "Module notes", value identity).
"""

from __future__ import annotations

import math
import typing
import warnings
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from tetrt_support.quant.base import Quantizer, annotated_fields, construct_quantizer

Q = TypeVar("Q", bound=type)
VALUE_FIELD_TYPES = (bool, int, float, str, torch.dtype)
_warned_missing_api = False


# -------------------------------------------------------------- fx repr / rebuild
def _literal(value: Any, *, field: str) -> str:
    """A Python expression that evaluates back to ``value`` with builtins only (no ``torch``)."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, torch.dtype):
        return repr(str(value).removeprefix("torch."))  # a name; the rebuild turns it back
    raise TypeError(
        f"__fx_repr__: value field {field!r} holds a {type(value).__name__}, which has no literal "
        "form in FX code; value fields must be None/bool/int/float/str/torch.dtype"
    )


_REBUILT: dict[tuple[type, tuple[tuple[str, Any], ...]], Quantizer] = {}


def rebuild_quantizer(cls: type[Quantizer], items: Sequence[tuple[str, Any]]) -> Quantizer:
    """The frozen value quantizer of this class and these value fields, built once.

    Called by the expressions :func:`quantizer_fx_repr` writes into FX code; the class
    comes in as an argument (captured in the FX globals), so there is no name registry.
    Fields declared ``torch.dtype`` travel as their names and are turned back here.

    Inductor's wrapper evaluates those expressions on EVERY call of a compiled graph, so
    each (class, fields) is built once, frozen (:meth:`Quantizer.freeze`: immutable, so
    sharing it cannot leak a change into a later call) and returned from then on:
    rebuilding cost host time per call (NVFP4's derived Hadamard matrix alone 0.1-0.2 ms
    on a CPU). Built outside any fake mode, so that derived tensors are real even
    when a trace evaluates the expression first.
    """
    items = tuple((name, value) for name, value in items)
    key = (cls, items)
    rebuilt = _REBUILT.get(key)
    if rebuilt is None:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        dtype_fields = cls.__dict__.get("_value_dtype_fields", ())
        with unset_fake_temporarily():
            rebuilt = construct_quantizer(
                cls,
                ((name, getattr(torch, value) if name in dtype_fields and isinstance(value, str) else value)
                 for name, value in items),
            ).freeze()
        _REBUILT[key] = rebuilt
    return rebuilt


def quantizer_fx_repr(self: Quantizer) -> tuple[str, dict[str, Any]]:
    """``(expression, globals)`` that rebuilds ``self`` in FX-generated code.

    Self-contained: evaluating the expression needs only the returned globals (no
    ``torch`` from the surrounding scope), so it also survives inductor's FX graph cache,
    which must pickle those globals.
    """
    cls, items = self._value_key()
    class_name = "tetrt_q_" + "".join(c if c.isalnum() else "_" for c in f"{cls.__module__}.{cls.__qualname__}")
    fields = ", ".join(f"({name!r}, {_literal(value, field=name)})" for name, value in items)
    return f"tetrt_rebuild_quantizer({class_name}, ({fields},))", {"tetrt_rebuild_quantizer": rebuild_quantizer, class_name: cls}


# --------------------------------------------------------------- registration
def _registration_api() -> tuple[Any, str] | None:
    """(register function, value typ name) for this torch, or None when it has no API."""
    try:
        from torch._library import opaque_object
    except ImportError:
        return None
    register = getattr(opaque_object, "register_custom_class", None)
    if register is not None:
        return register, "constant"
    register = getattr(opaque_object, "register_opaque_type", None)
    if register is not None:
        return register, "value"
    return None


def opaque_api_available() -> bool:
    """Whether this torch can register value-typed opaque objects at all."""
    return _registration_api() is not None


def value_field_types(cls: type[Quantizer]) -> dict[str, type]:
    """Each annotated value field of ``cls`` with its resolved type; a TypeError names a
    field that is not a plain value (a tensor, a group, a container)."""
    hints = typing.get_type_hints(cls)
    resolved = {}
    for name in annotated_fields(cls):
        typ = hints[name]
        if typ not in VALUE_FIELD_TYPES:
            raise TypeError(
                f"{cls.__name__} cannot be a value quantizer: field {name!r} is annotated {typ!r}, not one of "
                f"{tuple(t.__name__ for t in VALUE_FIELD_TYPES)}; state that is not a plain value (a tensor, "
                "live scaling state, a process group) keeps identity semantics, and derived tensors belong in "
                "_derived_* attributes rebuilt by _rebuild_derived_state"
            )
        resolved[name] = typ
    return resolved


def _constant_members(cls: type[Quantizer], fields: Sequence[str]) -> dict[str, Any]:
    """The attributes a compiled region may read, as USE_REAL (baked-in constant) members."""
    try:
        from torch._library.opaque_object import MemberType
    except ImportError:
        return {}
    return {name: MemberType.USE_REAL for name in ("_tetrt_value_opaque", *fields)}


def register_value_quantizer(cls: Q, *, hoist: bool = False) -> Q:
    """Make ``cls`` a value quantizer and register it as an opaque value type; returns ``cls``.

    Every class registers itself: a subclass of a registered quantizer has identity
    semantics until it is registered too. ``hoist=True`` asks torch to lift the object to
    a graph INPUT instead of baking it in as a constant (guards still compare by
    ``__eq__``). A class registered twice raises (like torch.utils._pytree's registries).
    """
    global _warned_missing_api
    if not (isinstance(cls, type) and issubclass(cls, Quantizer)):
        raise TypeError(f"register_value_quantizer: expected a Quantizer subclass, got {cls!r}")
    if "_value_field_names" in cls.__dict__:
        raise ValueError(f"register_value_quantizer: {cls.__qualname__} is already registered")
    types = value_field_types(cls)
    cls._value_field_names = tuple(types)
    cls._value_dtype_fields = tuple(name for name, typ in types.items() if typ is torch.dtype)
    if "__fx_repr__" not in cls.__dict__:
        cls.__fx_repr__ = quantizer_fx_repr
    api = _registration_api()
    if api is None:
        if not _warned_missing_api:
            _warned_missing_api = True
            warnings.warn(
                "tetrt_support.quant: this torch has no opaque-object API (torch._library.opaque_object, "
                "torch >= 2.11); quantizers keep value semantics but are not registered with torch.compile, "
                "and a compiled region will graph-break at ops taking them",
                RuntimeWarning,
                stacklevel=2,
            )
        return cls
    register, typ = api
    try:
        # Some releases' register_opaque_type has no ``hoist`` keyword: pass it only when asked.
        options: dict[str, Any] = {"hoist": True} if hoist else {}
        members = _constant_members(cls, cls._value_field_names)
        if members:
            options["members"] = members
        register(cls, typ=typ, **options)
    except (RuntimeError, TypeError, ValueError) as error:  # a partial/experimental API must not break import
        warnings.warn(f"tetrt_support.quant: could not register {cls.__name__} as an opaque value type: {error}", RuntimeWarning, stacklevel=2)
        return cls
    cls._tetrt_value_opaque = True
    return cls


def is_value_opaque_quantizer(quantizer: Any) -> bool:
    """Whether ``quantizer``'s own class was registered as an opaque value type (compile-safe)."""
    return bool(getattr(quantizer, "_tetrt_value_opaque", False))


# ------------------------------------------------------------ the smallest op
_QDQ_OPS: dict[type, Any] = {}


def qdq_op(cls: type[Quantizer]) -> Any:
    """A custom op ``(x, quantizer: cls) -> quantizer.quantize(x).dequantize()`` (one per class, cached).

    The smallest op that takes a quantizer as an argument of ``cls``'s opaque type: the
    schema names the registered type, so ``cls`` must be registered (torch >= 2.11) before
    the first call. Its fake impl returns ``empty_like(x)``.
    """
    op = _QDQ_OPS.get(cls)
    if op is not None:
        return op

    def qdq(x, quantizer):
        return quantizer.quantize(x).dequantize()

    # Real types (not postponed strings): the schema must name cls's registered opaque type.
    qdq.__annotations__ = {"x": torch.Tensor, "quantizer": cls, "return": torch.Tensor}
    op = torch.library.custom_op(f"tetrt_quant::qdq_{cls.__name__}", qdq, mutates_args=())

    @op.register_fake
    def _(x, quantizer):
        return torch.empty_like(x)

    _QDQ_OPS[cls] = op
    return op
