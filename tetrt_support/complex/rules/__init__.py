"""ONE table of per-op rules that lower complex ATen ops to real arithmetic.

A complex tensor of shape ``S`` travels packed, as a real ``S + [2]`` tensor
(``view_as_real``). A rule is ``rule(ctx: RuleContext, **arguments) -> packed result``: it
uses only ``torch.ops.aten`` calls and control flow over ``ctx``'s meta values, so it runs on
(fake) tensors for the "retrace" strategy and on ``fx.Proxy`` objects for "rewrite"; it reads
no concrete size, so dynamic dims survive. The table is :data:`RULES`, filled in :data:`ORDER`
from one module per op family.
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
#: iteration order (what ``report.complex_graphs.rule_table`` lists) stays
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
