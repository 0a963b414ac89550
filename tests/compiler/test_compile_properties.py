"""Property: any nesting of tuples, lists and dicts over real and complex outputs comes back
from the compiled module exactly as from the model, by keyword, on both strategies."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree
from hypothesis import given, settings
from hypothesis import strategies as st

import tetrt_support
from tests.assertions import assert_same_outputs
from tests.strategies import complex_tensors, examples, finite_floats, tensors

# A structure is a leaf name ("z": the complex product, "r": it packed real, "m": its
# magnitude, "x" / "y": an input returned as is) or a tuple / list / dict of structures.
LEAVES = st.sampled_from(["z", "r", "m", "x", "y"])
STRUCTURES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(tuple),
        st.lists(inner, min_size=1, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, min_size=1, max_size=3),
    ),
    max_leaves=5,
)


class Structured(torch.nn.Module):
    def __init__(self, structure: Any) -> None:
        super().__init__()
        self.structure = structure

    def _build(self, s: Any, leaves: dict[str, torch.Tensor]) -> Any:
        if isinstance(s, str):
            return leaves[s]
        if isinstance(s, dict):
            return {k: self._build(v, leaves) for k, v in s.items()}
        return type(s)(self._build(v, leaves) for v in s)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        z = x * torch.view_as_complex(y)
        return self._build(self.structure, {"z": z, "r": torch.view_as_real(z) * 2, "m": z.abs(), "x": x, "y": y})


INPUTS = st.tuples(complex_tensors((2, 3), bound=2.0), tensors((2, 3, 2), elements=finite_floats(bound=2.0)))


@settings(max_examples=examples(12))
@given(structure=STRUCTURES, strategy=st.sampled_from(["rewrite", "retrace"]), example=INPUTS, fresh=INPUTS)
def test_any_output_structure_survives_compile(structure: Any, strategy: str, example: tuple, fresh: tuple) -> None:
    x, y = example
    model = Structured(structure)
    ep = torch.export.export(model, (x, y), strict=False)
    module = tetrt_support.compile(ep, backend="eager", strategy=strategy)
    x2, y2 = fresh
    assert_same_outputs(model(x2, y2), module(y=y2, x=x2))
    computes = bool({"z", "r", "m"} & set(pytree.tree_leaves(structure)))
    expected_blocks = "1 engine block" if computes else "0 engine blocks"
    assert module.blocks_summary() == f"{expected_blocks}, 0 fallback blocks"
