"""Complex kernels that stay finite where the textbook formulas overflow.

The scaled hypot (``|z|`` and ``log|z|``), division, square root and logarithm follow
torch's own scalar kernels (c10/util/complex.h and complex_math.h), so that huge, tiny,
infinite and NaN inputs give what eager PyTorch gives. Every function takes and returns
(real, imaginary) parts as tensors.
"""

from __future__ import annotations

import math
from typing import Any

import torch

aten = torch.ops.aten


def _scaled_hypot(x: Any, y: Any, *, log: bool = False) -> Any:
    """``|x + iy|`` (``log|x + iy|`` with ``log=True``) without overflow or underflow, as
    ``std::abs`` computes it: with ``m = max(|x|, |y|)``, ``n = min`` and ``r = n / m``,
    ``|z| = m sqrt(1 + r^2)`` and ``log|z| = log(m) + log1p(r^2) / 2``, the latter finite
    wherever the answer is, even when ``|z|`` itself would overflow. inf wins over NaN."""
    ax, ay = aten.abs.default(x), aten.abs.default(y)
    big, small = aten.maximum.default(ax, ay), aten.minimum.default(ax, ay)
    safe = aten.where.ScalarSelf(aten.eq.Scalar(big, 0.0), 1.0, big)
    ratio = aten.div.Tensor(small, safe)
    if log:
        log_big = aten.log.default(big)
        half_log1p = aten.mul.Tensor(aten.log1p.default(aten.mul.Tensor(ratio, ratio)), 0.5)
        out = aten.add.Tensor(log_big, half_log1p)
    else:
        root = aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(ratio, ratio), 1.0))
        out = aten.mul.Tensor(big, root)
    either_inf = aten.logical_or.default(aten.isinf.default(x), aten.isinf.default(y))
    return aten.where.ScalarSelf(either_inf, float("inf"), out)


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
        aten.mul.Tensor(aten.abs.default(x), 0.25),
        _scaled_hypot(aten.mul.Tensor(x, 0.25), aten.mul.Tensor(y, 0.25)),
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


def _log_parts(x: Any, y: Any) -> tuple[Any, Any]:
    return _scaled_hypot(x, y, log=True), aten.atan2.default(y, x)
