"""Rules for elementwise complex ops: arithmetic, parts, exp/log/pow, trig and ``where``.

Arithmetic promotes a real operand to complex as TensorIterator does and multiplies in
full (so infinities give eager's NaNs), divides by torch's scaled algorithm, and takes
``exp``, ``log`` and ``sqrt`` with the C99 special values of
:mod:`~tetrt_support.complex.rules.special_values` at inf and NaN.
"""

from __future__ import annotations

import cmath
from typing import Any

import torch

from tetrt_support.complex.rules.packed import (
    _abs2,
    _add,
    _complex_mul,
    _im,
    _is_tensor,
    _join,
    _pack,
    _packed,
    _parts,
    _polar,
    _promoted,
    _re,
)
from tetrt_support.complex.rules.registry import Family, RuleContext
from tetrt_support.complex.rules.special_values import (
    exp_special,
    exp_special_inputs,
    overlay,
    sqrt_special,
)
from tetrt_support.complex.rules.stable import _div_parts, _log_parts, _scaled_hypot, _sqrt_parts

aten = torch.ops.aten

ELEMENTWISE = Family("elementwise")


def _exp_packed(x: Any) -> Any:
    # exp(x + 0i) is exp(x) + 0i even where exp(x) overflows (inf * sin(0) would be NaN)
    re, ang = _re(x), _im(x)
    mag = aten.exp.default(re)
    im = aten.where.self(aten.eq.Scalar(ang, 0.0), ang, aten.mul.Tensor(mag, aten.sin.default(ang)))
    finite = (aten.mul.Tensor(mag, aten.cos.default(ang)), im)
    special = exp_special(re, ang)
    return _pack(*overlay(finite, special, re, ang, special_at=exp_special_inputs(re, ang)))


def _log_packed(x: Any) -> Any:
    return _pack(*_log_parts(_re(x), _im(x)))


def _mul_packed(a: Any, b: Any) -> Any:
    re, im = _complex_mul(_re(a), _im(a), _re(b), _im(b))
    return _pack(re, im)


def _div_packed(a: Any, b: Any) -> Any:
    """Complex division by torch's scaled algorithm (:func:`_div_parts`): the textbook
    ``(ac + bd) / (c^2 + d^2)`` overflows once ``|b|`` passes ``sqrt(max float)``."""
    return _pack(*_div_parts(_re(a), _im(a), _re(b), _im(b)))


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


@ELEMENTWISE.rule(aten.add.Tensor, aten.add.Scalar)
def add(ctx: RuleContext, self: Any, other: Any, alpha: Any = 1) -> Any:
    return _add_like(ctx, self, other, alpha, 1.0)


@ELEMENTWISE.rule(aten.sub.Tensor, aten.sub.Scalar)
def sub(ctx: RuleContext, self: Any, other: Any, alpha: Any = 1) -> Any:
    return _add_like(ctx, self, other, alpha, -1.0)


