"""``refit_module_weights``: new weights go into every engine and fallback block without
rebuilding anything, and the refitted module computes what a fresh compile of the new
weights computes; a different architecture raises naming the first differing key."""

from __future__ import annotations

import functools

import pytest
import torch

import tetrt_support
from tests.assertions import assert_same_outputs
from tetrt_support import zoo
from tetrt_support.compiler.refit import ArchitectureMismatch


class ComplexWeights(torch.nn.Module):
    """A complex parameter (lowered to its [..., 2] view), a complex buffer, a complex op
    without a rule (cumsum: a fallback block holding a weight) and a real Linear."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.gain = torch.nn.Parameter(torch.randn(4, 8, generator=g, dtype=torch.complex64))
        self.register_buffer("phase", torch.polar(torch.ones(8), torch.randn(8, generator=g)))
        self.tail = torch.nn.Parameter(torch.randn(8, generator=g, dtype=torch.complex64))
        self.out = torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.out.weight.copy_(torch.randn(4, 16, generator=g))
            self.out.bias.copy_(torch.randn(4, generator=g))

    def forward(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        rotated = z * self.gain * self.phase
        summed = torch.cumsum(rotated, dim=-1) * self.tail
        return {"z": summed, "y": self.out(torch.view_as_real(summed).flatten(-2)).tanh()}


def _z(seed: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.complex64)


@functools.cache
def _complex_compiled(backend: str):
    return tetrt_support.compile(ComplexWeights(seed=0).eval(), arg_inputs=(_z(0),), backend=backend, min_block_size=1)


def _fingerprint(module) -> list[tuple[str, str, tuple[str, ...], str]]:
    """Each block's name, kind and ops, and the class of an engine block's module."""
    return [(b.name, b.kind, b.ops, b.runner if b.kind == "engine" else "PyTorch") for b in module.blocks()]


@pytest.mark.parametrize("backend", ["onnxruntime", "eager"])
def test_refit_of_complex_parameters_matches_a_fresh_compile(backend: str) -> None:
    compiled = _complex_compiled(backend)
    kinds = [b.kind for b in compiled.blocks()]
    assert "engine" in kinds and "fallback" in kinds  # weights in both kinds of block
    new = ComplexWeights(seed=1).eval()
    refitted = tetrt_support.refit_module_weights(compiled, new)
    fresh = tetrt_support.compile(new, arg_inputs=(_z(0),), backend=backend, min_block_size=1)
    assert _fingerprint(refitted) == _fingerprint(compiled) == _fingerprint(fresh)
    for seed in (2, 3):
        assert_same_outputs(fresh(_z(seed)), refitted(_z(seed)), atol=1e-6)
        assert_same_outputs(new(_z(seed)), refitted(_z(seed)))
    # the default is a refitted copy; the compiled module keeps its weights
    assert_same_outputs(ComplexWeights(seed=0)(_z(2)), compiled(_z(2)))


def test_refit_keeps_the_onnx_runtime_engines_it_was_built_with() -> None:
    compiled = _complex_compiled("onnxruntime")
    engines = {b.name for b in compiled.blocks() if b.kind == "engine"}
    before = {name: compiled.get_submodule(name).engine_block.model_bytes for name in engines}
    refitted = tetrt_support.refit_module_weights(compiled, ComplexWeights(seed=1).state_dict())
    after = {name: refitted.get_submodule(name).engine_block.model_bytes for name in engines}
    assert after == before  # the same ONNX models: only the weight inputs changed
    packed = refitted.get_submodule(sorted(engines)[0]).weight_values()
    assert all(not w.is_complex() for w in packed)  # complex weights fed as their [..., 2] view


@pytest.mark.parametrize("source", ["state_dict", "module", "exported_program"])
def test_refit_takes_a_state_dict_a_module_or_an_exported_program(source: str) -> None:
    compiled = _complex_compiled("eager")
    new = ComplexWeights(seed=4).eval()
    weights = {
        "state_dict": new.state_dict(),
        "module": new,
        "exported_program": torch.export.export(new, (_z(0),), strict=False),
    }[source]
    assert_same_outputs(new(_z(5)), tetrt_support.refit_module_weights(compiled, weights)(_z(5)))


def test_refit_in_place_changes_the_compiled_module_only() -> None:
    model = ComplexWeights(seed=0).eval()
    compiled = tetrt_support.compile(model, arg_inputs=(_z(0),), backend="eager", min_block_size=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    new = ComplexWeights(seed=6).eval()
    assert tetrt_support.refit_module_weights(compiled, new, in_place=True) is compiled
    assert_same_outputs(new(_z(7)), compiled(_z(7)))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the source model untouched


def test_a_different_architecture_raises_naming_the_first_differing_key() -> None:
    compiled = _complex_compiled("eager")
    weights = ComplexWeights(seed=1).state_dict()
    wrong_shape = {**weights, "out.weight": torch.zeros(4, 15)}
    with pytest.raises(ArchitectureMismatch, match=r"'out.weight': the compiled module has shape \[4, 16\] and dtype "
                       r"torch.float32, the new weights have shape \[4, 15\]"):
        tetrt_support.refit_module_weights(compiled, wrong_shape)
    missing = {k: v for k, v in weights.items() if k != "tail"}
    with pytest.raises(ArchitectureMismatch, match="the new weights have no 'tail'"):
        tetrt_support.refit_module_weights(compiled, missing)
    extra = {**weights, "head.weight": torch.zeros(2)}
    with pytest.raises(ArchitectureMismatch, match="the new weights have 'head.weight', which the compiled module"):
        tetrt_support.refit_module_weights(compiled, extra)
    real_gain = {**weights, "gain": torch.zeros(4, 8)}
    with pytest.raises(ArchitectureMismatch, match="'gain': .* dtype torch.complex64, the new weights .* dtype torch.float32"):
        tetrt_support.refit_module_weights(compiled, real_gain)


def test_refit_of_llama4_matches_a_fresh_compile() -> None:
    old, new = zoo.tiny_llama4(seed=0).eval(), zoo.tiny_llama4(seed=1).eval()
    ids = zoo.llama4_example_inputs(old)
    compiled = tetrt_support.compile(old, kwarg_inputs=ids)
    refitted = tetrt_support.refit_module_weights(compiled, new.state_dict())
    fresh = tetrt_support.compile(new, kwarg_inputs=ids)
    assert _fingerprint(refitted) == _fingerprint(compiled) == _fingerprint(fresh)
    other = zoo.llama4_example_inputs(old, seed=2)
    torch.testing.assert_close(refitted(**other).logits, fresh(**other).logits, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(refitted(**other).logits, new(**other).logits, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(refitted(**other).logits, compiled(**other).logits, atol=1e-3)


def test_refit_refuses_modules_it_did_not_compile() -> None:
    with pytest.raises(TypeError, match="takes a module made by tetrt_support.compile, got Linear"):
        tetrt_support.refit_module_weights(torch.nn.Linear(2, 2), {})


def test_refit_in_place_reaches_an_inductor_compiled_block() -> None:
    # the inductor block has compiled its graph already: the refit must still be seen
    model, new = ComplexWeights(seed=0).eval(), ComplexWeights(seed=8).eval()
    compiled = tetrt_support.compile(model, arg_inputs=(_z(0),), backend="inductor", min_block_size=1)
    assert_same_outputs(model(_z(1)), compiled(_z(1)))
    tetrt_support.refit_module_weights(compiled, new, in_place=True)
    assert_same_outputs(new(_z(1)), compiled(_z(1)))


def test_refit_computes_again_what_the_compile_folded_from_the_weights() -> None:
    # RoPE's frequencies are folded into real and imaginary planes at compile time; new
    # frequencies must reach them, or the refitted module would rotate by the old angles.
    from tetrt_support.compiler.constant_folding import FOLDED_KEY

    old, new = zoo.ComplexRoPE(head_dim=32, max_seq_len=32).eval(), zoo.ComplexRoPE(head_dim=32, max_seq_len=32, theta=50.0).eval()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 16, 3, 32, generator=g), torch.randn(2, 16, 3, 32, generator=g)
    compiled = tetrt_support.compile(old, arg_inputs=(q, k), min_block_size=1)
    assert compiled.meta[FOLDED_KEY].sources() == ["freqs_cis"]
    refitted = tetrt_support.refit_module_weights(compiled, new)
    assert_same_outputs(new(q, k), refitted(q, k), atol=1e-5)
    assert not torch.allclose(refitted(q, k)[0], compiled(q, k)[0], atol=1e-3)
    # freqs_cis is a non-persistent buffer: a state dict leaves it out (this one is empty),
    # and what was folded from it keeps the values of the refit before
    assert old.state_dict() == {}
    assert_same_outputs(new(q, k), tetrt_support.refit_module_weights(refitted, old.state_dict())(q, k), atol=1e-5)
    # in place, twice: the second refit starts from the first one's weights
    tetrt_support.refit_module_weights(compiled, new, in_place=True)
    tetrt_support.refit_module_weights(compiled, {}, in_place=True)
    assert_same_outputs(new(q, k), compiled(q, k), atol=1e-5)
    tetrt_support.refit_module_weights(compiled, old, in_place=True)
    assert_same_outputs(old(q, k), compiled(q, k), atol=1e-5)


class FoldedAndRead(torch.nn.Module):
    """``w`` is read directly and folded from (``exp(w)`` is a constant subgraph)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(seed)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w + x @ torch.exp(self.w)


