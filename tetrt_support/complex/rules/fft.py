"""Rules for the FFTs: every transform as matrix products with real DFT matrices.

Choice: the matrices (cos and sin of ``2 pi j k / n``) are built in the graph from the
transform length. Why not the engine's DFT op: TensorRT has no DFT layer, and ONNX's DFT
is one engine's op, so the lowered graph would stop being engine-neutral; matmuls run in
every engine (TensorRT, ONNX Runtime, inductor, eager), and for the lengths of these models
(an FNet hidden size, an ISTFT n_fft of a few hundred) O(n^2) is small. The matrices come
from ``arange`` of the length (a SymInt where the dim is dynamic) and ``(j*k) mod n`` is
taken in int64 before the angle is formed, so the angles stay exact for every length and
no concrete size is baked in.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from tetrt_support.complex.rules.packed import _cast, _im, _pack, _re
from tetrt_support.complex.rules.registry import Family, RuleContext, real_dtype

aten = torch.ops.aten

FFT = Family("fft")


_FFT_NORMS = {
    None: "backward", "backward": "backward", "forward": "forward", "ortho": "ortho"
}

#: hfft and ihfft: the norm of the irfft / rfft they are, forward and backward swapped
_SWAPPED_NORMS = {
    None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"
}


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
    if isinstance(n, int):
        phase = aten.remainder.Scalar(jk, n)
    else:
        phase = aten.remainder.Tensor(jk, _size_tensor(n, torch.int64))
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


def _c2c_1d(
    ctx: RuleContext, re: Any, im: Any, dim: int, rank: int, n: _Length, inverse: bool, how: str
) -> tuple[Any, Any]:
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


def _r2c_1d(
    ctx: RuleContext, re: Any, dim: int, rank: int, n: _Length, bins: Any, how: str
) -> tuple[Any, Any]:
    cos, sin = _twiddles(ctx, n.graph, bins, n.graph)
    out_re = _scale(_contract(re, dim, rank, cos), n, how)
    return out_re, _scale(aten.neg.default(_contract(re, dim, rank, sin)), n, how)


def _c2r_1d(
    ctx: RuleContext, re: Any, im: Any, dim: int, rank: int, bins: Any, n: _Length, how: str
) -> Any:
    """Real inverse of a one-sided spectrum: bin ``k`` counts twice (itself and its mirror
    ``n - k``) except bin 0 and, for even ``n``, bin ``n/2``; their imaginary parts drop out
    (``sin`` is 0 there), as in pocketfft."""
    cos, sin = _twiddles(ctx, bins, n.graph, n.graph)
    k = aten.arange.default(bins, dtype=torch.int64, device=ctx.device)
    twice = aten.mul.Tensor(k, 2)
    if isinstance(n.graph, int):
        nyquist = aten.eq.Scalar(twice, n.graph)
    else:
        nyquist = aten.eq.Tensor(twice, _size_tensor(n.graph, torch.int64))
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


def _lengths(
    ctx: RuleContext, x: Any, v: torch.Tensor, dims: list[int], s: Any, s_vals: Any
) -> list[tuple[_Length, _Length]]:
    """Per transformed dim: (size it has, length wanted)."""
    out = []
    for i, d in enumerate(dims):
        have = _dim_length(x, d, v.shape[d])
        want = have if s is None or _static_int(s_vals[i]) == -1 else _arg_length(s_vals[i], s[i])
        out.append((have, want))
    return out


def _fft_c2c_nd(
    ctx: RuleContext, self: Any, s: Any, dims: list[int], inverse: bool, how: Callable[[], str]
) -> Any:
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


@FFT.rule(aten.fft_fft.default, aten.fft_ifft.default)
def fft_fft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    inverse = ctx.node.target is aten.fft_ifft.default
    v = ctx.vals["self"]
    how = functools.partial(_norm_scaling, norm, inverse)
    return _fft_c2c_nd(ctx, self, _as_list(n), [dim % v.dim()], inverse, how)


@FFT.rule(
    aten.fft_fft2.default, aten.fft_ifft2.default, aten.fft_fftn.default, aten.fft_ifftn.default
)
def fft_fftn(ctx: RuleContext, self: Any, s: Any = None, dim: Any = None, norm: Any = None) -> Any:
    inverse = ctx.node.target in (aten.fft_ifft2.default, aten.fft_ifftn.default)
    dims = _fft_dims(ctx.vals["self"], s, dim, True)
    return _fft_c2c_nd(ctx, self, s, dims, inverse, lambda: _norm_scaling(norm, inverse))


@FFT.rule(aten._fft_c2c.default)
def fft_c2c(ctx: RuleContext, self: Any, dim: Any, normalization: int, forward: bool) -> Any:
    how = {0: "none", 1: "sqrt", 2: "n"}[normalization]
    return _fft_c2c_nd(ctx, self, None, [d % ctx.rank() for d in dim], not forward, lambda: how)


def _rfft_nd(
    ctx: RuleContext, self: Any, s: Any, s_vals: Any, dims: list[int], how: Callable[[], str]
) -> Any:
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


@FFT.rule(aten.fft_rfft.default)
def fft_rfft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    v = ctx.vals["self"]
    how = functools.partial(_norm_scaling, norm, False)
    return _rfft_nd(ctx, self, _as_list(n), ctx.vals.get("n"), [dim % v.dim()], how)


@FFT.rule(aten.fft_rfft2.default, aten.fft_rfftn.default)
def fft_rfftn(ctx: RuleContext, self: Any, s: Any = None, dim: Any = None, norm: Any = None) -> Any:
    dims = _fft_dims(ctx.vals["self"], s, dim, True)
    return _rfft_nd(ctx, self, s, ctx.vals.get("s"), dims, lambda: _norm_scaling(norm, False))


@FFT.rule(aten._fft_r2c.default)
def fft_r2c(ctx: RuleContext, self: Any, dim: Any, normalization: int, onesided: bool) -> Any:
    how = {0: "none", 1: "sqrt", 2: "n"}[normalization]
    dims = [d % ctx.rank() for d in dim]
    if not onesided:  # a two-sided real transform is the complex one of a real input
        return _fft_c2c_nd(ctx, self, None, dims, False, lambda: how)
    return _rfft_nd(ctx, self, None, None, dims, lambda: how)


def _irfft_nd(
    ctx: RuleContext,
    self: Any,
    s: Any,
    s_vals: Any,
    dims: list[int],
    how: Callable[[], str],
    last_size: Any = None,
    last_val: Any = None,
) -> Any:
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


@FFT.rule(aten.fft_irfft.default)
def fft_irfft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    v = ctx.vals["self"]
    how = functools.partial(_norm_scaling, norm, True)
    return _irfft_nd(ctx, self, _as_list(n), ctx.vals.get("n"), [dim % v.dim()], how)


@FFT.rule(aten.fft_irfft2.default, aten.fft_irfftn.default)
def fft_irfftn(
    ctx: RuleContext, self: Any, s: Any = None, dim: Any = None, norm: Any = None
) -> Any:
    dims = _fft_dims(ctx.vals["self"], s, dim, True)
    return _irfft_nd(ctx, self, s, ctx.vals.get("s"), dims, lambda: _norm_scaling(norm, True))


@FFT.rule(aten._fft_c2r.default)
def fft_c2r(ctx: RuleContext, self: Any, dim: Any, normalization: int, last_dim_size: Any) -> Any:
    how = {0: "none", 1: "sqrt", 2: "n"}[normalization]
    dims = [d % ctx.rank() for d in dim]
    last_val = ctx.vals["last_dim_size"]
    return _irfft_nd(ctx, self, None, None, dims, lambda: how, last_dim_size, last_val)


@FFT.rule(aten.fft_hfft.default)
def fft_hfft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    """``hfft(x) = irfft(conj(x))`` with the forward/backward scalings swapped."""
    swapped = _SWAPPED_NORMS[norm]
    v = ctx.vals["self"]
    conj_self = _pack(_re(self), aten.neg.default(_im(self))) if v.is_complex() else self
    how = functools.partial(_norm_scaling, swapped, True)
    return _irfft_nd(ctx, conj_self, _as_list(n), ctx.vals.get("n"), [dim % v.dim()], how)


@FFT.rule(aten.fft_ihfft.default)
def fft_ihfft(ctx: RuleContext, self: Any, n: Any = None, dim: int = -1, norm: Any = None) -> Any:
    """``ihfft(x) = conj(rfft(x))`` with the forward/backward scalings swapped."""
    swapped = _SWAPPED_NORMS[norm]
    v = ctx.vals["self"]
    how = functools.partial(_norm_scaling, swapped, False)
    packed = _rfft_nd(ctx, self, _as_list(n), ctx.vals.get("n"), [dim % v.dim()], how)
    return _pack(_re(packed), aten.neg.default(_im(packed)))
