"""ONE table of per-op rules that lower complex ATen ops to real arithmetic.

A complex tensor of shape ``S`` travels *packed*: a real tensor of shape ``S + [2]``
holding (real, imaginary) on the trailing dimension, exactly what ``view_as_real``
returns. A rule is a Python function::

    rule(ctx: RuleContext, **arguments) -> packed result

called with the op's arguments bound to their schema names, complex ones packed, and
everything else (real tensors, scalars, Python ``complex`` scalars, dims, sizes) as it
was. Rules use only ``torch.ops.aten`` calls and Python control flow over ``ctx`` (the
original meta values: ranks, dtypes, which arguments are complex), never over the
values themselves, so the same function runs on

- real or fake tensors inside an ``fx.Interpreter`` under ``make_fx`` (the "retrace"
  strategy, :mod:`.retrace`), and
- ``torch.fx.Proxy`` objects bound to the exported graph (the in-place "rewrite"
  strategy, :mod:`.rewrite`).

Dims are shifted for the packed layout (a negative dim ``d`` becomes ``d - 1``; a
non-negative one is unchanged) and sizes get a trailing ``2``; no rule reads a concrete
size, so dynamic (symbolic) batch and sequence dims survive.
"""

from __future__ import annotations

import cmath
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from tetrt_support.complex.detect import is_complex_value
from tetrt_support.complex.special_values import (
    acos_special,
    acosh_special,
    asin_special,
    asinh_special,
    atanh_special,
    exp_special,
    exp_special_inputs,
    overlay,
    sqrt_special,
)

__all__ = ["RULES", "Rule", "RuleContext", "RuleRegistry", "bind_arguments", "real_dtype", "register", "rule_for"]

aten = torch.ops.aten

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


# ---------------------------------------------------------------------------- helpers
def _dim(d: int) -> int:
    """A dim of a complex tensor, as a dim of its packed form."""
    return d - 1 if d < 0 else d


def _re(x: Any) -> Any:
    return aten.select.int(x, -1, 0)


def _im(x: Any) -> Any:
    return aten.select.int(x, -1, 1)


def _pack(re: Any, im: Any) -> Any:
    return aten.stack.default([re, im], -1)


def _cast(x: Any, have: torch.dtype, want: torch.dtype) -> Any:
    return x if have == want else aten._to_copy.default(x, dtype=want)


def _scalar(ctx: RuleContext, value: Any, dtype: torch.dtype) -> Any:
    return aten.scalar_tensor.default(value, dtype=dtype, device=ctx.device)


def _packed(ctx: RuleContext, name: str, x: Any, dtype: torch.dtype | None = None) -> Any:
    """Argument ``name`` (complex, real tensor or scalar) as a packed tensor of ``dtype``."""
    dtype = dtype or ctx.dtype
    v = ctx.vals[name]
    if isinstance(v, torch.Tensor):
        if v.is_complex():
            return _cast(x, real_dtype(v.dtype), dtype)
        x = _cast(x, v.dtype, dtype)
        return _pack(x, aten.zeros_like.default(x))
    z = complex(v) if isinstance(v, (int, float, complex, bool)) else None
    if z is not None and isinstance(x, (int, float, complex, bool)):
        return _pack(_scalar(ctx, z.real, dtype), _scalar(ctx, z.imag, dtype))
    return _pack(_scalar(ctx, x, dtype), _scalar(ctx, 0.0, dtype))  # symbolic real scalar


def _parts(ctx: RuleContext, name: str, x: Any) -> tuple[Any, Any]:
    """(real, imaginary) of argument ``name``; imaginary is None for a real value."""
    v = ctx.vals[name]
    if isinstance(v, torch.Tensor):
        if v.is_complex():
            x = _cast(x, real_dtype(v.dtype), ctx.dtype)
            return _re(x), _im(x)
        return _cast(x, v.dtype, ctx.dtype), None
    if isinstance(x, complex):
        return x.real, x.imag
    return x, None


def _promoted(ctx: RuleContext, name: str, x: Any) -> tuple[Any, Any]:
    """(real, imaginary) of argument ``name`` promoted to complex as TensorIterator does:
    a real value's imaginary part is ``0.0``, a zero that takes part in the arithmetic."""
    re, im = _parts(ctx, name, x)
    return re, 0.0 if im is None else im


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    if not (_is_tensor(a) or _is_tensor(b)):
        return a + b
    return aten.add.Tensor(a, b) if _is_tensor(a) else aten.add.Tensor(b, a)


def _mul(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    if not _is_tensor(b) and b == 1:  # x * 1 is x bit for bit (NaN, inf and -0 included)
        return a
    if not _is_tensor(a) and a == 1:
        return b
    if not _is_tensor(a):
        if not _is_tensor(b):
            return a * b
        a, b = b, a
    return aten.mul.Tensor(a, b)


def _sub(a: Any, b: Any) -> Any:
    if b is None:
        return a
    if a is None:
        return _mul(b, -1.0)
    if _is_tensor(a):
        return aten.sub.Tensor(a, b)
    if _is_tensor(b):
        return aten.rsub.Scalar(b, a)
    return a - b


def _join(ctx: RuleContext, re: Any, im: Any, like: Any) -> Any:
    """Pack (re, im) where either may be a Python scalar or None (zero), as tensors
    shaped like ``like``."""
    re = aten.full_like.default(like, 0.0 if re is None else re) if not _is_tensor(re) else re
    im = aten.full_like.default(like, 0.0 if im is None else im) if not _is_tensor(im) else im
    return _pack(re, im)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, fx.Proxy | torch.Tensor)


def _complex_mul(ar: Any, ai: Any, br: Any, bi: Any) -> tuple[Any, Any]:
    return _sub(_mul(ar, br), _mul(ai, bi)), _add(_mul(ar, bi), _mul(ai, br))


def _abs2(x: Any) -> Any:
    re, im = _re(x), _im(x)
    return aten.add.Tensor(aten.mul.Tensor(re, re), aten.mul.Tensor(im, im))


def _polar(mag: Any, ang: Any) -> Any:
    return _pack(aten.mul.Tensor(mag, aten.cos.default(ang)), aten.mul.Tensor(mag, aten.sin.default(ang)))


def _exp_packed(x: Any) -> Any:
    # exp(x + 0i) is exp(x) + 0i even where exp(x) overflows (inf * sin(0) would be NaN)
    re, ang = _re(x), _im(x)
    mag = aten.exp.default(re)
    im = aten.where.self(aten.eq.Scalar(ang, 0.0), ang, aten.mul.Tensor(mag, aten.sin.default(ang)))
    finite = (aten.mul.Tensor(mag, aten.cos.default(ang)), im)
    return _pack(*overlay(finite, exp_special(re, ang), re, ang, special_at=exp_special_inputs(re, ang)))


def _log_packed(x: Any) -> Any:
    return _pack(*_log_parts(_re(x), _im(x)))


def _mul_packed(a: Any, b: Any) -> Any:
    re, im = _complex_mul(_re(a), _im(a), _re(b), _im(b))
    return _pack(re, im)


def _div_packed(a: Any, b: Any) -> Any:
    """Complex division by torch's scaled algorithm (:func:`_div_parts`): the textbook
    ``(ac + bd) / (c^2 + d^2)`` overflows once ``|b|`` passes ``sqrt(max float)``."""
    return _pack(*_div_parts(_re(a), _im(a), _re(b), _im(b)))


# ------------------------------------------------------------------ elementwise arithmetic
def _add_like(ctx: RuleContext, self: Any, other: Any, alpha: Any, sign: float) -> Any:
    """``self + sign * alpha * other`` as torch computes it: both operands promoted to
    complex, then ``a + alpha' * b`` with ``alpha' = sign * alpha`` a complex scalar (ATen's
    sub is add with ``-alpha``), multiplied in full even for alpha 1, so that
    ``0 + (inf + 0i)`` is ``(inf, nan)`` as in eager."""
    ar, ai = _promoted(ctx, "self", self)
    a = complex(alpha) * sign
    br, bi = _complex_mul(a.real, a.imag, *_promoted(ctx, "other", other))
    re, im = _add(ar, br), _add(ai, bi)
    return _join(ctx, re, im, re if _is_tensor(re) else im)


