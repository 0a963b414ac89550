"""The one op -> rule table (:data:`RULES`) and what a rule is called with.

:class:`RuleRegistry` refuses a second rule for an op; :class:`RuleContext` carries the
original meta values a rule may reason about; :func:`bind_arguments` binds an ATen call to
its schema names. Each family module collects its rules in a :class:`Family`, and the
package's ``__init__`` adds them to :data:`RULES` in one fixed order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from tetrt_support.complex.detect import is_complex_value

__all__ = [
    "RULES",
    "Family",
    "Rule",
    "RuleContext",
    "RuleRegistry",
    "bind_arguments",
    "real_dtype",
    "register",
    "rule_for",
]

Rule = Callable[..., Any]


class RuleRegistry(Mapping[Any, Rule]):
    """The op -> rule table, read as a mapping, written only through :meth:`register`.

    Registering a second rule for an op is refused (as ``torch.utils._pytree`` refuses a
    second registration of a node type): a silent overwrite would change what one strategy
    or both emit depending on import order. Replacing a rule is an explicit
    :meth:`unregister` followed by :meth:`register`."""

    def __init__(self) -> None:
        self._rules: dict[Any, Rule] = {}

    def register(self, *ops: Any) -> Callable[[Rule], Rule]:
        """Decorator: ``fn`` becomes the rule of every op in ``ops``."""
        if not ops:
            raise TypeError("register() needs at least one op")

        if len(set(ops)) != len(ops):
            raise ValueError(f"register() got the same op twice: {[_op_label(op) for op in ops]}")

        def deco(fn: Rule) -> Rule:
            for op in ops:  # check all before adding any: a refused call changes nothing
                if op in self._rules:
                    raise ValueError(
                        f"{_op_label(op)} already has a complex lowering rule "
                        f"({_rule_label(self._rules[op])}); refusing to register {_rule_label(fn)} "
                        f"for it. Unregister the existing rule first to replace it."
                    )
            for op in ops:
                self._rules[op] = fn
            return fn

        return deco

    def unregister(self, op: Any) -> Rule:
        """Remove and return the rule of ``op``; KeyError naming the op if it has none."""
        try:
            return self._rules.pop(op)
        except KeyError:
            raise KeyError(f"{_op_label(op)} has no complex lowering rule to unregister") from None

    def __getitem__(self, op: Any) -> Rule:
        return self._rules[op]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rules)  # registration order

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"RuleRegistry({len(self)} ops)"


def _op_label(op: Any) -> str:
    return op.name() if isinstance(op, torch._ops.OpOverload) else repr(op)


def _rule_label(fn: Rule) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


RULES = RuleRegistry()
register = RULES.register


@dataclass(frozen=True)
class RuleContext:
    """What a rule may look at besides its (packed) arguments: the node and the ORIGINAL
    meta values of its arguments (``vals``, by schema name) and of its result (``out``)."""

    node: fx.Node
    vals: dict[str, Any]
    out: Any

    def is_complex(self, name: str) -> bool:
        return is_complex_value(self.vals.get(name))

    def rank(self, name: str = "self") -> int:
        """Rank of the (unpacked) tensor argument ``name``."""
        return self.vals[name].dim()

    @property
    def dtype(self) -> torch.dtype:
        """The real dtype of the result when packed (float32 for complex64)."""
        return real_dtype(_first_tensor(self.out).dtype)

    @property
    def device(self) -> torch.device:
        return _first_tensor(self.out).device


def _first_tensor(val: Any) -> torch.Tensor:
    if isinstance(val, torch.Tensor):
        return val
    for v in val:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"no tensor in {val!r}")


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for complex64, float64 for complex128; real dtypes map to themselves."""
    return dtype.to_real() if dtype.is_complex else dtype


def bind_arguments(target: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Bind an OpOverload call to its schema names, defaults filled in."""
    schema = target._schema
    bound: dict[str, Any] = {}
    positional = list(args)
    for i, arg in enumerate(schema.arguments):
        if i < len(positional) and not arg.kwarg_only:
            bound[arg.name] = positional[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            raise TypeError(f"{target}: missing argument {arg.name!r}")
    return bound


def rule_for(target: Any) -> Rule | None:
    return RULES.get(target)


class Family:
    """The rules one module defines, by name, in definition order, until the package's
    ``__init__`` adds them to :data:`RULES` (in its own fixed order, by these names)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: dict[str, tuple[tuple[Any, ...], Rule]] = {}

    def add(self, name: str, ops: tuple[Any, ...], fn: Rule) -> Rule:
        """``fn``, under ``name``, is to become the rule of every op in ``ops``."""
        if name in self.entries:
            raise ValueError(f"{self.name}: two rules named {name!r}")
        self.entries[name] = (ops, fn)
        return fn

    def rule(self, *ops: Any) -> Callable[[Rule], Rule]:
        """Decorator: :meth:`add` under the function's own name."""
        return lambda fn: self.add(fn.__name__, ops, fn)

    def __repr__(self) -> str:
        return f"Family({self.name!r}, {len(self.entries)} rules)"
