"""Helpers over the packed layout: a complex value as a real ``[..., 2]`` tensor.

Reading parts (:func:`_re`, :func:`_im`, :func:`_parts`), packing them back, casting,
promoting a real argument or scalar to complex, the arithmetic on parts that may be
tensors, Python scalars or ``None`` (zero), and the one complex product
:func:`_complex_mul`. Only ``torch.ops.aten`` calls, so the same code runs on tensors,
fake tensors and FX proxies.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from tetrt_support.complex.rules.registry import RuleContext, real_dtype

aten = torch.ops.aten


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


def _complex_mul(
    ar: Any, ai: Any, br: Any, bi: Any, times: Callable[[Any, Any], Any] = _mul
) -> tuple[Any, Any]:
    """``(ar + i ai) (br + i bi)`` as (real, imaginary): ``ar br - ai bi``, ``ar bi + ai br``.

    Parts may be tensors, Python scalars or ``None`` (zero), as :func:`_mul` takes them;
    ``times`` is the product of two parts (:func:`_mul`, or a matrix product that returns
    ``None`` for a ``None`` factor)."""
    return _sub(times(ar, br), times(ai, bi)), _add(times(ar, bi), times(ai, br))


def _abs2(x: Any) -> Any:
    re, im = _re(x), _im(x)
    return aten.add.Tensor(aten.mul.Tensor(re, re), aten.mul.Tensor(im, im))


def _polar(mag: Any, ang: Any) -> Any:
    return _pack(
        aten.mul.Tensor(mag, aten.cos.default(ang)), aten.mul.Tensor(mag, aten.sin.default(ang))
    )