@register(aten.add.Tensor, aten.add.Scalar)
def add(ctx: RuleContext, self: Any, other: Any, alpha: Any = 1) -> Any:
    return _add_like(ctx, self, other, alpha, 1.0)


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(ctx: RuleContext, self: Any, other: Any, alpha: Any = 1) -> Any:
    return _add_like(ctx, self, other, alpha, -1.0)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx: RuleContext, self: Any, other: Any, alpha: Any = 1) -> Any:
    swapped = RuleContext(ctx.node, {"self": ctx.vals["other"], "other": ctx.vals["self"]}, ctx.out)
    return _add_like(swapped, other, self, alpha, -1.0)


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx: RuleContext, self: Any, other: Any) -> Any:
    # torch promotes a real operand to complex (value + 0i) and multiplies in full, so
    # (inf + 1i) * 2 is (inf, nan), not (inf, 2): no shortcut for a real side
    re, im = _complex_mul(*_promoted(ctx, "self", self), *_promoted(ctx, "other", other))
    return _join(ctx, re, im, re if _is_tensor(re) else im)


@register(aten.div.Tensor, aten.div.Scalar)
def div(ctx: RuleContext, self: Any, other: Any) -> Any:
    # the same promotion, then torch's scaled complex division (also for a complex scalar)
    return _div_packed(_packed(ctx, "self", self), _packed(ctx, "other", other))


@register(aten.neg.default)
def neg(ctx: RuleContext, self: Any) -> Any:
    return aten.neg.default(self)


@register(aten._conj.default, aten.conj_physical.default, aten.conj.default)
def conj(ctx: RuleContext, self: Any) -> Any:
    return _pack(_re(self), aten.neg.default(_im(self)))


@register(aten.resolve_conj.default, aten.resolve_neg.default, aten.alias.default, aten.detach.default)
def identity_view(ctx: RuleContext, self: Any) -> Any:
    return aten.alias.default(self)


@register(aten.clone.default)
def clone(ctx: RuleContext, self: Any, memory_format: Any = None) -> Any:
    return aten.clone.default(self)  # a memory format of the unpacked rank means nothing packed


@register(aten.contiguous.default)
def contiguous(ctx: RuleContext, self: Any, memory_format: Any = None) -> Any:
    return aten.contiguous.default(self)


@register(aten.lift_fresh_copy.default)
def lift_fresh_copy(ctx: RuleContext, self: Any) -> Any:
    return aten.clone.default(self)


@register(aten.reciprocal.default)
def reciprocal(ctx: RuleContext, self: Any) -> Any:
    """``1 / z`` by the scaled division (torch's complex ``reciprocal`` is ``1 / z``)."""
    re, im = _re(self), _im(self)
    return _pack(*_div_parts(aten.ones_like.default(re), aten.zeros_like.default(im), re, im))


@register(aten.abs.default)
def abs_(ctx: RuleContext, self: Any) -> Any:
    return _magnitude(_re(self), _im(self))  # a scaled hypot, as std::abs: no overflow


@register(aten.angle.default)
def angle(ctx: RuleContext, self: Any) -> Any:
    return aten.atan2.default(_im(self), _re(self))


@register(aten.real.default)
def real(ctx: RuleContext, self: Any) -> Any:
    return _re(self)


@register(aten.imag.default)
def imag(ctx: RuleContext, self: Any) -> Any:
    return _im(self)


@register(aten.view_as_real.default)
def view_as_real(ctx: RuleContext, self: Any) -> Any:
    return self  # a packed value already IS its view_as_real


@register(aten.view_as_complex.default)
def view_as_complex(ctx: RuleContext, self: Any) -> Any:
    return self  # a real [..., 2] tensor already IS the packed complex


@register(aten.polar.default)
def polar(ctx: RuleContext, abs: Any, angle: Any) -> Any:
    return _polar(abs, angle)


@register(aten.complex.default)
def complex_(ctx: RuleContext, real: Any, imag: Any) -> Any:
    both = aten.broadcast_tensors.default([real, imag])
    return _pack(both[0], both[1])


@register(aten.exp.default)
def exp(ctx: RuleContext, self: Any) -> Any:
    return _exp_packed(self)


@register(aten.log.default)
def log(ctx: RuleContext, self: Any) -> Any:
    return _log_packed(self)


@register(aten.sqrt.default)
def sqrt(ctx: RuleContext, self: Any) -> Any:
    x, y = _re(self), _im(self)
    return _pack(*overlay(_sqrt_parts(x, y), sqrt_special(x, y), x, y))


