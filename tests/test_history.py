"""Reproductions of old behaviour: the broken variants in :mod:`tetrt_support.history`
really break as notebook 02 says, and the shipped pipeline really fixes them.

First on a plain retrace of ``ep.module()`` (no lowering: the signature problem is the
retrace's alone), then through the whole compiler with each historical pass list.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.assertions import assert_same_outputs
from tests.models import DC, NT, Eig, register_case_dataclass
from tests.models import OutputModel as OutputKindModel
from tetrt_support.history import (
    BEFORE_FIX,
    EVERY_COMPLEX_OUTPUT,
    FINAL,
    FLATTEN_FIX,
    POLICIES,
    compile_as,
    retrace,
    signature_matrix,
    substituted,
)
from tetrt_support.compiler.pipeline import PASSES

inputs_for = OutputKindModel.inputs
register_case_dataclass()  # Real("dataclass") returns a DC


class Real(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        z = x * y
        return {
            "namedtuple": lambda: NT(z, z * 2),
            "dataclass": lambda: DC(z, z * 2),
            "dict": lambda: {"prod": z, "energy": z.sum()},
            "tensor_1x4": lambda: z.reshape(1, -1)[:, :4],
            "nested": lambda: (z, [z * 2, {"k": z * 3}], NT(z, z)),
        }[self.kind]()


XY = (torch.randn(3, 2), torch.randn(3, 2))


def _retraced(kind: str, mode: str):
    ep = torch.export.export(Real(kind), XY, strict=False)
    return retrace(ep.module(), list(XY), mode)


@pytest.mark.parametrize("kind", ["namedtuple", "dataclass", "dict", "tensor_1x4", "nested"])
def test_plain_retrace_rejects_keywords_but_works_by_position(kind: str) -> None:
    gm = _retraced(kind, "plain")
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["arg0_1", "arg1_1"]
    assert_same_outputs(Real(kind)(*XY), gm(*XY))
    with pytest.raises(TypeError, match="forward\\(\\) got an unexpected keyword argument 'x'"):
        gm(x=XY[0], y=XY[1])


def test_restore_only_returns_a_dict_of_its_keys() -> None:
    out = _retraced("dict", "restore")(x=XY[0], y=XY[1])
    assert out == {"prod": "prod", "energy": "energy"}


def test_restore_only_drops_a_dimension_of_a_1x4_tensor() -> None:
    out = _retraced("tensor_1x4", "restore")(*XY)
    assert out.shape == (4,) and Real("tensor_1x4")(*XY).shape == (1, 4)


def test_restore_only_finds_a_dataclass_not_iterable() -> None:
    with pytest.raises(TypeError, match="'DC' object is not iterable"):
        _retraced("dataclass", "restore")(*XY)


def test_restore_only_rebuilds_a_namedtuple_by_accident() -> None:
    assert_same_outputs(Real("namedtuple")(*XY), _retraced("namedtuple", "restore")(x=XY[0], y=XY[1]))


@pytest.mark.parametrize(("kind", "leaves"), [("namedtuple", 1), ("dataclass", 1), ("nested", 4)])
def test_flatten_fix_breaks_namedtuple_and_dataclass_outputs(kind: str, leaves: int) -> None:
    gm = _retraced(kind, "flatten")
    with pytest.raises(ValueError, match=f"`leaves` has length {leaves} but the spec refers to a pytree"):
        gm(*XY)  # also by position


@pytest.mark.parametrize("kind", ["dict", "tensor_1x4"])
def test_flatten_fix_repairs_dicts_and_tensors(kind: str) -> None:
    assert_same_outputs(Real(kind)(*XY), _retraced(kind, "flatten")(x=XY[0], y=XY[1]))


@pytest.mark.parametrize("kind", ["namedtuple", "dataclass", "dict", "tensor_1x4", "nested"])
def test_codegen_swap_keeps_every_output_and_keywords(kind: str) -> None:
    gm = _retraced(kind, "swap")
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["x", "y"]
    for out in (gm(*XY), gm(x=XY[0], y=XY[1]), gm(XY[0], y=XY[1])):
        assert_same_outputs(Real(kind)(*XY), out)


# ------------------------------------------------------------------ through the compiler


@functools.cache
def _policy_compiled(kind: str, io: str, strategy: str, policy_name: str):
    ep = torch.export.export(OutputKindModel(kind, io), inputs_for(io), strict=False)
    return compile_as(POLICIES[policy_name], ep, "eager", strategy)


def test_before_fix_retrace_path_takes_positions_only() -> None:
    module = _policy_compiled("tensor", "real", "retrace", BEFORE_FIX.name)
    x, y = inputs_for("real")
    assert_same_outputs(OutputKindModel("tensor", "real")(x, y), module(x, y))
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):
        module(x=x, y=y)


def test_before_fix_rewrite_path_keeps_keywords_for_interior_regions() -> None:
    module = _policy_compiled("tensor", "real", "rewrite", BEFORE_FIX.name)
    x, y = inputs_for("real")
    assert_same_outputs(OutputKindModel("tensor", "real")(x, y), module(x=x, y=y))


@pytest.mark.parametrize("policy", [BEFORE_FIX.name, FLATTEN_FIX.name])
def test_complex_input_was_positional_only(policy: str) -> None:
    module = _policy_compiled("tensor", "complex_in", "rewrite", policy)
    x, y = inputs_for("complex_in")
    assert [n.name for n in module.graph.nodes if n.op == "placeholder"][0] == "x_unpacked_complex"
    assert_same_outputs(OutputKindModel("tensor", "complex_in")(x, y), module(x, y))
    with pytest.raises(TypeError, match="unexpected keyword argument 'x'"):
        module(x=x, y=y)


@pytest.mark.parametrize("strategy", ["rewrite", "retrace"])
def test_before_fix_returns_a_multi_output_blocks_complex_output_packed_real(strategy: str) -> None:
    module = _policy_compiled("dict", "complex_out", strategy, BEFORE_FIX.name)
    x, y = inputs_for("complex_out")
    out = module(x, y)
    assert out["prod"].dtype == torch.float32 and out["prod"].shape[-1] == 2  # should be complex64


def test_flatten_fix_breaks_a_namedtuple_on_the_retrace_path() -> None:
    module = _policy_compiled("namedtuple", "real", "retrace", FLATTEN_FIX.name)
    with pytest.raises(ValueError, match="`leaves` has length 1 but the spec refers to a pytree that holds 2 items"):
        module(*inputs_for("real"))


def test_dtype_blind_boundary_wraps_eig_twice() -> None:
    x = torch.randn(4, 4)
    module = compile_as(EVERY_COMPLEX_OUTPUT, torch.export.export(Eig(), (x,), strict=False), "eager", "rewrite")
    with pytest.raises(RuntimeError, match="view_as_complex is only supported for half, float and double tensors, "
                       "but got a tensor of scalar type: ComplexFloat"):
        module(x)


def test_matrix_reproduces_the_old_failures() -> None:
    rows = {row[0]: row[1:] for row in signature_matrix([BEFORE_FIX, FLATTEN_FIX, EVERY_COMPLEX_OUTPUT, FINAL])}
    assert all(cells[-1] == "✓" for cells in rows.values()), rows
    assert rows["interior complex, tensor output"][:2] == ("by position only on the retrace path", "✓")
    assert rows["interior complex, dataclass output"][1] == "✗ ValueError (retrace)"
    assert rows["complex input"][:3] == ("by position only", "by position only", "✓")
    assert rows["complex and real outputs of one block (dict)"][:2] == ("✗ ['prod'] returned real (2, 3, 4, 2)",) * 2
    assert rows["eig in a fallback block (2 complex outputs)"][1:3] == ("✓", "✗ RuntimeError")


def test_unknown_retrace_mode_is_named() -> None:
    with pytest.raises(ValueError, match="unknown retrace mode 'flat'; valid: plain, restore, flatten, swap"):
        retrace(torch.export.export(Real("dict"), XY, strict=False).module(), list(XY), "flat")


def test_policies_are_the_shipped_pass_list_with_old_passes_swapped_in() -> None:
    """The shipped pipeline holds no switch for the old behaviours: each historical policy
    is :data:`PASSES` with named passes replaced (and the whole-program check, which the
    old pipelines lacked, left out)."""
    assert FINAL.pass_names() == [p.__name__ for p in PASSES]
    before = BEFORE_FIX.pass_names()
    assert before[before.index("lower_complex") + 1] == "retrace_through_codegen_plain"
    assert {"unpack_block_calls_only", "pack_complex_inputs_renamed", "codegen_from_placeholder_names"} <= set(before)
    assert not {"unpack_complex_outputs", "pack_complex_inputs", "keep_exported_signature"} & set(before)
    assert "unpack_every_complex_output" in EVERY_COMPLEX_OUTPUT.pass_names()
    with pytest.raises(ValueError, match=r"no shipped pass named \['lower'\]"):
        substituted({"lower": PASSES[0]})


def test_the_pipeline_before_the_guards_is_a_policy_on_the_same_passes() -> None:
    """The sweep's reproductions re-enact their old pipeline the same way: shipped passes
    dropped, and the partition and build on the bare engine."""
    from tetrt_support.zoo.reproductions import BEFORE_THE_GUARDS

    names = BEFORE_THE_GUARDS.pass_names()
    guards = {"functionalize_view_writes", "keep_reference_blocks", "check_engine_blocks", "check_whole_program"}
    assert not guards & set(names)
    assert {"partition_into_blocks_on_the_bare_engine", "build_engine_blocks_on_the_bare_engine"} <= set(names)
    assert len(names) == len(PASSES) - len(guards)
    with pytest.raises(ValueError, match=r"no shipped pass named \['functionalize'\]"):
        substituted({}, drop=("functionalize",))
