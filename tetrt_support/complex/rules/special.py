"""Rules for the inverse and other special functions: asin ... atan, log1p, expm1, rsqrt, sgn.

Kahan's formulas (no ``z^2`` to overflow, the C99 branch cuts) give the finite values;
at infinities and NaN the C99 Annex G tables of
:mod:`~tetrt_support.complex.rules.special_values` take over (:func:`_with_table`), as
eager's C library does.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from tetrt_support.complex.rules.packed import _complex_mul, _im, _pack, _re
from tetrt_support.complex.rules.registry import Family, Rule, RuleContext
from tetrt_support.complex.rules.special_values import (
    acos_special,
    acosh_special,
    asin_special,
    asinh_special,
    atanh_special,
    overlay,
)
from tetrt_support.complex.rules.stable import _div_parts, _log_parts, _scaled_hypot, _sqrt_parts

aten = torch.ops.aten

SPECIAL = Family("special")

#: A function of (real, imaginary) parts returning (real, imaginary) parts.
PartsFn = Callable[[Any, Any], tuple[Any, Any]]


def _asinh_of_4(w: Any) -> Any:
    """``asinh(4 w)`` for a product ``w`` of halved square roots: its limit
    ``copysign(log(8 |w|), w)`` once ``4 w`` could overflow."""
    log_8w = aten.add.Tensor(aten.log.default(aten.abs.default(w)), math.log(8.0))
    limit = aten.copysign.Tensor(log_8w, w)
    large = aten.gt.Scalar(aten.abs.default(w), 1e15)
    return aten.where.self(large, limit, aten.asinh.default(aten.mul.Tensor(w, 4.0)))


def _half_roots(x: Any, y: Any, sign: float) -> tuple[Any, Any, Any, Any]:
    """``sqrt(1 - z) / 2`` (``sign = -1``; ``sqrt(z - 1) / 2`` for ``+1``) and ``sqrt(1 + z) / 2``:
    halved, so that their products (``|z|``-sized) stay finite up to the largest float."""
    if sign < 0:
        s1r, s1i = _sqrt_parts(aten.rsub.Scalar(x, 1.0), aten.neg.default(y))
    else:
        s1r, s1i = _sqrt_parts(aten.sub.Tensor(x, 1.0), y)
    s2r, s2i = _sqrt_parts(aten.add.Tensor(x, 1.0), y)
    halves = tuple(aten.mul.Tensor(v, 0.5) for v in (s1r, s1i, s2r, s2i))
    return halves  # type: ignore[return-value]


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
    near_zero = aten.log1p.default(aten.div.Tensor(aten.mul.Tensor(x, 4.0), den))
    near_zero = aten.mul.Tensor(near_zero, 0.25)
    # away from 0 (|x| >= 1/2) the log1p form cancels near z = +-1: log|1+z| - log|1-z| does not
    log_plus = _scaled_hypot(aten.add.Tensor(x, 1.0), y, log=True)
    far = aten.mul.Tensor(aten.sub.Tensor(log_plus, _scaled_hypot(one_minus, y, log=True)), 0.5)
    re = aten.where.self(aten.lt.Scalar(aten.abs.default(x), 0.5), near_zero, far)
    im_den = aten.sub.Tensor(
        aten.mul.Tensor(one_minus, aten.add.Tensor(x, 1.0)), aten.mul.Tensor(y, y)
    )
    im = aten.mul.Tensor(aten.atan2.default(aten.mul.Tensor(y, 2.0), im_den), 0.5)
    inv_re, _ = _div_parts(aten.ones_like.default(x), aten.zeros_like.default(y), x, y)
    large = aten.gt.Scalar(_scaled_hypot(x, y), _ATANH_LARGE)
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
    corrected_re, corrected_im = _complex_mul(log_re, log_im, ratio_re, ratio_im)
    u_is_one = aten.logical_and.default(aten.eq.Scalar(u_re, 1.0), aten.eq.Scalar(y, 0.0))
    # the imaginary parts of u - 1 and z are both y: equal unless y is NaN
    exact = aten.logical_and.default(aten.eq.Tensor(u_minus_1, x), aten.eq.Tensor(y, y))
    re = aten.where.self(u_is_one, x, aten.where.self(exact, log_re, corrected_re))
    im = aten.where.self(u_is_one, y, aten.where.self(exact, log_im, corrected_im))
    return re, im


def _unary(parts_fn: PartsFn) -> Rule:
    def rule(ctx: RuleContext, self: Any) -> Any:
        re, im = parts_fn(_re(self), _im(self))
        return _pack(re, im)

    rule.__doc__ = parts_fn.__doc__
    return rule


def _swap_i(parts_fn: PartsFn) -> PartsFn:
    """``f(z) = -i g(iz)``: ``asinh`` from ``asin`` and ``atan`` from ``atanh`` (C99's own
    definitions, which keep the branch cuts and the signs of zeros)."""

    def parts(x: Any, y: Any) -> tuple[Any, Any]:
        re, im = parts_fn(aten.neg.default(y), x)  # g(iz), iz = -y + ix
        return im, aten.neg.default(re)  # -i (re + i im) = im - i re

    return parts


def _with_table(finite_fn: PartsFn, special_fn: PartsFn) -> PartsFn:
    """``finite_fn`` (Kahan's formula) for finite inputs, ``special_fn`` (the C99 Annex G
    table eager's C library follows, :mod:`.special_values`) elsewhere."""

    def parts(x: Any, y: Any) -> tuple[Any, Any]:
        return overlay(finite_fn(x, y), special_fn(x, y), x, y)

    parts.__doc__ = finite_fn.__doc__
    return parts


_asin_with_table = _with_table(_asin_parts, asin_special)
_atanh_with_table = _with_table(_atanh_parts, atanh_special)
SPECIAL.add("asin", (aten.asin.default,), _unary(_asin_with_table))
SPECIAL.add("acos", (aten.acos.default,), _unary(_with_table(_acos_parts, acos_special)))
SPECIAL.add("acosh", (aten.acosh.default,), _unary(_with_table(_acosh_parts, acosh_special)))
SPECIAL.add("atanh", (aten.atanh.default,), _unary(_atanh_with_table))
SPECIAL.add(
    "asinh", (aten.asinh.default,), _unary(_with_table(_swap_i(_asin_parts), asinh_special))
)
SPECIAL.add("atan", (aten.atan.default,), _unary(_swap_i(_atanh_with_table)))
SPECIAL.add("log1p", (aten.log1p.default,), _unary(_log1p_parts))


@SPECIAL.rule(aten.log2.default, aten.log10.default)
def log_base(ctx: RuleContext, self: Any) -> Any:
    """``log(z) / log(base)``, the magnitude by a scaled hypot (no overflow for huge ``z``)."""
    re, im = _log_parts(_re(self), _im(self))
    inv = 1.0 / math.log(2.0 if ctx.node.target is aten.log2.default else 10.0)
    return _pack(aten.mul.Tensor(re, inv), aten.mul.Tensor(im, inv))


@SPECIAL.rule(aten.expm1.default)
def expm1(ctx: RuleContext, self: Any) -> Any:
    """c10's ``expm1``: ``expm1(x) cos(y) - 2 sin(y/2)^2 + i e^x sin(y)``, accurate near 0."""
    x, y = _re(self), _im(self)
    half = aten.sin.default(aten.mul.Tensor(y, 0.5))
    re = aten.sub.Tensor(
        aten.mul.Tensor(aten.expm1.default(x), aten.cos.default(y)),
        aten.mul.Tensor(aten.mul.Tensor(half, half), 2.0),
    )
    return _pack(re, aten.mul.Tensor(aten.exp.default(x), aten.sin.default(y)))


@SPECIAL.rule(aten.rsqrt.default)
def rsqrt(ctx: RuleContext, self: Any) -> Any:
    """``1 / sqrt(z)``: the stable square root, then the scaled division."""
    sr, si = _sqrt_parts(_re(self), _im(self))
    re, im = _div_parts(aten.ones_like.default(sr), aten.zeros_like.default(si), sr, si)
    return _pack(re, im)


@SPECIAL.rule(aten.sgn.default)
def sgn(ctx: RuleContext, self: Any) -> Any:
    """``z / |z|``, and 0 for ``z = 0`` (torch's ``sgn``)."""
    x, y = _re(self), _im(self)
    mag = _scaled_hypot(x, y)
    zero = aten.eq.Scalar(mag, 0.0)
    return _pack(
        aten.where.ScalarSelf(zero, 0.0, aten.div.Tensor(x, mag)),
        aten.where.ScalarSelf(zero, 0.0, aten.div.Tensor(y, mag)),
    )
