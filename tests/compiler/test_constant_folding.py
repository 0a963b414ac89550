"""``fold_constants``: what it folds, what it must leave live, and that results do not change."""

from __future__ import annotations

import torch

from tetrt_support import zoo
from tetrt_support.compiler.constant_folding import FOLDED_PREFIX, fold_constants, mutated_attributes
from tetrt_support.complex import lower


def _lowered_rope(strategy: str, seq: int = 16) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    rope = zoo.ComplexRoPE(head_dim=32, max_seq_len=2 * seq).eval()
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, seq, 3, 32, generator=g) for _ in range(2))
    return lower(torch.export.export(rope, (q, k), strict=False), strategy=strategy), (q, k)


def _folded(gm: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    return {n: b for n, b in gm.named_buffers() if n.startswith(FOLDED_PREFIX)}


def test_rope_frequencies_become_two_contiguous_planes_and_results_are_unchanged() -> None:
    for strategy in ("rewrite", "retrace"):
        gm, inputs = _lowered_rope(strategy)
        folded = fold_constants(gm)
        planes = _folded(folded)
        # q and k read the same real and imaginary planes: two tensors, not four
        assert sorted(planes) == [f"{FOLDED_PREFIX}0", f"{FOLDED_PREFIX}1"], strategy
        assert all(p.is_contiguous() and p._base is None for p in planes.values())
        packed = gm.get_buffer("freqs_cis")[:16]
        assert {tuple(p.flatten().tolist()) for p in planes.values()} == {
            tuple(packed[..., 0].flatten().tolist()), tuple(packed[..., 1].flatten().tolist())}
        assert not any(n.op == "get_attr" and n.target == "freqs_cis" for n in folded.graph.nodes)
        for expected, got in zip(gm(*inputs), folded(*inputs)):
            assert torch.equal(expected, got)


def test_the_callers_module_is_not_changed() -> None:
    gm, inputs = _lowered_rope("rewrite")
    code, nodes, buffers = gm.code, len(gm.graph.nodes), dict(gm.named_buffers())
    fold_constants(gm)
    assert gm.code == code and len(gm.graph.nodes) == nodes
    assert dict(gm.named_buffers()).keys() == buffers.keys()
    assert not _folded(gm)


class _Counter(torch.nn.Module):
    """A buffer the forward updates: what is computed from it is not a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(4))
        self.register_buffer("table", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1.0)
        return x * (self.steps * 2.0) + self.table.exp()


def test_a_mutated_buffer_is_not_folded_and_the_update_still_happens() -> None:
    program = torch.export.export(_Counter(), (torch.ones(4),), strict=False)
    module = program.module()
    assert mutated_attributes(module) == {"steps"}
    folded = fold_constants(program.module())
    # table.exp() folds; steps * 2 must not
    assert len(_folded(folded)) == 1
    for step in (1.0, 2.0, 3.0):  # each call sees the buffer the previous one updated
        assert torch.equal(folded(torch.ones(4)), 2.0 * step + torch.arange(4.0).exp())
    assert torch.equal(folded.get_buffer("steps"), torch.full((4,), 3.0))


def test_a_slice_by_a_symbolic_length_is_not_folded() -> None:
    rope = zoo.ComplexRoPE(head_dim=32, max_seq_len=64).eval()
    q, k = torch.randn(2, 16, 3, 32), torch.randn(2, 16, 3, 32)
    seq = torch.export.Dim("seq", min=2, max=64)
    program = torch.export.export(rope, (q, k), dynamic_shapes=({1: seq}, {1: seq}), strict=False)
    gm = lower(program, strategy="rewrite")
    folded = fold_constants(gm)
    assert not _folded(folded)  # the frequencies depend on the input's length
    for length in (5, 40):
        q2, k2 = torch.randn(2, length, 3, 32), torch.randn(2, length, 3, 32)
        for a, b in zip(gm(q2, k2), folded(q2, k2)):
            assert torch.equal(a, b)


class _Broadcasts(torch.nn.Module):
    """A table broadcast over the batch, and a transposed weight: folding must not grow either."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(16.0).reshape(4, 4))
        self.weight = torch.nn.Parameter(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.table.exp().expand(8, 4, 4) + x @ self.weight.t()


def test_a_broadcast_value_is_stored_once_and_a_transposed_weight_is_not_copied() -> None:
    model = _Broadcasts()
    x = torch.randn(8, 4, 4)
    folded = fold_constants(torch.export.export(model, (x,), strict=False).module())
    stored = _folded(folded)
    assert sorted(tuple(t.shape) for t in stored.values()) == [(1, 4, 4), (4, 4)]
    transposed = next(t for t in stored.values() if t.shape == (4, 4))
    assert transposed.untyped_storage().data_ptr() == model.weight.untyped_storage().data_ptr()  # a view
    assert any(n.target is torch.ops.aten.expand.default for n in folded.graph.nodes)  # expanded in the graph
    assert torch.equal(folded(x), model(x))


def test_the_recipe_computes_the_folded_values_again_and_a_second_folding_is_refused() -> None:
    import pytest

    from tetrt_support.compiler.constant_folding import FOLDED_KEY

    gm, _ = _lowered_rope("rewrite")
    folded = fold_constants(gm)
    recipe = folded.meta[FOLDED_KEY]
    assert recipe.sources() == ["freqs_cis"] and recipe.names == sorted(_folded(folded))
    again = recipe.evaluate()
    assert all(torch.equal(again[name], value) and again[name].is_contiguous() for name, value in _folded(folded).items())
    with pytest.raises(ValueError, match="folded already"):
        fold_constants(folded)
    nothing = torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),)).module()
    assert FOLDED_KEY not in fold_constants(nothing).meta  # nothing folded: no recipe


def test_the_compile_pipeline_folds_rope_frequencies_into_contiguous_planes() -> None:
    import tetrt_support

    rope = zoo.ComplexRoPE(head_dim=32, max_seq_len=32).eval()
    q, k = torch.randn(2, 16, 3, 32), torch.randn(2, 16, 3, 32)
    compiled = tetrt_support.compile(rope, arg_inputs=(q, k), backend="eager")
    (block,) = [compiled.get_submodule(b.name) for b in compiled.blocks() if b.kind == "engine"]
    graphs = [m for m in block.modules() if isinstance(m, torch.fx.GraphModule)]
    attrs = {str(n.target): m.get_buffer(str(n.target)) for m in graphs for n in m.graph.nodes if n.op == "get_attr"}
    assert attrs and all(a.startswith(FOLDED_PREFIX) for a in attrs)  # freqs_cis itself is not read
    assert all(t.is_contiguous() for t in attrs.values())  # no stride-2 reads of the packed planes
    for expected, got in zip(rope(q, k), compiled(q, k)):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
