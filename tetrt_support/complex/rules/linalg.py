"""Rules for complex matrix products (``mm``, ``bmm``, ``matmul``) and ``einsum``.

A complex product is four real ones combined as in a scalar complex multiply; an einsum
over ``k`` complex operands is ``2^k`` real einsums, signed by the power of ``i`` each
carries.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from tetrt_support.complex.rules.packed import _cast, _complex_mul, _im, _pack, _parts, _re
from tetrt_support.complex.rules.registry import Family, Rule, RuleContext, real_dtype

aten = torch.ops.aten

LINALG = Family("linalg")


def _matmul(op: Any) -> Rule:
    def rule(ctx: RuleContext, self: Any, **operands: Any) -> Any:
        ((name, other),) = operands.items()  # "mat2" for mm/bmm, "other" for matmul
        ar, ai = _parts(ctx, "self", self)
        br, bi = _parts(ctx, name, other)
        mm = lambda a, b: None if a is None or b is None else op(a, b)  # noqa: E731
        return _pack(*_complex_mul(ar, ai, br, bi, times=mm))

    return rule


LINALG.add("mm", (aten.mm.default,), _matmul(aten.mm.default))  # each calls its own product
LINALG.add("bmm", (aten.bmm.default,), _matmul(aten.bmm.default))
LINALG.add("matmul", (aten.matmul.default,), _matmul(aten.matmul.default))


@LINALG.rule(aten.einsum.default)
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
