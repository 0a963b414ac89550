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
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from tetrt_support.complex.detect import is_complex_value

__all__ = ["RULES", "Rule", "RuleContext", "bind_arguments", "real_dtype", "rule_for"]

aten = torch.ops.aten

Rule = Callable[..., Any]
RULES: dict[Any, Rule] = {}


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


def register(*ops: Any) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn

    return deco


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


def _is_real_operand(ctx: RuleContext, name: str) -> bool:
    return not ctx.is_complex(name) and not isinstance(ctx.vals[name], complex)


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
    return _polar(aten.exp.default(_re(x)), _im(x))


def _log_packed(x: Any) -> Any:
    return _pack(aten.log.default(aten.sqrt.default(_abs2(x))), aten.atan2.default(_im(x), _re(x)))


def _mul_packed(a: Any, b: Any) -> Any:
    re, im = _complex_mul(_re(a), _im(a), _re(b), _im(b))
    return _pack(re, im)


def _div_packed(a: Any, b: Any) -> Any:
    ar, ai, br, bi = _re(a), _im(a), _re(b), _im(b)
    den = aten.add.Tensor(aten.mul.Tensor(br, br), aten.mul.Tensor(bi, bi))
    re = aten.add.Tensor(aten.mul.Tensor(ar, br), aten.mul.Tensor(ai, bi))
    im = aten.sub.Tensor(aten.mul.Tensor(ai, br), aten.mul.Tensor(ar, bi))
    return _pack(aten.div.Tensor(re, den), aten.div.Tensor(im, den))


# ------------------------------------------------------------------ elementwise arithmetic
def _scaled(ctx: RuleContext, name: str, x: Any, alpha: Any) -> tuple[Any, Any]:
    re, im = _parts(ctx, name, x)
    if alpha == 1:
        return re, im
    a = complex(alpha)
    if a.imag == 0:
        return _mul(re, a.real), _mul(im, a.real)
    return _complex_mul(re, im, a.real, a.imag)


def _add_like(ctx: RuleContext, self: Any, other: Any, alpha: Any, sign: float) -> Any:
    ar, ai = _parts(ctx, "self", self)
    br, bi = _scaled(ctx, "other", other, alpha * sign if isinstance(alpha, (int, float)) else alpha)
    if sign < 0 and not isinstance(alpha, (int, float)):
        br, bi = _mul(br, -1.0), _mul(bi, -1.0)
    re = _add(ar, br)
    if ai is None and _is_tensor(ar) and bi is not None:
        ai = aten.zeros_like.default(ar)  # a real tensor operand broadcasts the imaginary part
    if bi is None and _is_tensor(br) and ai is not None:
        bi = aten.zeros_like.default(br)
    im = _add(ai, bi)
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
    for c, r in (("self", "other"), ("other", "self")):
        if ctx.is_complex(c) and _is_real_operand(ctx, r):
            # complex times real: scale both components, no promotion of the real side
            packed = _packed(ctx, c, self if c == "self" else other)
            real = other if c == "self" else self
            v = ctx.vals[r]
            if isinstance(v, torch.Tensor):
                real = aten.unsqueeze.default(_cast(real, v.dtype, ctx.dtype), -1)
            return aten.mul.Tensor(packed, real)
    ar, ai = _parts(ctx, "self", self)
    br, bi = _parts(ctx, "other", other)
    re, im = _complex_mul(ar, ai, br, bi)
    return _join(ctx, re, im, re if _is_tensor(re) else im)


@register(aten.div.Tensor, aten.div.Scalar)
def div(ctx: RuleContext, self: Any, other: Any) -> Any:
    v = ctx.vals["other"]
    if _is_real_operand(ctx, "other"):
        packed = _packed(ctx, "self", self)
        if isinstance(v, torch.Tensor):
            other = aten.unsqueeze.default(_cast(other, v.dtype, ctx.dtype), -1)
        return aten.div.Tensor(packed, other)
    if isinstance(v, complex):  # divide by a Python complex scalar: multiply by 1/c
        inv = 1.0 / other
        ar, ai = _parts(ctx, "self", self)
        re, im = _complex_mul(ar, ai, inv.real, inv.imag)
        return _join(ctx, re, im, re if _is_tensor(re) else im)
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
    den = _abs2(self)
    return _pack(aten.div.Tensor(_re(self), den), aten.neg.default(aten.div.Tensor(_im(self), den)))


@register(aten.abs.default)
def abs_(ctx: RuleContext, self: Any) -> Any:
    return aten.sqrt.default(_abs2(self))


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
    mag = aten.sqrt.default(aten.sqrt.default(_abs2(self)))
    return _polar(mag, aten.mul.Tensor(aten.atan2.default(_im(self), _re(self)), 0.5))


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


RULES[aten.mm.default] = _matmul(aten.mm.default)
RULES[aten.bmm.default] = _matmul(aten.bmm.default)
RULES[aten.matmul.default] = _matmul(aten.matmul.default)
