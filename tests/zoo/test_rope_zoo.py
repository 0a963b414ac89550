"""The model zoo: every entry runs, exports, and holds exactly the complex ops it claims."""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tetrt_support import zoo

COMPLEX_OPS = ("aten.polar.default", "aten.view_as_complex.default", "aten.view_as_real.default")


def _complex_op_counts(program: torch.export.ExportedProgram) -> dict[str, int]:
    counts = collections.Counter(
        f"aten.{n.target._schema.name.split('::')[-1]}.{n.target._overloadname}"
        for n in program.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    )
    return {op: counts[op] for op in COMPLEX_OPS if counts[op]}


def _complex_valued(program: torch.export.ExportedProgram) -> int:
    return sum(
        1
        for n in program.graph.nodes
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_complex()
    )


#: the registry's RoPE models (the Hugging Face families are tested in test_hf_families)
ROPE_MODELS = [name for name, entry in zoo.ZOO.items() if entry.module is None]

EXPECTED = {
    "complex_rope": {"aten.view_as_complex.default": 2, "aten.view_as_real.default": 2},
    "complex_rope_polar": {"aten.polar.default": 1, "aten.view_as_complex.default": 2, "aten.view_as_real.default": 2},
    "rope_attention": {"aten.view_as_complex.default": 2, "aten.view_as_real.default": 2},
    "rotate_half_rope": {},
    # HF Llama 4 (tiny config, 2 layers): the rotary embedding is built once with polar, then
    # view_as_complex / view_as_real around q and k in each layer.
    "llama4": {"aten.polar.default": 1, "aten.view_as_complex.default": 4, "aten.view_as_real.default": 4},
    "llama4_moe": {"aten.polar.default": 1, "aten.view_as_complex.default": 4, "aten.view_as_real.default": 4},
}


def test_every_zoo_entry_has_an_expectation() -> None:
    assert set(EXPECTED) == set(ROPE_MODELS)


@pytest.mark.parametrize("name", ROPE_MODELS)
def test_export_matches_eager_and_has_the_expected_complex_ops(name: str) -> None:
    model = zoo.build_model(name)
    program, args, kwargs = zoo.export_model(name, model=model)
    assert _complex_op_counts(program) == EXPECTED[name]
    assert (_complex_valued(program) > 0) == zoo.ZOO[name].has_complex
    with torch.no_grad():
        want, got = model(*args, **kwargs), program.module()(*args, **kwargs)
    for w, g in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["complex_rope", "rope_attention", "llama4"])
def test_dynamic_export_accepts_other_batch_and_sequence_sizes(name: str) -> None:
    model = zoo.build_model(name)
    program, _, _ = zoo.export_model(name, model=model, dynamic=True)
    args, kwargs = zoo.example_inputs(name, model, batch=3, seq=11, seed=1)
    with torch.no_grad():
        want, got = model(*args, **kwargs), program.module()(*args, **kwargs)
    for w, g in zip(torch.utils._pytree.tree_leaves(want), torch.utils._pytree.tree_leaves(got)):
        torch.testing.assert_close(g, w)


def test_complex_buffer_is_a_non_persistent_complex_constant() -> None:
    program, _, _ = zoo.export_model("complex_rope")
    assert "freqs_cis" not in zoo.build_model("complex_rope").state_dict()
    complex_constants = {k for k, v in program.constants.items() if isinstance(v, torch.Tensor) and v.is_complex()}
    assert complex_constants == {"freqs_cis"}


def test_llama4_is_tiny_random_and_returns_a_model_output() -> None:
    from transformers.utils import ModelOutput

    model = zoo.tiny_llama4(num_layers=2, with_moe=False, seed=0)
    assert not model.training
    assert model.config.hidden_size == 64 and model.config.vocab_size == 128
    assert sum(p.numel() for p in model.parameters()) < 200_000
    program, _, kwargs = zoo.export_llama4(model, batch=2, seq=8)
    assert set(kwargs) == {"input_ids"} and kwargs["input_ids"].shape == (2, 8)
    out = program.module()(**kwargs)
    assert isinstance(out, ModelOutput) and out.logits.shape == (2, 8, 128)
    # Same seed, same weights; another seed, other weights.
    same, other = zoo.tiny_llama4(seed=0), zoo.tiny_llama4(seed=1)
    assert torch.equal(same.lm_head.weight, model.lm_head.weight)
    assert not torch.equal(other.lm_head.weight, model.lm_head.weight)


def test_llama4_moe_has_experts_and_every_fourth_layer_has_no_rope() -> None:
    model = zoo.tiny_llama4(num_layers=4, with_moe=True)
    assert model.config.moe_layers == [0, 1, 2, 3]
    assert model.config.no_rope_layers == [1, 1, 1, 0]
    program, _, _ = zoo.export_llama4(model)
    # 3 RoPE layers x (q, k).
    assert _complex_op_counts(program)["aten.view_as_complex.default"] == 6