@register(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(ctx: RuleContext, self: Any, exponent: Any) -> Any:
    self = _packed(ctx, "self", self)  # a real base with a complex exponent, too
    if isinstance(exponent, complex) and exponent.imag != 0:
        w = exponent
        lz = _log_packed(self)
        re, im = _complex_mul(_re(lz), _im(lz), w.real, w.imag)
        return _exp_packed(_pack(re, im))
    p = exponent.real if isinstance(exponent, complex) else exponent
    mag = aten.pow.Tensor_Scalar(_abs2(self), p * 0.5)
    return _polar(mag, aten.mul.Tensor(aten.atan2.default(_im(self), _re(self)), p))


@register(aten.pow.Tensor_Tensor)
def pow_tensor_tensor(ctx: RuleContext, self: Any, exponent: Any) -> Any:
    base = _packed(ctx, "self", self)
    return _exp_packed(_mul_packed(_log_packed(base), _packed(ctx, "exponent", exponent)))


@register(aten.pow.Scalar)
def pow_scalar(ctx: RuleContext, self: Any, exponent: Any) -> Any:
    lw = cmath.log(complex(self))  # the base is a Python number
    e = _packed(ctx, "exponent", exponent)
    re, im = _complex_mul(_re(e), _im(e), lw.real, lw.imag)
    return _exp_packed(_pack(re, im))


@register(aten.sin.default)
def sin(ctx: RuleContext, self: Any) -> Any:
    a, b = _re(self), _im(self)
    return _pack(
        aten.mul.Tensor(aten.sin.default(a), aten.cosh.default(b)),
        aten.mul.Tensor(aten.cos.default(a), aten.sinh.default(b)),
    )


@register(aten.cos.default)
def cos(ctx: RuleContext, self: Any) -> Any:
    a, b = _re(self), _im(self)
    return _pack(
        aten.mul.Tensor(aten.cos.default(a), aten.cosh.default(b)),
        aten.neg.default(aten.mul.Tensor(aten.sin.default(a), aten.sinh.default(b))),
    )


@register(aten.sinh.default)
def sinh(ctx: RuleContext, self: Any) -> Any:
    a, b = _re(self), _im(self)
    return _pack(
        aten.mul.Tensor(aten.sinh.default(a), aten.cos.default(b)),
        aten.mul.Tensor(aten.cosh.default(a), aten.sin.default(b)),
    )


@register(aten.cosh.default)
def cosh(ctx: RuleContext, self: Any) -> Any:
    a, b = _re(self), _im(self)
    return _pack(
        aten.mul.Tensor(aten.cosh.default(a), aten.cos.default(b)),
        aten.mul.Tensor(aten.sinh.default(a), aten.sin.default(b)),
    )


@register(aten.tan.default)
def tan(ctx: RuleContext, self: Any) -> Any:
    # tan(a+bi) = (sin 2a + i sinh 2b) / (cos 2a + cosh 2b)
    a2, b2 = aten.mul.Tensor(_re(self), 2.0), aten.mul.Tensor(_im(self), 2.0)
    den = aten.add.Tensor(aten.cos.default(a2), aten.cosh.default(b2))
    return _pack(aten.div.Tensor(aten.sin.default(a2), den), aten.div.Tensor(aten.sinh.default(b2), den))


@register(aten.tanh.default)
def tanh(ctx: RuleContext, self: Any) -> Any:
    # tanh(a+bi) = (sinh 2a + i sin 2b) / (cosh 2a + cos 2b)
    a2, b2 = aten.mul.Tensor(_re(self), 2.0), aten.mul.Tensor(_im(self), 2.0)
    den = aten.add.Tensor(aten.cosh.default(a2), aten.cos.default(b2))
    return _pack(aten.div.Tensor(aten.sinh.default(a2), den), aten.div.Tensor(aten.sin.default(b2), den))


@register(aten.isnan.default)
def isnan(ctx: RuleContext, self: Any) -> Any:
    return aten.logical_or.default(aten.isnan.default(_re(self)), aten.isnan.default(_im(self)))


@register(aten.isinf.default)
def isinf(ctx: RuleContext, self: Any) -> Any:
    return aten.logical_or.default(aten.isinf.default(_re(self)), aten.isinf.default(_im(self)))


@register(aten.isfinite.default)
def isfinite(ctx: RuleContext, self: Any) -> Any:
    return aten.logical_and.default(aten.isfinite.default(_re(self)), aten.isfinite.default(_im(self)))


def _where(cond: Any, a: Any, b: Any) -> Any:
    if _is_tensor(a):
        return aten.where.self(cond, a, b) if _is_tensor(b) else aten.where.ScalarOther(cond, a, b)
    return aten.where.ScalarSelf(cond, a, b) if _is_tensor(b) else aten.where.Scalar(cond, a, b)


@register(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def where(ctx: RuleContext, condition: Any, self: Any, other: Any) -> Any:
    # part by part, so that scalar branches stay scalars (no constant tensors)
    ar, ai = _parts(ctx, "self", self)
    br, bi = _parts(ctx, "other", other)
    zero = lambda re: aten.zeros_like.default(re) if _is_tensor(re) else 0.0  # noqa: E731
    ai = zero(ar) if ai is None else ai
    bi = zero(br) if bi is None else bi
    re, im = _where(condition, ar, br), _where(condition, ai, bi)
    return _pack(re, im)


# ------------------------------------------------------------------- dtype conversions
def _convert(ctx: RuleContext, name: str, x: Any) -> Any:
    """Argument ``name`` converted to the dtype of the result (complex <-> real <-> complex)."""
    v = ctx.vals[name]
    out = ctx.out.dtype
    if out.is_complex:
        return _packed(ctx, name, x, real_dtype(out))
    if v.is_complex():  # complex -> real keeps the real part, as torch does
        return _cast(_re(x), real_dtype(v.dtype), out)
    return _cast(x, v.dtype, out)


@register(aten._to_copy.default, aten.to.dtype_layout, aten.to.dtype, aten.to.device)
def to_dtype(ctx: RuleContext, self: Any, **kwargs: Any) -> Any:
    y = _convert(ctx, "self", self)
    device = kwargs.get("device")
    if device is not None and torch.device(device) != ctx.vals["self"].device:
        y = aten._to_copy.default(y, device=device)
    elif ctx.node.target is aten._to_copy.default or kwargs.get("copy"):
        y = aten.clone.default(y) if y is self else y
    return y


@register(aten.type_as.default)
def type_as(ctx: RuleContext, self: Any, other: Any) -> Any:
    return _convert(ctx, "self", self)


@register(aten.copy.default, aten.copy_.default)
def copy(ctx: RuleContext, self: Any, src: Any, non_blocking: bool = False) -> Any:
    op = ctx.node.target  # copy_ mutates the packed destination, as it would the complex one
    if ctx.out.dtype.is_complex:
        return op(_packed(ctx, "self", self), _convert(ctx, "src", src))
    return op(self, _convert(ctx, "src", src))


@register(aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.full_like.default)
def full_like(ctx: RuleContext, self: Any, fill_value: Any = None, **kwargs: Any) -> Any:
    base = _re(self) if ctx.is_complex("self") else self
    target = ctx.node.target
    fill = {aten.zeros_like.default: 0, aten.empty_like.default: 0, aten.ones_like.default: 1}.get(
        target, fill_value
    )
    out = ctx.out.dtype
    z = complex(fill)
    if not out.is_complex:
        return aten.full_like.default(base, z.real, dtype=out)
    dtype = real_dtype(out)
    return _pack(
        aten.full_like.default(base, z.real, dtype=dtype), aten.full_like.default(base, z.imag, dtype=dtype)
    )


@register(aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format)
def full(ctx: RuleContext, size: Any, fill_value: Any = None, **kwargs: Any) -> Any:
    fill = {aten.zeros.default: 0, aten.empty.memory_format: 0, aten.ones.default: 1}.get(
        ctx.node.target, fill_value
    )
    z = complex(fill)
    dtype, device = ctx.dtype, ctx.device
    return _pack(
        aten.full.default(list(size), z.real, dtype=dtype, device=device),
        aten.full.default(list(size), z.imag, dtype=dtype, device=device),
    )


@register(aten.scalar_tensor.default)
def scalar_tensor(ctx: RuleContext, s: Any, **kwargs: Any) -> Any:
    z = complex(s)
    return _pack(_scalar(ctx, z.real, ctx.dtype), _scalar(ctx, z.imag, ctx.dtype))


# ---------------------------------------------------------------- shapes, views, reductions
@register(aten.reshape.default, aten.view.default, aten._unsafe_view.default)
def reshape(ctx: RuleContext, self: Any, size: Any = None, shape: Any = None) -> Any:
    return aten.reshape.default(self, [*(size if size is not None else shape), 2])


@register(aten.permute.default)
def permute(ctx: RuleContext, self: Any, dims: Any) -> Any:
    r = ctx.rank()
    return aten.permute.default(self, [d % r for d in dims] + [r])


@register(aten.transpose.int)
def transpose(ctx: RuleContext, self: Any, dim0: int, dim1: int) -> Any:
    return aten.transpose.int(self, _dim(dim0), _dim(dim1))


@register(aten.t.default)
def t(ctx: RuleContext, self: Any) -> Any:
    return aten.transpose.int(self, 0, 1) if ctx.rank() == 2 else aten.alias.default(self)


@register(aten.expand.default)
def expand(ctx: RuleContext, self: Any, size: Any, implicit: bool = False) -> Any:
    return aten.expand.default(self, [*size, 2])


@register(aten.unsqueeze.default)
def unsqueeze(ctx: RuleContext, self: Any, dim: int) -> Any:
    return aten.unsqueeze.default(self, _dim(dim))


@register(aten.squeeze.default)
def squeeze(ctx: RuleContext, self: Any) -> Any:
    dims = [i for i, s in enumerate(ctx.vals["self"].shape) if statically_known_true(s == 1)]
    return aten.squeeze.dims(self, dims)


@register(aten.squeeze.dim)
def squeeze_dim(ctx: RuleContext, self: Any, dim: int) -> Any:
    return aten.squeeze.dim(self, _dim(dim))


@register(aten.squeeze.dims)
def squeeze_dims(ctx: RuleContext, self: Any, dim: Any) -> Any:
    return aten.squeeze.dims(self, [_dim(d) for d in dim])


@register(aten.cat.default)
def cat(ctx: RuleContext, tensors: Any, dim: int = 0) -> Any:
    vals = ctx.vals["tensors"]
    parts = [
        _packed(RuleContext(ctx.node, {"t": v}, ctx.out), "t", x)
        for v, x in zip(vals, tensors)
        if not (v.dim() == 1 and statically_known_true(v.shape[0] == 0))  # legacy empty operands
    ]
    return aten.cat.default(parts, _dim(dim))


@register(aten.stack.default)
def stack(ctx: RuleContext, tensors: Any, dim: int = 0) -> Any:
    parts = [_packed(RuleContext(ctx.node, {"t": v}, ctx.out), "t", x) for v, x in zip(ctx.vals["tensors"], tensors)]
    return aten.stack.default(parts, _dim(dim))


@register(aten.select.int)
def select(ctx: RuleContext, self: Any, dim: int, index: Any) -> Any:
    return aten.select.int(self, _dim(dim), index)


@register(aten.slice.Tensor)
def slice_(ctx: RuleContext, self: Any, dim: int = 0, start: Any = None, end: Any = None, step: Any = 1) -> Any:
    return aten.slice.Tensor(self, _dim(dim), start, end, step)


@register(aten.narrow.default)
def narrow(ctx: RuleContext, self: Any, dim: int, start: Any, length: Any) -> Any:
    return aten.narrow.default(self, _dim(dim), start, length)


@register(aten.split.Tensor)
def split(ctx: RuleContext, self: Any, split_size: Any, dim: int = 0) -> Any:
    return aten.split.Tensor(self, split_size, _dim(dim))


@register(aten.split_with_sizes.default)
def split_with_sizes(ctx: RuleContext, self: Any, split_sizes: Any, dim: int = 0) -> Any:
    return aten.split_with_sizes.default(self, split_sizes, _dim(dim))


@register(aten.chunk.default)
def chunk(ctx: RuleContext, self: Any, chunks: int, dim: int = 0) -> Any:
    return aten.chunk.default(self, chunks, _dim(dim))


@register(aten.unbind.int)
def unbind(ctx: RuleContext, self: Any, dim: int = 0) -> Any:
    return aten.unbind.int(self, _dim(dim))


@register(aten.roll.default)
def roll(ctx: RuleContext, self: Any, shifts: Any, dims: Any = ()) -> Any:
    if len(dims) == 0:  # roll of the flattened tensor: flatten all but the pair dim
        flat = aten.reshape.default(self, [-1, 2])
        rolled = aten.roll.default(flat, list(shifts), [0])
        return aten.reshape.default(rolled, [*(aten.sym_size.int(self, i) for i in range(ctx.rank())), 2])
    return aten.roll.default(self, list(shifts), [_dim(d) for d in dims])


@register(aten.flip.default)
def flip(ctx: RuleContext, self: Any, dims: Any) -> Any:
    return aten.flip.default(self, [_dim(d) for d in dims])


@register(aten.flatten.using_ints)
def flatten(ctx: RuleContext, self: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    if ctx.rank() == 0:
        return aten.unsqueeze.default(self, 0)
    return aten.flatten.using_ints(self, _dim(start_dim), _dim(end_dim))


@register(aten.unflatten.int)
def unflatten(ctx: RuleContext, self: Any, dim: int, sizes: Any) -> Any:
    return aten.unflatten.int(self, _dim(dim), sizes)


@register(aten.sym_size.int)
def sym_size(ctx: RuleContext, self: Any, dim: int) -> Any:
    return aten.sym_size.int(self, _dim(dim))


@register(aten.sym_numel.default)
def sym_numel(ctx: RuleContext, self: Any) -> Any:
    return aten.sym_numel.default(_re(self))


@register(aten._assert_tensor_metadata.default)
def assert_tensor_metadata(ctx: RuleContext, a: Any, **kwargs: Any) -> Any:
    return None  # a dtype assertion about a value that no longer exists in complex form


def _reduced_dims(ctx: RuleContext, dim: Any) -> list[int]:
    if dim is None or len(dim) == 0:
        return list(range(ctx.rank()))
    return [_dim(d) for d in dim]


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx: RuleContext, self: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    if ctx.rank() == 0:
        return _cast(self, real_dtype(ctx.vals["self"].dtype), ctx.dtype)
    return aten.sum.dim_IntList(self, _reduced_dims(ctx, dim), keepdim, dtype=ctx.dtype)


@register(aten.mean.dim, aten.mean.default)
def mean(ctx: RuleContext, self: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    if ctx.rank() == 0:
        return _cast(self, real_dtype(ctx.vals["self"].dtype), ctx.dtype)
    return aten.mean.dim(self, _reduced_dims(ctx, dim), keepdim, dtype=ctx.dtype)


@register(aten.prod.dim_int, aten.prod.default)
def prod(ctx: RuleContext, self: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Any:
    # product in polar form: magnitudes multiply, angles add
    x = _cast(self, real_dtype(ctx.vals["self"].dtype), ctx.dtype)
    mag = aten.sqrt.default(_abs2(x))
    ang = aten.atan2.default(_im(x), _re(x))
    if ctx.rank() == 0:
        return _polar(mag, ang)
    if dim is None:
        mag = aten.reshape.default(mag, [-1])
        ang = aten.reshape.default(ang, [-1])
        return _polar(aten.prod.dim_int(mag, 0), aten.sum.dim_IntList(ang, [0]))
    return _polar(aten.prod.dim_int(mag, dim, keepdim), aten.sum.dim_IntList(ang, [dim], keepdim))


def _matmul(op: Any) -> Rule:
    def rule(ctx: RuleContext, self: Any, **operands: Any) -> Any:
        ((name, other),) = operands.items()  # "mat2" for mm/bmm, "other" for matmul
        ar, ai = _parts(ctx, "self", self)
        br, bi = _parts(ctx, name, other)
        mm = lambda a, b: None if a is None or b is None else op(a, b)  # noqa: E731
        re = _sub(mm(ar, br), mm(ai, bi))
        im = _add(mm(ar, bi), mm(ai, br))
        return _pack(re, im)

    return rule


for _op in (aten.mm.default, aten.bmm.default, aten.matmul.default):
    register(_op)(_matmul(_op))  # one rule per op: each calls its own product op
del _op


# ------------------------------------------------------------------ robust complex helpers
# Division, magnitudes and the inverse functions below follow torch's own scalar kernels
# (c10/util/complex.h and complex_math.h), so that huge, tiny, infinite and NaN inputs give
# what eager PyTorch gives instead of overflowing where it does not.


def _magnitude(re: Any, im: Any) -> Any:
    """``|re + i im|`` without overflow or underflow (a scaled hypot, as ``std::abs`` is):
    ``m * sqrt(1 + (n/m)^2)`` with ``m = max(|re|, |im|)``, ``n = min``; inf wins over NaN."""
    ar, ai = aten.abs.default(re), aten.abs.default(im)
    big, small = aten.maximum.default(ar, ai), aten.minimum.default(ar, ai)
    safe = aten.where.ScalarSelf(aten.eq.Scalar(big, 0.0), 1.0, big)
    ratio = aten.div.Tensor(small, safe)
    mag = aten.mul.Tensor(big, aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(ratio, ratio), 1.0)))
    either_inf = aten.logical_or.default(aten.isinf.default(re), aten.isinf.default(im))
    return aten.where.ScalarSelf(either_inf, float("inf"), mag)


def _div_parts(a: Any, b: Any, c: Any, d: Any) -> tuple[Any, Any]:
    """``(a + ib) / (c + id)`` by c10's scaled algorithm (NumPy's, after Smith): divide by
    the larger of ``|c|, |d|`` first, so that ``c^2 + d^2`` is never formed and cannot
    overflow; ``0/0`` gives the same inf/NaN as torch."""
    abs_c, abs_d = aten.abs.default(c), aten.abs.default(d)
    c_wins = aten.ge.Tensor(abs_c, abs_d)
    both_zero = aten.logical_and.default(aten.eq.Scalar(abs_c, 0.0), aten.eq.Scalar(abs_d, 0.0))
    rat1 = aten.div.Tensor(d, c)
    scl1 = aten.reciprocal.default(aten.add.Tensor(c, aten.mul.Tensor(d, rat1)))
    re1 = aten.mul.Tensor(aten.add.Tensor(a, aten.mul.Tensor(b, rat1)), scl1)
    im1 = aten.mul.Tensor(aten.sub.Tensor(b, aten.mul.Tensor(a, rat1)), scl1)
    re0, im0 = aten.div.Tensor(a, abs_c), aten.div.Tensor(b, abs_d)
    rat2 = aten.div.Tensor(c, d)
    scl2 = aten.reciprocal.default(aten.add.Tensor(d, aten.mul.Tensor(c, rat2)))
    re2 = aten.mul.Tensor(aten.add.Tensor(aten.mul.Tensor(a, rat2), b), scl2)
    im2 = aten.mul.Tensor(aten.sub.Tensor(aten.mul.Tensor(b, rat2), a), scl2)
    re = aten.where.self(c_wins, aten.where.self(both_zero, re0, re1), re2)
    im = aten.where.self(c_wins, aten.where.self(both_zero, im0, im1), im2)
    return re, im


def _sqrt_parts(x: Any, y: Any) -> tuple[Any, Any]:
    """Principal ``sqrt(x + iy)`` without cancellation: ``t = sqrt((|x| + |z|) / 2)``, then
    ``(t, y / 2t)`` for ``x >= 0`` and ``(|y| / 2t, copysign(t, y))`` otherwise."""
    # (|x| + |z|) / 4 term by term, then t = sqrt(2) sqrt(that): near the largest float,
    # |x| + |z| itself would overflow
    quarter_sum = aten.add.Tensor(
        aten.mul.Tensor(aten.abs.default(x), 0.25), _magnitude(aten.mul.Tensor(x, 0.25), aten.mul.Tensor(y, 0.25))
    )
    t = aten.mul.Tensor(aten.sqrt.default(quarter_sum), math.sqrt(2.0))
    two_t = aten.mul.Tensor(t, 2.0)
    quotient = aten.div.Tensor(y, two_t)
    # y / 2t is NaN for t = 0 (0/0); the root of zero is zero with the sign of y kept
    quotient = aten.where.self(aten.eq.Scalar(t, 0.0), y, quotient)
    x_nonneg = aten.logical_not.default(aten.signbit.default(x))
    re = aten.where.self(x_nonneg, t, aten.abs.default(quotient))
    im = aten.where.self(x_nonneg, quotient, aten.copysign.Tensor(t, y))
    return re, im


def _mul_parts(a: Any, b: Any, c: Any, d: Any) -> tuple[Any, Any]:
    return aten.sub.Tensor(aten.mul.Tensor(a, c), aten.mul.Tensor(b, d)), aten.add.Tensor(
        aten.mul.Tensor(a, d), aten.mul.Tensor(b, c)
    )


def _log_abs(x: Any, y: Any) -> Any:
    """``log|x + iy|`` as ``log(m) + log1p((n/m)^2) / 2``: finite wherever the answer is,
    even when ``|z|`` itself would overflow (``m = max(|x|, |y|)``, ``n = min``)."""
    ax, ay = aten.abs.default(x), aten.abs.default(y)
    big, small = aten.maximum.default(ax, ay), aten.minimum.default(ax, ay)
    safe = aten.where.ScalarSelf(aten.eq.Scalar(big, 0.0), 1.0, big)
    ratio = aten.div.Tensor(small, safe)
    out = aten.add.Tensor(aten.log.default(big), aten.mul.Tensor(aten.log1p.default(aten.mul.Tensor(ratio, ratio)), 0.5))
    either_inf = aten.logical_or.default(aten.isinf.default(x), aten.isinf.default(y))
    return aten.where.ScalarSelf(either_inf, float("inf"), out)


def _log_parts(x: Any, y: Any) -> tuple[Any, Any]:
    return _log_abs(x, y), aten.atan2.default(y, x)


def _asinh_of_4(w: Any) -> Any:
    """``asinh(4 w)`` for a product ``w`` of halved square roots: its limit
    ``copysign(log(8 |w|), w)`` once ``4 w`` could overflow."""
    limit = aten.copysign.Tensor(aten.add.Tensor(aten.log.default(aten.abs.default(w)), math.log(8.0)), w)
    return aten.where.self(aten.gt.Scalar(aten.abs.default(w), 1e15), limit, aten.asinh.default(aten.mul.Tensor(w, 4.0)))


def _half_roots(x: Any, y: Any, sign: float) -> tuple[Any, Any, Any, Any]:
    """``sqrt(1 - z) / 2`` (``sign = -1``; ``sqrt(z - 1) / 2`` for ``+1``) and ``sqrt(1 + z) / 2``:
    halved, so that their products (``|z|``-sized) stay finite up to the largest float."""
    if sign < 0:
        s1r, s1i = _sqrt_parts(aten.rsub.Scalar(x, 1.0), aten.neg.default(y))
    else:
        s1r, s1i = _sqrt_parts(aten.sub.Tensor(x, 1.0), y)
    s2r, s2i = _sqrt_parts(aten.add.Tensor(x, 1.0), y)
    return tuple(aten.mul.Tensor(v, 0.5) for v in (s1r, s1i, s2r, s2i))  # type: ignore[return-value]


def _asin_parts(x: Any, y: Any) -> tuple[Any, Any]:
    """Kahan's ``asin``: ``atan2(x, Re(s1 s2)) + i asinh(Im(conj(s1) s2))`` with
    ``s1 = sqrt(1 - z)``, ``s2 = sqrt(1 + z)``: right branch cuts, no ``z^2`` to overflow."""
    s1r, s1i, s2r, s2i = _half_roots(x, y, -1.0)
    re_prod = aten.sub.Tensor(aten.mul.Tensor(s1r, s2r), aten.mul.Tensor(s1i, s2i))
    im_conj_prod = aten.sub.Tensor(aten.mul.Tensor(s1r, s2i), aten.mul.Tensor(s1i, s2r))
    return aten.atan2.default(aten.mul.Tensor(x, 0.25), re_prod), _asinh_of_4(im_conj_prod)


def _acos_parts(x: Any, y: Any) -> tuple[Any, Any]:
    """Kahan's ``acos``: ``2 atan2(Re s1, Re s2) + i asinh(Im(conj(s2) s1))``."""
    s1r, s1i, s2r, s2i = _half_roots(x, y, -1.0)
    im_conj_prod = aten.sub.Tensor(aten.mul.Tensor(s2r, s1i), aten.mul.Tensor(s2i, s1r))
    return aten.mul.Tensor(aten.atan2.default(s1r, s2r), 2.0), _asinh_of_4(im_conj_prod)


def _acosh_parts(x: Any, y: Any) -> tuple[Any, Any]:
    """Kahan's ``acosh``: ``asinh(Re(conj(s1) s2)) + 2i atan2(Im s1, Re s2)``,
    ``s1 = sqrt(z - 1)``, ``s2 = sqrt(z + 1)``."""
    s1r, s1i, s2r, s2i = _half_roots(x, y, 1.0)
    re_conj_prod = aten.add.Tensor(aten.mul.Tensor(s1r, s2r), aten.mul.Tensor(s1i, s2i))
    return _asinh_of_4(re_conj_prod), aten.mul.Tensor(aten.atan2.default(s1i, s2r), 2.0)


_ATANH_LARGE = 1e15  # beyond it atanh(z) = 1/z + i*pi/2*sign(y) to double precision


def _atanh_parts(x: Any, y: Any) -> tuple[Any, Any]:
    """Kahan's ``atanh``: ``log1p(4x / ((1-x)^2 + y^2)) / 4 + i atan2(2y, (1-x)(1+x) - y^2) / 2``
    for ``|x| < 1/2`` (no cancellation near 0, where ``log(1+z) - log(1-z)`` loses a tiny
    real part), ``(log|1+z| - log|1-z|) / 2`` for the real part elsewhere; for
    ``|z| > 1e15``, where the squares would overflow, its limit ``1/z + i copysign(pi/2, y)``."""
    one_minus = aten.rsub.Scalar(x, 1.0)
    den = aten.add.Tensor(aten.mul.Tensor(one_minus, one_minus), aten.mul.Tensor(y, y))
    near_zero = aten.mul.Tensor(aten.log1p.default(aten.div.Tensor(aten.mul.Tensor(x, 4.0), den)), 0.25)
    # away from 0 (|x| >= 1/2) the log1p form cancels near z = +-1: log|1+z| - log|1-z| does not
    far = aten.mul.Tensor(aten.sub.Tensor(_log_abs(aten.add.Tensor(x, 1.0), y), _log_abs(one_minus, y)), 0.5)
    re = aten.where.self(aten.lt.Scalar(aten.abs.default(x), 0.5), near_zero, far)
    im_den = aten.sub.Tensor(aten.mul.Tensor(one_minus, aten.add.Tensor(x, 1.0)), aten.mul.Tensor(y, y))
    im = aten.mul.Tensor(aten.atan2.default(aten.mul.Tensor(y, 2.0), im_den), 0.5)
    inv_re, _ = _div_parts(aten.ones_like.default(x), aten.zeros_like.default(y), x, y)
    large = aten.gt.Scalar(_magnitude(x, y), _ATANH_LARGE)
    half_pi = aten.copysign.Tensor(aten.full_like.default(y, math.pi / 2), y)
    return aten.where.self(large, inv_re, re), aten.where.self(large, half_pi, im)


def _log1p_parts(x: Any, y: Any) -> tuple[Any, Any]:
    """c10's CPU ``log1p`` (Kahan's trick, after NumPy): ``u = 1 + z``; ``z`` itself where
    ``u == 1``, ``log(u)`` where ``u - 1 == z``, else ``log(u) * (z / (u - 1))``, which cancels
    the rounding of ``1 + z``. It is also what eager gives at infinities and NaN (where
    ``z / (u - 1)`` is ``inf / inf``, NaN), so no table is needed."""
    u_re = aten.add.Tensor(x, 1.0)
    u_minus_1 = aten.sub.Tensor(u_re, 1.0)
    log_re, log_im = _log_parts(u_re, y)
    ratio_re, ratio_im = _div_parts(x, y, u_minus_1, y)
    corrected_re, corrected_im = _mul_parts(log_re, log_im, ratio_re, ratio_im)
    u_is_one = aten.logical_and.default(aten.eq.Scalar(u_re, 1.0), aten.eq.Scalar(y, 0.0))
    # the imaginary parts of u - 1 and z are both y: equal unless y is NaN
    exact = aten.logical_and.default(aten.eq.Tensor(u_minus_1, x), aten.eq.Tensor(y, y))
    re = aten.where.self(u_is_one, x, aten.where.self(exact, log_re, corrected_re))
    im = aten.where.self(u_is_one, y, aten.where.self(exact, log_im, corrected_im))
    return re, im


# ------------------------------------------------------------------ the inverse functions
def _unary(parts_fn: Callable[[Any, Any], tuple[Any, Any]]) -> Rule:
    def rule(ctx: RuleContext, self: Any) -> Any:
        re, im = parts_fn(_re(self), _im(self))
        return _pack(re, im)

    rule.__doc__ = parts_fn.__doc__
    return rule


def _swap_i(parts_fn: Callable[[Any, Any], tuple[Any, Any]]) -> Callable[[Any, Any], tuple[Any, Any]]:
    """``f(z) = -i g(iz)``: ``asinh`` from ``asin`` and ``atan`` from ``atanh`` (C99's own
    definitions, which keep the branch cuts and the signs of zeros)."""

    def parts(x: Any, y: Any) -> tuple[Any, Any]:
        re, im = parts_fn(aten.neg.default(y), x)  # g(iz), iz = -y + ix
        return im, aten.neg.default(re)  # -i (re + i im) = im - i re

    return parts


def _with_table(
    finite_fn: Callable[[Any, Any], tuple[Any, Any]], special_fn: Callable[[Any, Any], tuple[Any, Any]]
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """``finite_fn`` (Kahan's formula) for finite inputs, ``special_fn`` (the C99 Annex G
    table eager's C library follows, :mod:`tetrt_support.complex.special_values`) elsewhere."""

    def parts(x: Any, y: Any) -> tuple[Any, Any]:
        return overlay(finite_fn(x, y), special_fn(x, y), x, y)

    parts.__doc__ = finite_fn.__doc__
    return parts


_asin_with_table = _with_table(_asin_parts, asin_special)
_atanh_with_table = _with_table(_atanh_parts, atanh_special)
register(aten.asin.default)(_unary(_asin_with_table))
register(aten.acos.default)(_unary(_with_table(_acos_parts, acos_special)))
register(aten.acosh.default)(_unary(_with_table(_acosh_parts, acosh_special)))
register(aten.atanh.default)(_unary(_atanh_with_table))
register(aten.asinh.default)(_unary(_with_table(_swap_i(_asin_parts), asinh_special)))
register(aten.atan.default)(_unary(_swap_i(_atanh_with_table)))
register(aten.log1p.default)(_unary(_log1p_parts))


@register(aten.log2.default, aten.log10.default)
def log_base(ctx: RuleContext, self: Any) -> Any:
    """``log(z) / log(base)``, the magnitude by a scaled hypot (no overflow for huge ``z``)."""
    re, im = _log_parts(_re(self), _im(self))
    inv = 1.0 / math.log(2.0 if ctx.node.target is aten.log2.default else 10.0)
    return _pack(aten.mul.Tensor(re, inv), aten.mul.Tensor(im, inv))


@register(aten.expm1.default)
def expm1(ctx: RuleContext, self: Any) -> Any:
    """c10's ``expm1``: ``expm1(x) cos(y) - 2 sin(y/2)^2 + i e^x sin(y)``, accurate near 0."""
    x, y = _re(self), _im(self)
    half = aten.sin.default(aten.mul.Tensor(y, 0.5))
    re = aten.sub.Tensor(
        aten.mul.Tensor(aten.expm1.default(x), aten.cos.default(y)), aten.mul.Tensor(aten.mul.Tensor(half, half), 2.0)
    )
    return _pack(re, aten.mul.Tensor(aten.exp.default(x), aten.sin.default(y)))


@register(aten.rsqrt.default)
def rsqrt(ctx: RuleContext, self: Any) -> Any:
    """``1 / sqrt(z)``: the stable square root, then the scaled division."""
    sr, si = _sqrt_parts(_re(self), _im(self))
    re, im = _div_parts(aten.ones_like.default(sr), aten.zeros_like.default(si), sr, si)
    return _pack(re, im)


@register(aten.sgn.default)
def sgn(ctx: RuleContext, self: Any) -> Any:
    """``z / |z|``, and 0 for ``z = 0`` (torch's ``sgn``)."""
    x, y = _re(self), _im(self)
    mag = _magnitude(x, y)
    zero = aten.eq.Scalar(mag, 0.0)
    return _pack(
        aten.where.ScalarSelf(zero, 0.0, aten.div.Tensor(x, mag)),
        aten.where.ScalarSelf(zero, 0.0, aten.div.Tensor(y, mag)),
    )


@register(aten.repeat.default)
def repeat(ctx: RuleContext, self: Any, repeats: Any) -> Any:
    """Repeat the complex dims; the trailing (real, imag) pair is repeated once."""
    return aten.repeat.default(self, [*repeats, 1])


# ----------------------------------------------------------------------------- einsum
@register(aten.einsum.default)
def einsum(ctx: RuleContext, equation: str, tensors: Any, path: Any = None) -> Any:
    """A complex einsum is a sum of real einsums over every choice of (real, imag) part per
    complex operand: a product with ``k`` imaginary factors carries ``i^k``, so even ``k``
    goes to the real part with sign ``(-1)^(k/2)`` and odd ``k`` to the imaginary part with
    sign ``(-1)^((k-1)/2)``. ``k`` complex operands cost ``2^k`` real einsums."""
    parts: list[tuple[Any, ...]] = []
    for v, x in zip(ctx.vals["tensors"], tensors):
        if v.is_complex():
            x = _cast(x, real_dtype(v.dtype), ctx.dtype)
            parts.append((_re(x), _im(x)))
        else:
            parts.append((_cast(x, v.dtype, ctx.dtype),))
    re: Any = None
    im: Any = None
    for choice in itertools.product(*(range(len(p)) for p in parts)):
        term = aten.einsum.default(equation, [p[c] for p, c in zip(parts, choice)])
        k = sum(choice)
        if k % 2 == 0:
            re = _signed_sum(re, term, (k // 2) % 2 == 1)
        else:
            im = _signed_sum(im, term, ((k - 1) // 2) % 2 == 1)
    return _pack(re, aten.zeros_like.default(re) if im is None else im)


def _signed_sum(acc: Any, term: Any, negative: bool) -> Any:
    if acc is None:
        return aten.neg.default(term) if negative else term
    return aten.sub.Tensor(acc, term) if negative else aten.add.Tensor(acc, term)


# ------------------------------------------------------------------------------- FFTs
# Choice: every FFT becomes matrix products with real DFT matrices (cos and sin of
# 2*pi*j*k/n), built in the graph from the transform length. Why not the engine's DFT op:
# TensorRT has no DFT layer, and ONNX's DFT is one engine's op, so the lowered graph would
# stop being engine-neutral; matmuls run in every engine (TensorRT, ONNX Runtime, inductor,
# eager), and for the lengths of these models (an FNet hidden size, an ISTFT n_fft of a few
# hundred) O(n^2) is small. The matrices are built from ``arange`` of the length (a SymInt
# where the dim is dynamic) and ``(j*k) mod n`` is taken in int64 before the angle is formed,
# so the angles stay exact for every length and no concrete size is baked in.

_FFT_NORMS = {None: "backward", "backward": "backward", "forward": "forward", "ortho": "ortho"}


def _static_int(v: Any) -> int | None:
    if isinstance(v, int):
        return v
    if isinstance(v, torch.SymInt) and v.node.is_constant():
        return int(v)
    return None


@dataclass(frozen=True)
class _Length:
    """A transform length twice: ``val`` for reasoning (int or SymInt) and ``graph`` for the
    ops being built (an int, or a size read from a tensor of the graph)."""

    val: Any
    graph: Any


def _dim_length(x: Any, dim: int, val: Any) -> _Length:
    static = _static_int(val)
    return _Length(val, static if static is not None else aten.sym_size.int(x, dim))


def _arg_length(val: Any, arg: Any) -> _Length:
    static = _static_int(val)
    return _Length(val, static if static is not None else arg)


def _size_tensor(n: Any, dtype: torch.dtype) -> Any:
    """A symbolic size as a 0-d tensor: ONNX's translations of ``remainder``/``div``/``eq``
    with a Scalar argument take Python numbers only, not a size read from the graph."""
    return aten.scalar_tensor.default(n, dtype=dtype)


def _divide(x: Any, n: Any, numerator: float = 1.0) -> Any:
    if isinstance(n, int):
        return aten.mul.Tensor(x, numerator / n)
    return aten.div.Tensor(aten.mul.Tensor(x, numerator), _size_tensor(n, torch.float64))


def _scale(x: Any, n: _Length, how: str) -> Any:
    """``how``: "none", "sqrt" (1/sqrt(n)) or "n" (1/n)."""
    if how == "none" or x is None:
        return x
    if how == "n":
        return _divide(x, n.graph)
    if isinstance(n.graph, int):
        return aten.mul.Tensor(x, 1.0 / math.sqrt(n.graph))
    return aten.mul.Tensor(x, aten.rsqrt.default(_size_tensor(n.graph, torch.float64)))


def _norm_scaling(norm: Any, inverse: bool) -> str:
    mode = _FFT_NORMS.get(norm)
    if mode is None:
        raise ValueError(f"unknown FFT norm {norm!r}; valid: 'backward', 'forward', 'ortho'")
    if mode == "ortho":
        return "sqrt"
    return "n" if (mode == "backward") == inverse else "none"


def _twiddles(ctx: RuleContext, rows: Any, cols: Any, n: Any) -> tuple[Any, Any]:
    """``cos`` and ``sin`` of ``2 pi ((j k) mod n) / n`` for ``j < rows``, ``k < cols``."""
    j = aten.unsqueeze.default(aten.arange.default(rows, dtype=torch.int64, device=ctx.device), -1)
    k = aten.unsqueeze.default(aten.arange.default(cols, dtype=torch.int64, device=ctx.device), 0)
    jk = aten.mul.Tensor(j, k)
    phase = aten.remainder.Scalar(jk, n) if isinstance(n, int) else aten.remainder.Tensor(jk, _size_tensor(n, torch.int64))
    angle = _divide(aten._to_copy.default(phase, dtype=ctx.dtype), n, 2.0 * math.pi)
    return aten.cos.default(angle), aten.sin.default(angle)


def _contract(x: Any, dim: int, rank: int, matrix: Any) -> Any:
    """``x`` with its dim ``dim`` (of ``rank`` dims) multiplied into ``matrix[n, m]``."""
    if x is None:
        return None
    last = rank - 1
    if dim != last:
        x = aten.transpose.int(x, dim, last)
    y = aten.matmul.default(x, matrix)
    return y if dim == last else aten.transpose.int(y, dim, last)


def _resize(x: Any, dim: int, rank: int, have: _Length, want: _Length, what: str) -> Any:
    """Trim or zero-pad ``x`` along ``dim`` from ``have`` to ``want`` elements, as the FFTs do
    with their ``n``/``s`` argument."""
    if x is None or statically_known_true(want.val == have.val):
        return x
    if statically_known_true(want.val < have.val):
        return aten.slice.Tensor(x, dim, 0, want.graph)
    if statically_known_true(want.val > have.val):
        pad = [0, 0] * (rank - 1 - dim) + [0, want.graph - have.graph]
        return aten.constant_pad_nd.default(x, pad, 0.0)
    raise ValueError(
        f"{what}: cannot tell whether the transform length {want.val} trims or pads a dim of "
        f"size {have.val}; lowering it would bake in one of the two"
    )


def _c2c_1d(ctx: RuleContext, re: Any, im: Any, dim: int, rank: int, n: _Length, inverse: bool, how: str) -> tuple[Any, Any]:
    cos, sin = _twiddles(ctx, n.graph, n.graph, n.graph)
    rc, rs = _contract(re, dim, rank, cos), _contract(re, dim, rank, sin)
    if im is None:
        out_re, out_im = rc, (rs if inverse else aten.neg.default(rs))
    else:
        ic, is_ = _contract(im, dim, rank, cos), _contract(im, dim, rank, sin)
        if inverse:  # e^{+i theta}
            out_re, out_im = aten.sub.Tensor(rc, is_), aten.add.Tensor(ic, rs)
        else:  # e^{-i theta}
            out_re, out_im = aten.add.Tensor(rc, is_), aten.sub.Tensor(ic, rs)
    return _scale(out_re, n, how), _scale(out_im, n, how)


def _r2c_1d(ctx: RuleContext, re: Any, dim: int, rank: int, n: _Length, bins: Any, how: str) -> tuple[Any, Any]:
    cos, sin = _twiddles(ctx, n.graph, bins, n.graph)
    return _scale(_contract(re, dim, rank, cos), n, how), _scale(aten.neg.default(_contract(re, dim, rank, sin)), n, how)


def _c2r_1d(ctx: RuleContext, re: Any, im: Any, dim: int, rank: int, bins: Any, n: _Length, how: str) -> Any:
    """Real inverse of a one-sided spectrum: bin ``k`` counts twice (itself and its mirror
    ``n - k``) except bin 0 and, for even ``n``, bin ``n/2``; their imaginary parts drop out
    (``sin`` is 0 there), as in pocketfft."""
    cos, sin = _twiddles(ctx, bins, n.graph, n.graph)
    k = aten.arange.default(bins, dtype=torch.int64, device=ctx.device)
    twice = aten.mul.Tensor(k, 2)
    nyquist = aten.eq.Scalar(twice, n.graph) if isinstance(n.graph, int) else aten.eq.Tensor(twice, _size_tensor(n.graph, torch.int64))
    single = aten.logical_or.default(aten.eq.Scalar(k, 0), nyquist)
    weight = aten.unsqueeze.default(aten.where.Scalar(single, 1.0, 2.0), -1)
    weight = aten._to_copy.default(weight, dtype=ctx.dtype)
    cos, sin = aten.mul.Tensor(cos, weight), aten.mul.Tensor(sin, weight)
    out = _contract(re, dim, rank, cos)
    if im is not None:
        out = aten.sub.Tensor(out, _contract(im, dim, rank, sin))
    return _scale(out, n, how)


def _fft_input(ctx: RuleContext, self: Any) -> tuple[Any, Any, Any]:
    """(real part, imaginary part or None, original meta value) of an FFT's input."""
    v = ctx.vals["self"]
    if v.is_complex():
        x = _cast(self, real_dtype(v.dtype), ctx.dtype)
        return _re(x), _im(x), v
    return _cast(self, v.dtype, ctx.dtype), None, v


def _fft_dims(v: torch.Tensor, s: Any, dim: Any, default_all: bool) -> list[int]:
    if dim is None:
        dims = list(range(v.dim())) if s is None else list(range(v.dim() - len(s), v.dim()))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % v.dim() for d in dims]


def _lengths(ctx: RuleContext, x: Any, v: torch.Tensor, dims: list[int], s: Any, s_vals: Any) -> list[tuple[_Length, _Length]]:
    """Per transformed dim: (size it has, length wanted)."""
    out = []
    for i, d in enumerate(dims):
        have = _dim_length(x, d, v.shape[d])
        want = have if s is None or _static_int(s_vals[i]) == -1 else _arg_length(s_vals[i], s[i])
        out.append((have, want))
    return out


def _fft_c2c_nd(ctx: RuleContext, self: Any, s: Any, dims: list[int], inverse: bool, how: Callable[[], str]) -> Any:
    re, im, v = _fft_input(ctx, self)
    rank = v.dim()
    s_vals = ctx.vals.get("s") if "s" in ctx.vals else ctx.vals.get("n")
    for d, (have, want) in zip(dims, _lengths(ctx, re, v, dims, s, _as_list(s_vals))):
        re = _resize(re, d, rank, have, want, str(ctx.node.target))
        im = _resize(im, d, rank, have, want, str(ctx.node.target))
        re, im = _c2c_1d(ctx, re, im, d, rank, want, inverse, how())
    return _pack(re, im)


def _as_list(v: Any) -> Any:
    if v is None or isinstance(v, (list, tuple)):
        return v
    return [v]


@register(aten.fft_fft.default, aten.fft_ifft.default)
def fft_fft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    inverse = ctx.node.target is aten.fft_ifft.default
    v = ctx.vals["self"]
    return _fft_c2c_nd(ctx, self, _as_list(n), [dim % v.dim()], inverse, lambda: _norm_scaling(norm, inverse))


@register(aten.fft_fft2.default, aten.fft_ifft2.default, aten.fft_fftn.default, aten.fft_ifftn.default)
def fft_fftn(ctx: RuleContext, self: Any, s: Any = None, dim: Any = None, norm: Any = None) -> Any:
    inverse = ctx.node.target in (aten.fft_ifft2.default, aten.fft_ifftn.default)
    dims = _fft_dims(ctx.vals["self"], s, dim, True)
    return _fft_c2c_nd(ctx, self, s, dims, inverse, lambda: _norm_scaling(norm, inverse))


@register(aten._fft_c2c.default)
def fft_c2c(ctx: RuleContext, self: Any, dim: Any, normalization: int, forward: bool) -> Any:
    how = {0: "none", 1: "sqrt", 2: "n"}[normalization]
    return _fft_c2c_nd(ctx, self, None, [d % ctx.rank() for d in dim], not forward, lambda: how)


def _rfft_nd(ctx: RuleContext, self: Any, s: Any, s_vals: Any, dims: list[int], how: Callable[[], str]) -> Any:
    """Real-to-complex: the last listed dim one-sided, the others full complex DFTs."""
    re, _, v = _fft_input(ctx, self)
    rank = v.dim()
    lengths = _lengths(ctx, re, v, dims, s, _as_list(s_vals))
    *rest, last = dims
    have, want = lengths[-1]
    re = _resize(re, last, rank, have, want, str(ctx.node.target))
    bins = want.graph // 2 + 1
    re, im = _r2c_1d(ctx, re, last, rank, want, bins, how())
    for d, (have, want) in zip(rest, lengths[:-1]):
        re = _resize(re, d, rank, have, want, str(ctx.node.target))
        im = _resize(im, d, rank, have, want, str(ctx.node.target))
        re, im = _c2c_1d(ctx, re, im, d, rank, want, False, how())
    return _pack(re, im)


@register(aten.fft_rfft.default)
def fft_rfft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    v = ctx.vals["self"]
    return _rfft_nd(ctx, self, _as_list(n), ctx.vals.get("n"), [dim % v.dim()], lambda: _norm_scaling(norm, False))


@register(aten.fft_rfft2.default, aten.fft_rfftn.default)
def fft_rfftn(ctx: RuleContext, self: Any, s: Any = None, dim: Any = None, norm: Any = None) -> Any:
    dims = _fft_dims(ctx.vals["self"], s, dim, True)
    return _rfft_nd(ctx, self, s, ctx.vals.get("s"), dims, lambda: _norm_scaling(norm, False))


@register(aten._fft_r2c.default)
def fft_r2c(ctx: RuleContext, self: Any, dim: Any, normalization: int, onesided: bool) -> Any:
    how = {0: "none", 1: "sqrt", 2: "n"}[normalization]
    dims = [d % ctx.rank() for d in dim]
    if not onesided:  # a two-sided real transform is the complex one of a real input
        return _fft_c2c_nd(ctx, self, None, dims, False, lambda: how)
    return _rfft_nd(ctx, self, None, None, dims, lambda: how)


def _irfft_nd(ctx: RuleContext, self: Any, s: Any, s_vals: Any, dims: list[int], how: Callable[[], str], last_size: Any = None, last_val: Any = None) -> Any:
    """Complex-to-real: full inverse DFTs over all but the last listed dim, then the
    one-sided real inverse over the last. The output length of the last dim is ``s[-1]``
    (or ``last_size``), by default ``2 (m - 1)`` for ``m`` input bins."""
    re, im, v = _fft_input(ctx, self)
    rank = v.dim()
    *rest, last = dims
    s_list, s_val_list = _as_list(s), _as_list(s_vals)
    for i, d in enumerate(rest):
        have = _dim_length(re, d, v.shape[d])
        want = have if s_list is None else _arg_length(s_val_list[i], s_list[i])
        re = _resize(re, d, rank, have, want, str(ctx.node.target))
        im = _resize(im, d, rank, have, want, str(ctx.node.target))
        re, im = _c2c_1d(ctx, re, im, d, rank, want, True, how())
    have = _dim_length(re, last, v.shape[last])
    if last_size is not None:
        n = _arg_length(last_val, last_size)
    elif s_list is not None and _static_int(s_val_list[-1]) != -1:
        n = _arg_length(s_val_list[-1], s_list[-1])
    else:
        n = _Length(2 * (have.val - 1), 2 * (have.graph - 1))
    bins = _Length(n.val // 2 + 1, n.graph // 2 + 1)
    re = _resize(re, last, rank, have, bins, str(ctx.node.target))
    im = _resize(im, last, rank, have, bins, str(ctx.node.target))
    return _c2r_1d(ctx, re, im, last, rank, bins.graph, n, how())


@register(aten.fft_irfft.default)
def fft_irfft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    v = ctx.vals["self"]
    return _irfft_nd(ctx, self, _as_list(n), ctx.vals.get("n"), [dim % v.dim()], lambda: _norm_scaling(norm, True))


@register(aten.fft_irfft2.default, aten.fft_irfftn.default)
def fft_irfftn(ctx: RuleContext, self: Any, s: Any = None, dim: Any = None, norm: Any = None) -> Any:
    dims = _fft_dims(ctx.vals["self"], s, dim, True)
    return _irfft_nd(ctx, self, s, ctx.vals.get("s"), dims, lambda: _norm_scaling(norm, True))


@register(aten._fft_c2r.default)
def fft_c2r(ctx: RuleContext, self: Any, dim: Any, normalization: int, last_dim_size: Any) -> Any:
    how = {0: "none", 1: "sqrt", 2: "n"}[normalization]
    dims = [d % ctx.rank() for d in dim]
    return _irfft_nd(ctx, self, None, None, dims, lambda: how, last_dim_size, ctx.vals["last_dim_size"])


@register(aten.fft_hfft.default)
def fft_hfft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    """``hfft(x) = irfft(conj(x))`` with the forward/backward scalings swapped."""
    swapped = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}[norm]
    v = ctx.vals["self"]
    conj_self = _pack(_re(self), aten.neg.default(_im(self))) if v.is_complex() else self
    return _irfft_nd(ctx, conj_self, _as_list(n), ctx.vals.get("n"), [dim % v.dim()], lambda: _norm_scaling(swapped, True))


@register(aten.fft_ihfft.default)
def fft_ihfft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    """``ihfft(x) = conj(rfft(x))`` with the forward/backward scalings swapped."""
    swapped = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}[norm]
    v = ctx.vals["self"]
    packed = _rfft_nd(ctx, self, _as_list(n), ctx.vals.get("n"), [dim % v.dim()], lambda: _norm_scaling(swapped, False))
    return _pack(_re(packed), aten.neg.default(_im(packed)))
