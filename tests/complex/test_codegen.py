"""retrace_preserving_signature: a make_fx retrace that keeps ep.module()'s signature."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.graph import _PyTreeCodeGen
from torch.utils import _pytree as pytree

from tests.complex.complex_testing import export
from tests.models import DC, NT, register_case_dataclass
from tetrt_support.complex import restore_signature, retrace_preserving_signature

register_case_dataclass()  # Outputs("dataclass") returns a DC


class Outputs(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor) -> object:
        y = (x + bias).reshape(1, 4)
        z = y * 2
        return {
            "tensor": lambda: y,
            "dict": lambda: {"y": y, "z": z},
            "namedtuple": lambda: NT(y, z),
            "dataclass": lambda: DC(y, z),
            "nested": lambda: {"a": (y, [z]), "b": DC(z, y)},
        }[self.kind]()


def _flat_inputs(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    return [torch.randn(p.meta["val"].shape) for p in gm.graph.find_nodes(op="placeholder")]


@pytest.mark.parametrize("kind", ["tensor", "dict", "namedtuple", "dataclass", "nested"])
def test_retrace_keeps_keywords_and_output_pytree(kind: str) -> None:
    x, bias = torch.randn(4), torch.randn(4)
    gm = export(Outputs(kind), (x,), kwargs={"bias": bias}).module()
    expected = gm(x, bias=bias)
    retraced = retrace_preserving_signature(gm, lambda flat: make_fx(flat)(*_flat_inputs(flat)))
    assert retraced is not gm
    got = retraced(x, bias=bias)
    assert type(got) is type(expected)
    assert pytree.tree_structure(got) == pytree.tree_structure(expected)
    torch.testing.assert_close(pytree.tree_leaves(got), pytree.tree_leaves(expected))
    assert [p.name for p in retraced.graph.find_nodes(op="placeholder")] == ["x", "bias"]
    # the input module got its own pytree codegen back and still takes keywords
    assert isinstance(gm.graph._codegen, _PyTreeCodeGen)
    torch.testing.assert_close(pytree.tree_leaves(gm(x, bias=bias)), pytree.tree_leaves(expected))


def test_retrace_through_the_pytree_codegen_loses_the_signature() -> None:
    """Why the codegen swap is needed: a plain make_fx of ep.module()
    takes only positional flat arguments, and make_fx records the dataclass output as one
    node, so putting the out_spec back over that graph cannot rebuild the output."""
    x, bias = torch.randn(4), torch.randn(4)
    gm = export(Outputs("dataclass"), (x,), kwargs={"bias": bias}).module()
    gm.validate_inputs = False
    naive = make_fx(gm)(x, bias)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bias'"):
        naive(x, bias=bias)
    wrong = copy.deepcopy(naive)
    (out,) = wrong.graph.find_nodes(op="output")
    assert not isinstance(out.args[0], (tuple, list)) or len(out.args[0]) == 1  # one node for the dataclass
    wrong.graph.set_codegen(copy.copy(gm.graph._codegen))
    wrong.recompile()
    with pytest.raises((TypeError, ValueError)):
        wrong(x, bias=bias)


def test_restore_signature_rejects_a_different_number_of_inputs() -> None:
    gm = export(Outputs("tensor"), (torch.randn(4),), kwargs={"bias": torch.randn(4)}).module()
    other = make_fx(lambda a: a * 2)(torch.randn(4))
    with pytest.raises(ValueError, match=r"original graph has 2 placeholders \(\['x', 'bias'\]\), the retraced one 1"):
        restore_signature(gm, other)