@ELEMENTWISE.rule(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(ctx: RuleContext, self: Any, other: Any, alpha: Any = 1) -> Any:
    swapped = RuleContext(ctx.node, {"self": ctx.vals["other"], "other": ctx.vals["self"]}, ctx.out)
    return _add_like(swapped, other, self, alpha, -1.0)


@ELEMENTWISE.rule(aten.mul.Tensor, aten.mul.Scalar)
def mul(ctx: RuleContext, self: Any, other: Any) -> Any:
    # torch promotes a real operand to complex (value + 0i) and multiplies in full, so
    # (inf + 1i) * 2 is (inf, nan), not (inf, 2): no shortcut for a real side
    re, im = _complex_mul(*_promoted(ctx, "self", self), *_promoted(ctx, "other", other))
    return _join(ctx, re, im, re if _is_tensor(re) else im)


@ELEMENTWISE.rule(aten.div.Tensor, aten.div.Scalar)
def div(ctx: RuleContext, self: Any, other: Any) -> Any:
    # the same promotion, then torch's scaled complex division (also for a complex scalar)
    return _div_packed(_packed(ctx, "self", self), _packed(ctx, "other", other))


@ELEMENTWISE.rule(aten.neg.default)
def neg(ctx: RuleContext, self: Any) -> Any:
    return aten.neg.default(self)


@ELEMENTWISE.rule(aten._conj.default, aten.conj_physical.default, aten.conj.default)
def conj(ctx: RuleContext, self: Any) -> Any:
    return _pack(_re(self), aten.neg.default(_im(self)))


@ELEMENTWISE.rule(
    aten.resolve_conj.default, aten.resolve_neg.default, aten.alias.default, aten.detach.default
)
def identity_view(ctx: RuleContext, self: Any) -> Any:
    return aten.alias.default(self)


@ELEMENTWISE.rule(aten.clone.default)
def clone(ctx: RuleContext, self: Any, memory_format: Any = None) -> Any:
    return aten.clone.default(self)  # a memory format of the unpacked rank means nothing packed


@ELEMENTWISE.rule(aten.contiguous.default)
def contiguous(ctx: RuleContext, self: Any, memory_format: Any = None) -> Any:
    return aten.contiguous.default(self)


@ELEMENTWISE.rule(aten.lift_fresh_copy.default)
def lift_fresh_copy(ctx: RuleContext, self: Any) -> Any:
    return aten.clone.default(self)


@ELEMENTWISE.rule(aten.reciprocal.default)
def reciprocal(ctx: RuleContext, self: Any) -> Any:
    """``1 / z`` by the scaled division (torch's complex ``reciprocal`` is ``1 / z``)."""
    re, im = _re(self), _im(self)
    return _pack(*_div_parts(aten.ones_like.default(re), aten.zeros_like.default(im), re, im))


@ELEMENTWISE.rule(aten.abs.default)
def abs_(ctx: RuleContext, self: Any) -> Any:
    return _scaled_hypot(_re(self), _im(self))  # a scaled hypot, as std::abs: no overflow


@ELEMENTWISE.rule(aten.angle.default)
def angle(ctx: RuleContext, self: Any) -> Any:
    return aten.atan2.default(_im(self), _re(self))


@ELEMENTWISE.rule(aten.real.default)
def real(ctx: RuleContext, self: Any) -> Any:
    return _re(self)


@ELEMENTWISE.rule(aten.imag.default)
def imag(ctx: RuleContext, self: Any) -> Any:
    return _im(self)


@ELEMENTWISE.rule(aten.view_as_real.default)
def view_as_real(ctx: RuleContext, self: Any) -> Any:
    return self  # a packed value already IS its view_as_real


@ELEMENTWISE.rule(aten.view_as_complex.default)
def view_as_complex(ctx: RuleContext, self: Any) -> Any:
    return self  # a real [..., 2] tensor already IS the packed complex


@ELEMENTWISE.rule(aten.polar.default)
def polar(ctx: RuleContext, abs: Any, angle: Any) -> Any:
    return _polar(abs, angle)


@ELEMENTWISE.rule(aten.complex.default)
def complex_(ctx: RuleContext, real: Any, imag: Any) -> Any:
    both = aten.broadcast_tensors.default([real, imag])
    return _pack(both[0], both[1])


@ELEMENTWISE.rule(aten.exp.default)
def exp(ctx: RuleContext, self: Any) -> Any:
    return _exp_packed(self)


@ELEMENTWISE.rule(aten.log.default)
def log(ctx: RuleContext, self: Any) -> Any:
    return _log_packed(self)


@ELEMENTWISE.rule(aten.sqrt.default)
def sqrt(ctx: RuleContext, self: Any) -> Any:
    x, y = _re(self), _im(self)
    return _pack(*overlay(_sqrt_parts(x, y), sqrt_special(x, y), x, y))


@ELEMENTWISE.rule(aten.pow.Tensor_Scalar)
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


@ELEMENTWISE.rule(aten.pow.Tensor_Tensor)
def pow_tensor_tensor(ctx: RuleContext, self: Any, exponent: Any) -> Any:
    base = _packed(ctx, "self", self)
    return _exp_packed(_mul_packed(_log_packed(base), _packed(ctx, "exponent", exponent)))


@ELEMENTWISE.rule(aten.pow.Scalar)
def pow_scalar(ctx: RuleContext, self: Any, exponent: Any) -> Any:
    lw = cmath.log(complex(self))  # the base is a Python number
    e = _packed(ctx, "exponent", exponent)
    re, im = _complex_mul(_re(e), _im(e), lw.real, lw.imag)
    return _exp_packed(_pack(re, im))


@ELEMENTWISE.rule(aten.sin.default)
def sin(ctx: RuleContext, self: Any) -> Any:
    a, b = _re(self), _im(self)
    return _pack(
        aten.mul.Tensor(aten.sin.default(a), aten.cosh.default(b)),
        aten.mul.Tensor(aten.cos.default(a), aten.sinh.default(b)),
    )


@ELEMENTWISE.rule(aten.cos.default)
def cos(ctx: RuleContext, self: Any) -> Any:
    a, b = _re(self), _im(self)
    return _pack(
        aten.mul.Tensor(aten.cos.default(a), aten.cosh.default(b)),
        aten.neg.default(aten.mul.Tensor(aten.sin.default(a), aten.sinh.default(b))),
    )


@ELEMENTWISE.rule(aten.sinh.default)
def sinh(ctx: RuleContext, self: Any) -> Any:
    a, b = _re(self), _im(self)
    return _pack(
        aten.mul.Tensor(aten.sinh.default(a), aten.cos.default(b)),
        aten.mul.Tensor(aten.cosh.default(a), aten.sin.default(b)),
    )


@ELEMENTWISE.rule(aten.cosh.default)
def cosh(ctx: RuleContext, self: Any) -> Any:
    a, b = _re(self), _im(self)
    return _pack(
        aten.mul.Tensor(aten.cosh.default(a), aten.cos.default(b)),
        aten.mul.Tensor(aten.sinh.default(a), aten.sin.default(b)),
    )


@ELEMENTWISE.rule(aten.tan.default)
def tan(ctx: RuleContext, self: Any) -> Any:
    # tan(a+bi) = (sin 2a + i sinh 2b) / (cos 2a + cosh 2b)
    a2, b2 = aten.mul.Tensor(_re(self), 2.0), aten.mul.Tensor(_im(self), 2.0)
    den = aten.add.Tensor(aten.cos.default(a2), aten.cosh.default(b2))
    return _pack(
        aten.div.Tensor(aten.sin.default(a2), den), aten.div.Tensor(aten.sinh.default(b2), den)
    )


@ELEMENTWISE.rule(aten.tanh.default)
def tanh(ctx: RuleContext, self: Any) -> Any:
    # tanh(a+bi) = (sinh 2a + i sin 2b) / (cosh 2a + cos 2b)
    a2, b2 = aten.mul.Tensor(_re(self), 2.0), aten.mul.Tensor(_im(self), 2.0)
    den = aten.add.Tensor(aten.cosh.default(a2), aten.cos.default(b2))
    return _pack(
        aten.div.Tensor(aten.sinh.default(a2), den), aten.div.Tensor(aten.sin.default(b2), den)
    )


@ELEMENTWISE.rule(aten.isnan.default)
def isnan(ctx: RuleContext, self: Any) -> Any:
    return aten.logical_or.default(aten.isnan.default(_re(self)), aten.isnan.default(_im(self)))


@ELEMENTWISE.rule(aten.isinf.default)
def isinf(ctx: RuleContext, self: Any) -> Any:
    return aten.logical_or.default(aten.isinf.default(_re(self)), aten.isinf.default(_im(self)))


@ELEMENTWISE.rule(aten.isfinite.default)
def isfinite(ctx: RuleContext, self: Any) -> Any:
    return aten.logical_and.default(
        aten.isfinite.default(_re(self)), aten.isfinite.default(_im(self))
    )


def _where(cond: Any, a: Any, b: Any) -> Any:
    if _is_tensor(a):
        return aten.where.self(cond, a, b) if _is_tensor(b) else aten.where.ScalarOther(cond, a, b)
    return aten.where.ScalarSelf(cond, a, b) if _is_tensor(b) else aten.where.Scalar(cond, a, b)


@ELEMENTWISE.rule(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def where(ctx: RuleContext, condition: Any, self: Any, other: Any) -> Any:
    # part by part, so that scalar branches stay scalars (no constant tensors)
    ar, ai = _parts(ctx, "self", self)
    br, bi = _parts(ctx, "other", other)
    zero = lambda re: aten.zeros_like.default(re) if _is_tensor(re) else 0.0  # noqa: E731
    ai = zero(ar) if ai is None else ai
    bi = zero(br) if bi is None else bi
    re, im = _where(condition, ar, br), _where(condition, ai, bi)
    return _pack(re, im)
