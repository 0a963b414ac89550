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
  strategy, :mod:`tetrt_support.complex.retrace`), and
- ``torch.fx.Proxy`` objects bound to the exported graph (the in-place "rewrite"
  strategy, :mod:`tetrt_support.complex.rewrite`).

Dims are shifted for the packed layout (a negative dim ``d`` becomes ``d - 1``; a
non-negative one is unchanged) and sizes get a trailing ``2``; no rule reads a concrete
size, so dynamic (symbolic) batch and sequence dims survive.

The table is :data:`RULES` (:mod:`.registry`); the rules live in one module per family
(:mod:`.elementwise`, :mod:`.conversions`, :mod:`.shapes`, :mod:`.linalg`,
:mod:`.special`, :mod:`.fft`) over the shared helpers of :mod:`.packed`, :mod:`.stable`
and :mod:`.special_values`. Importing this package fills :data:`RULES` in :data:`ORDER`.
"""

from __future__ import annotations

from tetrt_support.complex.rules import conversions, elementwise, fft, linalg, shapes, special
from tetrt_support.complex.rules.registry import (
    RULES,
    Family,
    Rule,
    RuleContext,
    RuleRegistry,
    bind_arguments,
    real_dtype,
    register,
    rule_for,
)

__all__ = [
    "ORDER",
    "RULES",
    "Family",
    "Rule",
    "RuleContext",
    "RuleRegistry",
    "bind_arguments",
    "real_dtype",
    "register",
    "rule_for",
]

FAMILIES: tuple[Family, ...] = (
    elementwise.ELEMENTWISE,
    conversions.CONVERSIONS,
    shapes.SHAPES,
    linalg.LINALG,
    special.SPECIAL,
    fft.FFT,
)

#: The order in which the families' rules join :data:`RULES`, by name: the table's
#: iteration order (what ``report.complex_graphs.rule_table`` lists, notebook 01) stays
#: the one it had before the rules were split by family, ``repeat`` after ``sgn`` included.
ORDER: tuple[str, ...] = (
    # elementwise
    "add", "sub", "rsub", "mul", "div", "neg", "conj", "identity_view", "clone", "contiguous",
    "lift_fresh_copy", "reciprocal", "abs_", "angle", "real", "imag", "view_as_real",
    "view_as_complex", "polar", "complex_", "exp", "log", "sqrt", "pow_tensor_scalar",
    "pow_tensor_tensor", "pow_scalar", "sin", "cos", "sinh", "cosh", "tan", "tanh", "isnan",
    "isinf", "isfinite", "where",
    # conversions
    "to_dtype", "type_as", "copy", "full_like", "full", "scalar_tensor",
    # shapes
    "reshape", "permute", "transpose", "t", "expand", "unsqueeze", "squeeze", "squeeze_dim",
    "squeeze_dims", "cat", "stack", "select", "slice_", "narrow", "split", "split_with_sizes",
    "chunk", "unbind", "roll", "flip", "flatten", "unflatten", "sym_size", "sym_numel",
    "assert_tensor_metadata", "sum_", "mean", "prod",
    # linalg
    "mm", "bmm", "matmul",
    # special
    "asin", "acos", "acosh", "atanh", "asinh", "atan", "log1p", "log_base", "expm1", "rsqrt",
    "sgn",
    # shapes, linalg, fft
    "repeat", "einsum", "fft_fft", "fft_fftn", "fft_c2c", "fft_rfft", "fft_rfftn", "fft_r2c",
    "fft_irfft", "fft_irfftn", "fft_c2r", "fft_hfft", "fft_ihfft",
)


def _fill(table: RuleRegistry, families: tuple[Family, ...], order: tuple[str, ...]) -> None:
    """Register every family's rules in ``table``, in ``order``; each name exactly once."""
    entries: dict[str, tuple[tuple[object, ...], Rule]] = {}
    for family in families:
        for name, entry in family.entries.items():
            if name in entries:
                raise ValueError(f"two families define a rule named {name!r}")
            entries[name] = entry
    unlisted = sorted(set(entries) - set(order))
    unknown = sorted(set(order) - set(entries))
    if unlisted or unknown or len(set(order)) != len(order):
        raise ValueError(f"ORDER must name each rule once: unlisted {unlisted}, unknown {unknown}")
    for name in order:
        ops, fn = entries[name]
        table.register(*ops)(fn)


_fill(RULES, FAMILIES, ORDER)
