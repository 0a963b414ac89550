"""Rules for dtype conversions and tensor factories with a complex result or argument.

Complex to real keeps the real part (as torch does), real to complex packs a zero
imaginary part, and the factories (``full``, ``zeros_like``, ``scalar_tensor``, ...) build
both parts of a complex fill value.
"""

from __future__ import annotations

from typing import Any

import torch

from tetrt_support.complex.rules.packed import _cast, _pack, _packed, _re, _scalar
from tetrt_support.complex.rules.registry import Family, RuleContext, real_dtype

aten = torch.ops.aten

CONVERSIONS = Family("conversions")


def _convert(ctx: RuleContext, name: str, x: Any) -> Any:
    """Argument ``name`` converted to the dtype of the result (complex <-> real <-> complex)."""
    v = ctx.vals[name]
    out = ctx.out.dtype
    if out.is_complex:
        return _packed(ctx, name, x, real_dtype(out))
    if v.is_complex():  # complex -> real keeps the real part, as torch does
        return _cast(_re(x), real_dtype(v.dtype), out)
    return _cast(x, v.dtype, out)


@CONVERSIONS.rule(aten._to_copy.default, aten.to.dtype_layout, aten.to.dtype, aten.to.device)
def to_dtype(ctx: RuleContext, self: Any, **kwargs: Any) -> Any:
    y = _convert(ctx, "self", self)
    device = kwargs.get("device")
    if device is not None and torch.device(device) != ctx.vals["self"].device:
        y = aten._to_copy.default(y, device=device)
    elif ctx.node.target is aten._to_copy.default or kwargs.get("copy"):
        y = aten.clone.default(y) if y is self else y
    return y


@CONVERSIONS.rule(aten.type_as.default)
def type_as(ctx: RuleContext, self: Any, other: Any) -> Any:
    return _convert(ctx, "self", self)


@CONVERSIONS.rule(aten.copy.default, aten.copy_.default)
def copy(ctx: RuleContext, self: Any, src: Any, non_blocking: bool = False) -> Any:
    op = ctx.node.target  # copy_ mutates the packed destination, as it would the complex one
    if ctx.out.dtype.is_complex:
        return op(_packed(ctx, "self", self), _convert(ctx, "src", src))
    return op(self, _convert(ctx, "src", src))


@CONVERSIONS.rule(
    aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.full_like.default
)
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
        aten.full_like.default(base, z.real, dtype=dtype),
        aten.full_like.default(base, z.imag, dtype=dtype),
    )


@CONVERSIONS.rule(
    aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format
)
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


@CONVERSIONS.rule(aten.scalar_tensor.default)
def scalar_tensor(ctx: RuleContext, s: Any, **kwargs: Any) -> Any:
    z = complex(s)
    return _pack(_scalar(ctx, z.real, ctx.dtype), _scalar(ctx, z.imag, ctx.dtype))
