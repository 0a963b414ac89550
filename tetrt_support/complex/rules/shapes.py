"""Rules for views, shape ops and reductions of complex tensors.

On the packed layout a view keeps the trailing (real, imaginary) pair: dims are shifted
(:func:`~tetrt_support.complex.rules.packed._dim`), sizes get a trailing ``2``, and no rule
reads a concrete size, so symbolic dims survive. ``sum`` and ``mean`` reduce both parts;
``prod`` multiplies in polar form.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from tetrt_support.complex.rules.packed import _abs2, _cast, _dim, _im, _packed, _polar, _re
from tetrt_support.complex.rules.registry import Family, RuleContext, real_dtype

aten = torch.ops.aten

SHAPES = Family("shapes")


@SHAPES.rule(aten.reshape.default, aten.view.default, aten._unsafe_view.default)
def reshape(ctx: RuleContext, self: Any, size: Any = None, shape: Any = None) -> Any:
    return aten.reshape.default(self, [*(size if size is not None else shape), 2])


@SHAPES.rule(aten.permute.default)
def permute(ctx: RuleContext, self: Any, dims: Any) -> Any:
    r = ctx.rank()
    return aten.permute.default(self, [d % r for d in dims] + [r])


@SHAPES.rule(aten.transpose.int)
def transpose(ctx: RuleContext, self: Any, dim0: int, dim1: int) -> Any:
    return aten.transpose.int(self, _dim(dim0), _dim(dim1))


@SHAPES.rule(aten.t.default)
def t(ctx: RuleContext, self: Any) -> Any:
    return aten.transpose.int(self, 0, 1) if ctx.rank() == 2 else aten.alias.default(self)


@SHAPES.rule(aten.expand.default)
def expand(ctx: RuleContext, self: Any, size: Any, implicit: bool = False) -> Any:
    return aten.expand.default(self, [*size, 2])


@SHAPES.rule(aten.unsqueeze.default)
def unsqueeze(ctx: RuleContext, self: Any, dim: int) -> Any:
    return aten.unsqueeze.default(self, _dim(dim))


@SHAPES.rule(aten.squeeze.default)
def squeeze(ctx: RuleContext, self: Any) -> Any:
    dims = [i for i, s in enumerate(ctx.vals["self"].shape) if statically_known_true(s == 1)]
    return aten.squeeze.dims(self, dims)


@SHAPES.rule(aten.squeeze.dim)
def squeeze_dim(ctx: RuleContext, self: Any, dim: int) -> Any:
    return aten.squeeze.dim(self, _dim(dim))


@SHAPES.rule(aten.squeeze.dims)
def squeeze_dims(ctx: RuleContext, self: Any, dim: Any) -> Any:
    return aten.squeeze.dims(self, [_dim(d) for d in dim])


@SHAPES.rule(aten.cat.default)
def cat(ctx: RuleContext, tensors: Any, dim: int = 0) -> Any:
    vals = ctx.vals["tensors"]
    parts = [
        _packed(RuleContext(ctx.node, {"t": v}, ctx.out), "t", x)
        for v, x in zip(vals, tensors)
        if not (v.dim() == 1 and statically_known_true(v.shape[0] == 0))  # legacy empty operands
    ]
    return aten.cat.default(parts, _dim(dim))


@SHAPES.rule(aten.stack.default)
def stack(ctx: RuleContext, tensors: Any, dim: int = 0) -> Any:
    parts = [
        _packed(RuleContext(ctx.node, {"t": v}, ctx.out), "t", x)
        for v, x in zip(ctx.vals["tensors"], tensors)
    ]
    return aten.stack.default(parts, _dim(dim))


@SHAPES.rule(aten.select.int)
def select(ctx: RuleContext, self: Any, dim: int, index: Any) -> Any:
    return aten.select.int(self, _dim(dim), index)


@SHAPES.rule(aten.slice.Tensor)
def slice_(
    ctx: RuleContext, self: Any, dim: int = 0, start: Any = None, end: Any = None, step: Any = 1
) -> Any:
    return aten.slice.Tensor(self, _dim(dim), start, end, step)


@SHAPES.rule(aten.narrow.default)
def narrow(ctx: RuleContext, self: Any, dim: int, start: Any, length: Any) -> Any:
    return aten.narrow.default(self, _dim(dim), start, length)


@SHAPES.rule(aten.split.Tensor)
def split(ctx: RuleContext, self: Any, split_size: Any, dim: int = 0) -> Any:
    return aten.split.Tensor(self, split_size, _dim(dim))


@SHAPES.rule(aten.split_with_sizes.default)
def split_with_sizes(ctx: RuleContext, self: Any, split_sizes: Any, dim: int = 0) -> Any:
    return aten.split_with_sizes.default(self, split_sizes, _dim(dim))


@SHAPES.rule(aten.chunk.default)
def chunk(ctx: RuleContext, self: Any, chunks: int, dim: int = 0) -> Any:
    return aten.chunk.default(self, chunks, _dim(dim))


@SHAPES.rule(aten.unbind.int)
def unbind(ctx: RuleContext, self: Any, dim: int = 0) -> Any:
    return aten.unbind.int(self, _dim(dim))


@SHAPES.rule(aten.roll.default)
def roll(ctx: RuleContext, self: Any, shifts: Any, dims: Any = ()) -> Any:
    if len(dims) == 0:  # roll of the flattened tensor: flatten all but the pair dim
        flat = aten.reshape.default(self, [-1, 2])
        rolled = aten.roll.default(flat, list(shifts), [0])
        sizes = [*(aten.sym_size.int(self, i) for i in range(ctx.rank())), 2]
        return aten.reshape.default(rolled, sizes)
    return aten.roll.default(self, list(shifts), [_dim(d) for d in dims])


@SHAPES.rule(aten.flip.default)
def flip(ctx: RuleContext, self: Any, dims: Any) -> Any:
    return aten.flip.default(self, [_dim(d) for d in dims])


@SHAPES.rule(aten.flatten.using_ints)
def flatten(ctx: RuleContext, self: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    if ctx.rank() == 0:
        return aten.unsqueeze.default(self, 0)
    return aten.flatten.using_ints(self, _dim(start_dim), _dim(end_dim))


@SHAPES.rule(aten.unflatten.int)
def unflatten(ctx: RuleContext, self: Any, dim: int, sizes: Any) -> Any:
    return aten.unflatten.int(self, _dim(dim), sizes)


@SHAPES.rule(aten.repeat.default)
def repeat(ctx: RuleContext, self: Any, repeats: Any) -> Any:
    """Repeat the complex dims; the trailing (real, imag) pair is repeated once."""
    return aten.repeat.default(self, [*repeats, 1])


@SHAPES.rule(aten.sym_size.int)
def sym_size(ctx: RuleContext, self: Any, dim: int) -> Any:
    return aten.sym_size.int(self, _dim(dim))


@SHAPES.rule(aten.sym_numel.default)
def sym_numel(ctx: RuleContext, self: Any) -> Any:
    return aten.sym_numel.default(_re(self))


@SHAPES.rule(aten._assert_tensor_metadata.default)
def assert_tensor_metadata(ctx: RuleContext, a: Any, **kwargs: Any) -> Any:
    return None  # a dtype assertion about a value that no longer exists in complex form


def _reduced_dims(ctx: RuleContext, dim: Any) -> list[int]:
    if dim is None or len(dim) == 0:
        return list(range(ctx.rank()))
    return [_dim(d) for d in dim]


@SHAPES.rule(aten.sum.dim_IntList, aten.sum.default)
def sum_(
    ctx: RuleContext, self: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None
) -> Any:
    if ctx.rank() == 0:
        return _cast(self, real_dtype(ctx.vals["self"].dtype), ctx.dtype)
    return aten.sum.dim_IntList(self, _reduced_dims(ctx, dim), keepdim, dtype=ctx.dtype)


@SHAPES.rule(aten.mean.dim, aten.mean.default)
def mean(
    ctx: RuleContext, self: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None
) -> Any:
    if ctx.rank() == 0:
        return _cast(self, real_dtype(ctx.vals["self"].dtype), ctx.dtype)
    return aten.mean.dim(self, _reduced_dims(ctx, dim), keepdim, dtype=ctx.dtype)


@SHAPES.rule(aten.prod.dim_int, aten.prod.default)
def prod(
    ctx: RuleContext, self: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None
) -> Any:
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
