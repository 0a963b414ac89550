"""Register value quantizers as torch.compile opaque VALUE types.

A value ("constant") opaque type is baked into the compiled graph as a constant: Dynamo
guards on ``__eq__`` (equal quantizers share one graph, a different value recompiles),
FakeTensor caching uses ``__hash__`` and FX code rebuilds it from ``__fx_repr__``. A
custom op can then take the quantizer itself as an argument.

API differences handled here (registration never crashes import):

- torch >= 2.14: ``register_custom_class(cls, typ="constant")`` (``register_opaque_type``
  and ``typ="value"`` still work there but log deprecation warnings);
- torch 2.11 - 2.13: ``register_opaque_type(cls, typ="value")``; on 2.11/2.12 the class
  also needs the ``OpaqueBaseMeta`` metaclass (the Quantizer base picks it by version);
- older torch: no API; registration is skipped with ONE warning and the quantizers still
  work eagerly (a compiled region then graph-breaks at the custom op).

The value fields and the flag below are also registered as USE_REAL members: torch 2.11
lets Dynamo read only registered members of an opaque object (2.14 reads any attribute
of a constant type). Measured on torch 2.11 + CUDA (H200): registration, the flag and
fullgraph compiles of ops taking a quantizer all work.

Registration stamps ``_tetrt_value_opaque = True`` on the class, read by
:func:`is_value_opaque_quantizer`: a plain attribute read is something Dynamo can fold to
a constant inside a compiled region, where ``type(q) in registered_set`` is not.
"""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

from tetrt_support.quant.quantizer import Quantizer, class_value_fields

Q = TypeVar("Q", bound=type)
_warned_missing_api = False


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


def _constant_members(cls: type[Quantizer]) -> dict[str, Any]:
    """The attributes a compiled region may read, as USE_REAL (baked-in constant) members.

    torch 2.11 lets Dynamo read only REGISTERED members of an opaque object ("Attempted to
    access unregistered member on an OpaqueObject", measured on the H200 box); 2.14 lets a
    constant type read any attribute. For a value type every value field is a constant
    under its ``__eq__`` guard, so registering them as USE_REAL is exact on both.
    """
    try:
        from torch._library.opaque_object import MemberType
    except ImportError:
        return {}
    names = ("_tetrt_value_opaque", *class_value_fields(cls))
    return {name: MemberType.USE_REAL for name in names}


def opaque_api_available() -> bool:
    """Whether this torch can register value-typed opaque objects at all."""
    return _registration_api() is not None


def register_value_opaque_quantizer(cls: Q, *, hoist: bool = False) -> Q:
    """Register a value-semantics Quantizer subclass as an opaque value type; returns ``cls``.

    ``hoist=True`` asks torch to lift the object to a graph INPUT instead of baking it
    into the graph as a constant (guards still compare by ``__eq__``; see notebook 03).
    Usable as a decorator. On a torch without the API it warns once and returns ``cls``
    unregistered (``is_value_opaque_quantizer`` then stays False for it).
    """
    global _warned_missing_api
    if not (isinstance(cls, type) and issubclass(cls, Quantizer)):
        raise TypeError(f"register_value_opaque_quantizer: expected a Quantizer subclass, got {cls!r}")
    if not cls._value_semantics:
        raise TypeError(
            f"register_value_opaque_quantizer: {cls.__name__} has identity semantics (it holds live state); "
            "only quantizers with _value_semantics = True can be opaque value types"
        )
    api = _registration_api()
    if api is None:
        if not _warned_missing_api:
            _warned_missing_api = True
            warnings.warn(
                "tetrt_support.quant: this torch has no opaque-object API (torch._library.opaque_object, "
                "torch >= 2.11); quantizers are not registered as value types and a compiled region will "
                "graph-break at ops taking them",
                RuntimeWarning,
                stacklevel=2,
            )
        return cls
    register, typ = api
    try:
        # Some releases' register_opaque_type has no ``hoist`` keyword: pass it only when asked.
        options: dict[str, Any] = {"hoist": True} if hoist else {}
        members = _constant_members(cls)
        if members:
            options["members"] = members
        register(cls, typ=typ, **options)
    except (RuntimeError, TypeError, ValueError) as error:  # a partial/experimental API must not break import
        warnings.warn(f"tetrt_support.quant: could not register {cls.__name__} as an opaque value type: {error}", RuntimeWarning, stacklevel=2)
        return cls
    cls._tetrt_value_opaque = True
    return cls


def is_value_opaque_quantizer(quantizer: Any) -> bool:
    """Whether ``quantizer``'s class was registered as an opaque value type (compile-safe)."""
    return bool(getattr(quantizer, "_tetrt_value_opaque", False))


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
    import torch

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