def _storages_of_w(compiled: torch.nn.Module) -> set[int]:
    """data_ptrs of every tensor the compiled module holds as ``w``: its blocks' and the fold recipe's."""
    from tetrt_support.compiler.constant_folding import FOLDED_KEY
    from tetrt_support.compiler.refit import _owner, _weight_holders

    recipe = compiled.meta[FOLDED_KEY].recipe
    holders = [(root, name) for root, name, _ in _weight_holders(compiled) if name == "w"] + [(recipe, "w")]
    return {getattr(*_owner(root, name)).data_ptr() for root, name in holders}


def test_a_weight_folded_from_and_read_directly_is_held_once_after_refit() -> None:
    model, new = FoldedAndRead(0).eval(), FoldedAndRead(1).eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    compiled = tetrt_support.compile(model, arg_inputs=(x,), backend="inductor", min_block_size=1)
    assert len(_storages_of_w(compiled)) == 1  # the compile shares one tensor
    refitted = tetrt_support.refit_module_weights(compiled, new)
    assert len(_storages_of_w(refitted)) == 1 and _storages_of_w(refitted) != _storages_of_w(compiled)
    assert_same_outputs(new(x), refitted(x), atol=1e-5)
    assert_same_outputs(model(x), compiled(x), atol=1e-5)  # the module refitted from is left as it was
