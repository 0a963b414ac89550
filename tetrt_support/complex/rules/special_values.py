"""What the complex elementary functions return at infinite and NaN inputs, as graph ops.

Eager PyTorch on CPU computes complex ``exp``, ``sqrt``, ``asin``, ``acos``, ``asinh``,
``acosh``, ``atanh`` and ``atan`` with the C library, which follows C99 Annex G's
special-value tables (glibc's, ``docs/architecture.md`` section 4). Each function here is one
table, written as ``where`` over ``isinf``/``isnan`` of the parts; a rule computes its finite
formula, then takes :func:`overlay`'s choice, so no branch depends on values. Every function
takes and returns (real, imaginary) parts.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = [
    "acos_special",
    "acosh_special",
    "asin_special",
    "asinh_special",
    "atanh_special",
    "exp_special",
    "exp_special_inputs",
    "overlay",
    "sqrt_special",
]

aten = torch.ops.aten
_INF, _NAN = float("inf"), float("nan")

Parts = tuple[Any, Any]


def _full(like: Any, value: float) -> Any:
    return aten.full_like.default(like, value)


def _signed(like: Any, value: float, sign: Any) -> Any:
    """``copysign(value, sign)``, shaped like ``like``."""
    return aten.copysign.Tensor(_full(like, value), sign)


def _or(a: Any, b: Any) -> Any:
    return aten.logical_or.default(a, b)


def _and(a: Any, b: Any) -> Any:
    return aten.logical_and.default(a, b)


def _not(a: Any) -> Any:
    return aten.logical_not.default(a)


def overlay(finite: Parts, special: Parts, x: Any, y: Any, special_at: Any = None) -> Parts:
    """``special`` where ``special_at`` holds (default: where a part of ``x + iy`` is infinite
    or NaN), ``finite`` elsewhere."""
    if special_at is None:
        special_at = _not(_and(aten.isfinite.default(x), aten.isfinite.default(y)))
    return aten.where.self(special_at, special[0], finite[0]), aten.where.self(special_at, special[1], finite[1])


def asinh_special(x: Any, y: Any) -> Parts:
    """``asinh``: ``inf j`` gives ``copysign(inf, x) + copysign(pi/2, y) j`` (``pi/4`` when ``x``
    is infinite too, NaN when it is NaN); an infinite or NaN ``x`` passes through with
    ``copysign(0, y) j`` for a non-NaN ``y`` after an infinite ``x`` or a zero ``y`` after a NaN
    one, NaN otherwise; a NaN ``y`` after a finite ``x`` gives NaN + NaN j."""
    nan_x, inf_x, inf_y = aten.isnan.default(x), aten.isinf.default(x), aten.isinf.default(y)
    y_inf_re = _signed(x, _INF, x)
    angle = aten.where.ScalarOther(inf_x, _full(y, math.pi / 4), math.pi / 2)
    y_inf_im = aten.where.ScalarSelf(nan_x, _NAN, aten.copysign.Tensor(angle, y))
    signed_zero = _or(_and(inf_x, _not(aten.isnan.default(y))), _and(nan_x, aten.eq.Scalar(y, 0.0)))
    x_odd_im = aten.where.ScalarOther(signed_zero, _signed(y, 0.0, y), _NAN)
    x_odd = _or(inf_x, nan_x)
    re = aten.where.self(inf_y, y_inf_re, aten.where.ScalarOther(x_odd, x, _NAN))
    im = aten.where.self(inf_y, y_inf_im, aten.where.ScalarOther(x_odd, x_odd_im, _NAN))
    return re, im


def asin_special(x: Any, y: Any) -> Parts:
    """``asin``, as glibc's ``casin``: with a NaN part, ``x + NaN j`` for a zero ``x``,
    ``NaN + copysign(inf, y) j`` when the other part is infinite, else NaN + NaN j; without
    one, ``-i asinh(iz)`` with ``iz = -y + ix``. (The NaN cases are written out, not taken
    through ``asinh``: ``-y`` flips a NaN's sign bit, which an engine may not keep.)"""
    re, im = asinh_special(aten.neg.default(y), x)
    nan_x, nan_y = aten.isnan.default(x), aten.isnan.default(y)
    zero_x = aten.eq.Scalar(x, 0.0)
    either_inf = _or(aten.isinf.default(x), aten.isinf.default(y))
    nan_re = aten.where.ScalarOther(zero_x, x, _NAN)
    nan_im = aten.where.self(zero_x, y, aten.where.ScalarOther(either_inf, _signed(y, _INF, y), _NAN))
    with_nan = _or(nan_x, nan_y)
    return aten.where.self(with_nan, nan_re, im), aten.where.self(with_nan, nan_im, aten.neg.default(re))


def acos_special(x: Any, y: Any) -> Parts:
    """``acos(z) = pi/2 - asin(z)`` (glibc's ``cacos`` away from finite inputs), with a real
    part of ``+0``, never ``-0``."""
    re, im = asin_special(x, y)
    return aten.add.Tensor(aten.rsub.Scalar(re, math.pi / 2), 0.0), aten.neg.default(im)


def acosh_special(x: Any, y: Any) -> Parts:
    """``acosh``: ``inf j`` gives ``inf + copysign(pi/2, y) j`` (``pi/4``, ``3 pi/4`` when ``x`` is
    ``+inf``, ``-inf``; NaN when it is NaN); an infinite ``x`` gives ``inf + copysign(0 or pi, y) j``
    (``pi`` for ``-inf``; NaN for a NaN ``y``); otherwise NaN, with ``pi/2 j`` for ``x = 0``."""
    nan_x, inf_x, inf_y, nan_y = (aten.isnan.default(x), aten.isinf.default(x), aten.isinf.default(y), aten.isnan.default(y))
    negative = aten.signbit.default(x)
    corner = aten.where.ScalarOther(negative, _full(y, 3 * math.pi / 4), math.pi / 4)
    y_inf_angle = aten.where.ScalarOther(inf_x, corner, math.pi / 2)
    y_inf_im = aten.where.ScalarSelf(nan_x, _NAN, aten.copysign.Tensor(y_inf_angle, y))
    x_inf_angle = aten.where.ScalarOther(negative, _full(y, math.pi), 0.0)
    x_inf_im = aten.where.ScalarSelf(nan_y, _NAN, aten.copysign.Tensor(x_inf_angle, y))
    rest_re = _full(x, _NAN)
    rest_im = aten.where.ScalarOther(aten.eq.Scalar(x, 0.0), _full(y, math.pi / 2), _NAN)
    either_inf = _or(inf_x, inf_y)
    re = aten.where.self(either_inf, _full(x, _INF), rest_re)
    im = aten.where.self(inf_y, y_inf_im, aten.where.self(inf_x, x_inf_im, rest_im))
    return re, im


def atanh_special(x: Any, y: Any) -> Parts:
    """``atanh``: ``inf j`` gives ``copysign(0, x) + copysign(pi/2, y) j``; an infinite or zero
    ``x`` gives ``copysign(0, x) + copysign(pi/2, y) j`` (NaN j for a NaN ``y``); else NaN + NaN j."""
    inf_y, nan_y = aten.isinf.default(y), aten.isnan.default(y)
    zero_or_inf_x = _or(aten.isinf.default(x), aten.eq.Scalar(x, 0.0))
    signed_zero, quarter_turn = _signed(x, 0.0, x), _signed(y, math.pi / 2, y)
    x_im = aten.where.ScalarSelf(nan_y, _NAN, quarter_turn)
    re = aten.where.self(_or(inf_y, zero_or_inf_x), signed_zero, _full(x, _NAN))
    im = aten.where.self(inf_y, quarter_turn, aten.where.ScalarOther(zero_or_inf_x, x_im, _NAN))
    return re, im


def exp_special_inputs(x: Any, y: Any) -> Any:
    """Where ``e^x (cos y + i sin y)`` is not ``exp``: an infinite ``x`` with an infinite or
    NaN ``y`` (``inf * NaN``, ``0 * NaN``). Everywhere else, infinities and NaN included, the
    formula gives glibc's value, ``y = 0`` kept exact."""
    return _and(aten.isinf.default(x), _not(aten.isfinite.default(y)))


def exp_special(x: Any, y: Any) -> Parts:
    """``exp`` at :func:`exp_special_inputs`: ``+inf`` gives ``inf + NaN j``, ``-inf`` gives
    ``0 + copysign(0, y) j``."""
    positive = aten.gt.Scalar(x, 0.0)
    re = aten.where.ScalarOther(positive, _full(x, _INF), 0.0)
    im = aten.where.ScalarSelf(positive, _NAN, _signed(y, 0.0, y))
    return re, im


def sqrt_special(x: Any, y: Any) -> Parts:
    """``sqrt``: ``inf j`` gives ``inf + y j``; ``-inf`` gives ``0 + copysign(inf, y) j`` (NaN real
    part for a NaN ``y``), ``+inf`` gives ``inf + copysign(0, y) j`` (NaN j for NaN); else NaN."""
    inf_y, nan_y, inf_x = aten.isinf.default(y), aten.isnan.default(y), aten.isinf.default(x)
    negative = aten.signbit.default(x)
    neg_re = aten.where.ScalarSelf(nan_y, _NAN, _full(x, 0.0))
    neg_im = _signed(y, _INF, y)
    pos_im = aten.where.ScalarSelf(nan_y, _NAN, _signed(y, 0.0, y))
    x_inf_re = aten.where.self(negative, neg_re, x)
    x_inf_im = aten.where.self(negative, neg_im, pos_im)
    re = aten.where.self(inf_y, _full(x, _INF), aten.where.ScalarOther(inf_x, x_inf_re, _NAN))
    im = aten.where.self(inf_y, y, aten.where.ScalarOther(inf_x, x_inf_im, _NAN))
    return re, im