def test_llama4_sizes_override_the_tiny_ones_and_a_misspelt_size_raises() -> None:
    config = zoo.llama4_config(4, hidden_size=128, num_attention_heads=2, head_dim=64, vocab_size=256)
    assert (config.hidden_size, config.num_attention_heads, config.head_dim, config.vocab_size) == (128, 2, 64, 256)
    assert config.intermediate_size_mlp == zoo.LLAMA4_TINY_SIZES["intermediate_size_mlp"]
    assert config.moe_layers == [] and config.num_hidden_layers == 4
    model = zoo.tiny_llama4(1, hidden_size=128, num_attention_heads=2, head_dim=64)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (128, 128)
    with pytest.raises(TypeError, match=r"unknown sizes \['hidden'\]; valid: vocab_size, hidden_size"):
        zoo.llama4_config(hidden=128)


def test_the_registry_refuses_a_name_twice_and_is_read_only() -> None:
    entry = zoo.ZOO["complex_rope"]
    with pytest.raises(ValueError, match="zoo model 'complex_rope' is already registered"):
        zoo.register_model(entry)
    with pytest.raises(TypeError):
        zoo.ZOO["other"] = entry  # type: ignore[index]
    assert {"fnet", "wavtokenizer"} <= set(zoo.hf_families()) and not set(zoo.hf_families()) & set(ROPE_MODELS)


def test_unknown_names_and_bad_sizes_are_rejected() -> None:
    with pytest.raises(KeyError, match="unknown zoo model 'llama5'"):
        zoo.build_model("llama5")
    with pytest.raises(ValueError, match="rotary dim must be even"):
        zoo.precompute_freqs_cis(7, 4)
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        zoo.tiny_llama4(num_layers=0)
    with pytest.raises(ValueError, match=r"dynamic export needs 2 <= seq <= 64, got seq=1"):
        zoo.export_model("complex_rope", seq=1, dynamic=True)


def test_precompute_freqs_cis_is_unit_rotations_at_position_times_frequency() -> None:
    freqs = zoo.precompute_freqs_cis(8, 5, theta=100.0)
    assert freqs.dtype == torch.complex64 and freqs.shape == (5, 4)
    torch.testing.assert_close(freqs.abs(), torch.ones(5, 4))
    inv = 100.0 ** (-torch.arange(0, 8, 2) / 8)
    torch.testing.assert_close(freqs.angle()[3], torch.remainder(3 * inv + torch.pi, 2 * torch.pi) - torch.pi)


@given(
    half_dim=st.integers(1, 8),
    seq=st.integers(1, 12),
    theta=st.sampled_from([10.0, 10000.0, 500000.0]),
    seed=st.integers(0, 2**16),
)
def test_complex_rope_equals_rotate_half_rope_after_the_layout_permutation(half_dim: int, seq: int, theta: float, seed: int) -> None:
    """Meta's complex RoPE on interleaved pairs IS HF's rotate-half RoPE on half-split pairs."""
    dim = 2 * half_dim
    complex_rope = zoo.ComplexRoPE(dim, max_seq_len=seq, theta=theta)
    rotate_half_rope = zoo.RotateHalfRoPE(dim, max_seq_len=seq, theta=theta)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, seq, 3, dim, generator=g), torch.randn(2, seq, 3, dim, generator=g)
    cq, ck = complex_rope(q, k)
    hq, hk = rotate_half_rope(zoo.interleaved_to_half(q), zoo.interleaved_to_half(k))
    torch.testing.assert_close(zoo.interleaved_to_half(cq), hq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(zoo.interleaved_to_half(ck), hk, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(zoo.half_to_interleaved(zoo.interleaved_to_half(q)), q, rtol=0, atol=0)


def test_polar_variant_computes_the_same_rotation_as_the_buffer_variant() -> None:
    args, _ = zoo.example_inputs("complex_rope", zoo.build_model("complex_rope"), batch=2, seq=9)
    torch.testing.assert_close(zoo.ComplexRoPEPolar()(*args), zoo.ComplexRoPE()(*args))


def test_rope_attention_takes_its_mask_by_keyword_only() -> None:
    model = zoo.build_model("rope_attention")
    (hidden,), kwargs = zoo.example_inputs("rope_attention", model, batch=2, seq=6)
    with torch.no_grad():
        causal_default = model(hidden)
        causal_explicit = model(hidden, **kwargs)
        full = model(hidden, attention_mask=torch.ones_like(kwargs["attention_mask"]))
    torch.testing.assert_close(causal_explicit, causal_default)
    assert not torch.allclose(full, causal_default)
    with pytest.raises(TypeError, match="positional argument"):
        model(hidden, kwargs["attention_mask"])
