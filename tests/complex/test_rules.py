"""Every lowering rule against eager PyTorch, through both strategies."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.complex.complex_testing import STRATEGIES, Fn, assert_lowered_matches, crandn, export, pack

from tetrt_support.complex import complex_nodes, lower

Z = lambda *s: crandn(*s)  # noqa: E731
R = lambda *s: torch.randn(*s)  # noqa: E731

# name -> (function, argument makers). Complex results and inputs are compared packed.
CASES = {
    # arithmetic: complex tensor, real tensor, real scalar, Python complex scalar, broadcasting
    "add_cc_broadcast": (lambda a, b: a + b, (Z(3, 4), Z(4))),
    "add_cr": (lambda a, b: a + b, (Z(3, 4), R(3, 4))),
    "add_rc_broadcast": (lambda a, b: a + b, (R(4), Z(3, 4))),
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2), (Z(3, 4), Z(3, 4))),
    "add_real_scalar": (lambda a: a + 2.5, (Z(3, 4),)),
    "add_complex_scalar": (lambda a: a + (1 - 2j), (Z(3, 4),)),
    "real_plus_complex_scalar": (lambda r: r + 2j, (R(3, 4),)),
    "sub_cc": (lambda a, b: a - b, (Z(3, 4), Z(1, 4))),
    "sub_rc": (lambda r, b: r - b, (R(3, 1), Z(3, 4))),
    "rsub_scalar": (lambda a: 2.0 - a, (Z(3, 4),)),
    "sub_complex_scalar": (lambda a: a - 1j, (Z(3, 4),)),
    "mul_cc_broadcast": (lambda a, b: a * b, (Z(2, 3, 4), Z(3, 1))),
    "mul_cr": (lambda a, r: a * r, (Z(3, 4), R(4))),
    "mul_rc": (lambda r, a: r * a, (R(3, 1), Z(3, 4))),
    "mul_real_scalar": (lambda a: a * 3.0, (Z(3, 4),)),
    "mul_complex_scalar": (lambda a: a * (0.5 + 2j), (Z(3, 4),)),
    "real_times_complex_scalar": (lambda r: r * (1 + 1j), (R(3, 4),)),
    "div_cc": (lambda a, b: a / b, (Z(3, 4), Z(3, 4))),
    "div_cr": (lambda a, r: a / r, (Z(3, 4), R(4).abs() + 1)),
    "div_rc": (lambda r, a: r / a, (R(3, 4), Z(3, 4))),
    "div_real_scalar": (lambda a: a / 4.0, (Z(3, 4),)),
    "div_complex_scalar": (lambda a: a / (1 + 2j), (Z(3, 4),)),
    "scalar_div_complex": (lambda a: 2.0 / a, (Z(3, 4),)),
    "int_tensor_times_complex": (lambda i, a: i * a, (torch.arange(4), Z(3, 4))),
    "neg": (lambda a: -a, (Z(3, 4),)),
    "conj": (lambda a: a.conj() * 1, (Z(3, 4),)),
    "conj_physical": (lambda a: torch.conj_physical(a), (Z(3, 4),)),
    "resolve_conj": (lambda a: a.conj().resolve_conj(), (Z(3, 4),)),
    "reciprocal": (lambda a: a.reciprocal(), (Z(3, 4),)),
    "abs": (lambda a: a.abs(), (Z(3, 4),)),
    "angle": (lambda a: a.angle(), (Z(3, 4),)),
    "real_imag": (lambda a: a.real * 2 + a.imag, (Z(3, 4),)),
    "polar": (lambda m, t: torch.polar(m, t), (R(3, 4).abs(), R(3, 4))),
    "polar_broadcast": (lambda m, t: torch.polar(m, t), (R(4).abs(), R(3, 4))),
    "view_as_complex_real": (lambda x: torch.view_as_real(torch.view_as_complex(x) * 2), (R(3, 4, 2),)),
    "complex": (lambda a, b: torch.complex(a, b), (R(3, 4), R(4))),
    "exp": (lambda a: a.exp(), (Z(3, 4),)),
    "log": (lambda a: a.log(), (Z(3, 4),)),
    "sqrt": (lambda a: a.sqrt(), (Z(3, 4),)),
    "pow_int": (lambda a: a**2, (Z(3, 4),)),
    "pow_float": (lambda a: a**0.5, (Z(3, 4),)),
    "pow_complex": (lambda a: a ** (1 + 0.5j), (Z(3, 4),)),
    "real_pow_complex_scalar": (lambda r: (r.abs() + 0.1) ** (0.5 + 1j), (R(3, 4),)),
    "pow_tensor_tensor": (lambda a, b: a**b, (Z(3, 4), Z(3, 4) * 0.5)),
    "scalar_pow_complex": (lambda a: 2.0**a, (Z(3, 4),)),
    "sin": (lambda a: a.sin(), (Z(3, 4),)),
    "cos": (lambda a: a.cos(), (Z(3, 4),)),
    "tan": (lambda a: a.tan(), (Z(3, 4),)),
    "sinh": (lambda a: a.sinh(), (Z(3, 4),)),
    "cosh": (lambda a: a.cosh(), (Z(3, 4),)),
    "tanh": (lambda a: a.tanh(), (Z(3, 4),)),
    "isnan_isfinite": (lambda a: (a.isnan(), a.isfinite()), (Z(3, 4),)),
    "where": (lambda c, a, b: torch.where(c, a, b), (R(3, 4) > 0, Z(3, 4), Z(4))),
    "where_real_other": (lambda c, a, r: torch.where(c, a, r), (R(3, 4) > 0, Z(3, 4), R(3, 4))),
    "where_scalar": (lambda c, a: torch.where(c, a, 0.0), (R(3, 4) > 0, Z(3, 4))),
    "full_like": (lambda a: torch.full_like(a, 1 - 2j) + a, (Z(3, 4),)),
    "zeros_ones_like": (lambda a: (torch.zeros_like(a), torch.ones_like(a)), (Z(3, 4),)),
    "zeros_like_real_from_complex": (lambda a: torch.zeros_like(a, dtype=torch.float32), (Z(3, 4),)),
    "to_complex128": (lambda a: a.to(torch.complex128) * 2, (Z(3, 4),)),
    "to_complex64": (lambda a: a.to(torch.complex64), (crandn(3, 4, dtype=torch.complex128),)),
    "real_to_complex": (lambda r: r.to(torch.complex64) + 1j, (R(3, 4),)),
    "complex_to_real": (lambda a: a.to(torch.float32), (Z(3, 4),)),
    "to_dtype_layout": (lambda a: a.to(dtype=torch.complex64, device="cpu") * 1j, (R(3, 4),)),
    "aten_to_dtype_layout": (lambda r: torch.ops.aten.to.dtype_layout(r, dtype=torch.complex64) * 1j, (R(3, 4),)),
    "aten_to_copy": (lambda a: torch.ops.aten._to_copy.default(a, dtype=torch.complex128), (Z(3, 4),)),
    "aten_view_expand_full": (lambda a: torch.ops.aten.view.default(a, [4, 3]).expand(2, 4, 3) + torch.full((3,), 1 + 1j), (Z(3, 4),)),
    "zeros_complex_dtype": (lambda a: a + torch.zeros(3, 4, dtype=torch.complex64), (Z(3, 4),)),
    "type_as": (lambda r, a: r.type_as(a) * a, (R(3, 4), Z(3, 4))),
    "copy_into_complex": (lambda a, r: a.clone().copy_(r), (Z(3, 4), R(3, 4))),
    "in_place_mul_add": (lambda a, b: (a.clone().mul_(b).add_(1j), a.clone().div_(2.0)), (Z(3, 4), Z(4))),
    "clone_contiguous": (lambda a: a.transpose(0, 1).contiguous().clone(), (Z(3, 4),)),
    "reshape_view": (lambda a: a.reshape(2, 6).view(3, 2, 2)[..., -1], (Z(3, 4),)),
    "permute": (lambda a: a.permute(2, 0, 1), (Z(2, 3, 4),)),
    "permute_negative": (lambda a: a.permute(-1, 0, -2), (Z(2, 3, 4),)),
    "transpose_t": (lambda a, b: (a.transpose(-1, 0), b.t()), (Z(2, 3, 4), Z(3, 4))),
    "t_1d": (lambda a: a.t() * 1, (Z(4),)),
    "expand": (lambda a: a.expand(2, 3, 4), (Z(3, 1),)),
    "unsqueeze": (lambda a: (a.unsqueeze(0), a.unsqueeze(-1), a.unsqueeze(1)), (Z(3, 4),)),
    "squeeze": (lambda a: (a.squeeze(), a.squeeze(1), a.squeeze(-1), a.squeeze((1, 3))), (Z(3, 1, 4, 1),)),
    "cat": (lambda a, b, r: torch.cat([a, b, r], dim=-1), (Z(3, 4), Z(3, 2), R(3, 1))),
    "stack": (lambda a, b: (torch.stack([a, b]), torch.stack([a, b], dim=-1)), (Z(3, 4), Z(3, 4))),
    "select_slice": (lambda a: (a[1], a[:, 1:3], a[..., ::2], a[:, -1]), (Z(3, 4),)),
    "split_chunk": (lambda a: (*a.split(2, dim=-1), *a.chunk(3, dim=0), *a.split([1, 3], dim=1)), (Z(3, 4),)),
    "unbind": (lambda a: a.unbind(-1), (Z(3, 2),)),
    "narrow": (lambda a: a.narrow(-1, 1, 2), (Z(3, 4),)),
    "roll": (lambda a: (a.roll(1, -1), a.roll((1, 2), (0, 1)), a.roll(5)), (Z(3, 4),)),
    "flip": (lambda a: a.flip(0, -1), (Z(3, 4),)),
    "flatten_unflatten": (lambda a: (a.flatten(), a.flatten(1), a.unflatten(-1, (2, 2))), (Z(2, 3, 4),)),
    "sum": (lambda a: (a.sum(), a.sum(-1), a.sum((0, 1), keepdim=True)), (Z(2, 3, 4),)),
    "mean": (lambda a: (a.mean(), a.mean(1), a.mean(-1, keepdim=True)), (Z(2, 3, 4),)),
    "prod": (lambda a: (a.prod(), a.prod(1), a.prod(-1, keepdim=True)), (Z(2, 3, 4) * 0.9,)),
    "mm": (lambda a, b: a @ b, (Z(3, 4), Z(4, 5))),
    "bmm": (lambda a, b: torch.bmm(a, b), (Z(2, 3, 4), Z(2, 4, 5))),
    "matmul_broadcast": (lambda a, b: torch.matmul(a, b), (Z(2, 3, 4), Z(4))),
    "rope_like": (
        lambda x, f: torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * f).flatten(-2),
        (R(2, 5, 8), torch.polar(torch.ones(5, 4), R(5, 4))),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_matches_eager(name: str) -> None:
    fn, args = CASES[name]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Casting complex values to real")
        assert_lowered_matches(fn, args)


CORE_ATEN = ["add_cr", "mul_complex_scalar", "div_rc", "sub_rc", "to_complex128", "where_scalar", "mean", "sum",
             "transpose_t", "select_slice", "full_like", "rope_like", "abs", "complex", "polar"]


@pytest.mark.parametrize("name", CORE_ATEN)
def test_rule_matches_eager_after_core_aten_decompositions(name: str) -> None:
    """``run_decompositions()`` (core ATen, what a compiler usually lowers) brings other
    overloads (``mul.Scalar``, ``_to_copy``, ``view``...); the rules must cover them too."""
    fn, args = CASES[name]
    ep = export(fn, args).run_decompositions()
    expected = pack(Fn(fn)(*args))
    for strategy in STRATEGIES:
        gm = lower(ep, strategy)
        assert complex_nodes(gm) == []
        torch.testing.assert_close(gm(*pack(args)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["mul_cc_broadcast", "div_cc", "exp", "sqrt", "mm", "prod", "tanh", "pow_complex"])
def test_rule_matches_eager_complex128(name: str) -> None:
    fn, args = CASES[name]
    args = tuple(a.to(torch.complex128) if a.is_complex() else a.double() if a.is_floating_point() else a for a in args)
    assert_lowered_matches(fn, args, rtol=1e-10, atol=1e-10)


def test_one_rule_table_serves_both_strategies() -> None:
    """Adding ONE entry to RULES teaches both strategies a new op: complex cumsum is a
    cumsum of the packed pairs along the shifted dim (it has no rule by default)."""
    from tetrt_support.complex import RULES, UnsupportedComplexOp
    from tetrt_support.complex.rules import RuleContext

    aten = torch.ops.aten
    calls: list[str] = []

    def cumsum(ctx: RuleContext, self: object, dim: int, dtype: object = None) -> object:
        calls.append(type(self).__name__)  # FakeTensor (retrace) or Proxy (rewrite)
        return aten.cumsum.default(self, dim - 1 if dim < 0 else dim)

    fn, args = (lambda a: torch.cumsum(a * 2, dim=-1)), (Z(3, 4),)
    with pytest.raises(UnsupportedComplexOp):
        assert_lowered_matches(fn, args)
    RULES.register(aten.cumsum.default)(cumsum)
    try:
        assert_lowered_matches(fn, args)
    finally:
        RULES.unregister(aten.cumsum.default)
    assert sorted(calls) == ["FakeTensor", "Proxy"]


def test_rule_table_refuses_a_second_rule_for_an_op() -> None:
    """A duplicate registration is an error naming the op and both rules, and it leaves
    the table unchanged (no silent overwrite that depends on import order)."""
    from tetrt_support.complex import RULES

    aten = torch.ops.aten
    before = dict(RULES)

    def other_mm(ctx: object, self: object, mat2: object) -> object:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match=r"aten::mm already has a complex lowering rule .*other_mm"):
        RULES.register(aten.cumsum.default, aten.mm.default)(other_mm)
    assert dict(RULES) == before  # cumsum was not half-registered
    with pytest.raises(KeyError, match="aten::cumsum has no complex lowering rule"):
        RULES.unregister(aten.cumsum.default)


def test_matmul_family_goes_through_the_registry() -> None:
    from tetrt_support.complex import RULES

    aten = torch.ops.aten
    for op in (aten.mm.default, aten.bmm.default, aten.matmul.default):
        assert op in RULES


def test_rule_families_fill_the_table_in_one_fixed_order() -> None:
    """The family modules' rules, registered by name in ``ORDER``, are exactly ``RULES``;
    a rule that ``ORDER`` does not name is refused, not appended wherever it lands."""
    from tetrt_support.complex import RULES
    from tetrt_support.complex.rules import FAMILIES, ORDER, Family, RuleRegistry, _fill

    table = RuleRegistry()
    _fill(table, FAMILIES, ORDER)
    assert list(table.items()) == list(RULES.items())

    stray = Family("stray")
    stray.add("cumsum", (torch.ops.aten.cumsum.default,), lambda ctx, self, dim: self)
    with pytest.raises(ValueError, match=r"unlisted \['cumsum'\]"):
        _fill(RuleRegistry(), (*FAMILIES, stray), ORDER)
