"""The Llama-3-style training decoder: shapes, Linear names, GQA, RoPE, causality, training."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from tetrt_support.zoo.decoder import (
    PRESETS,
    Decoder,
    DecoderConfig,
    apply_rope,
    decoder_config,
    linear_names,
    rope_tables,
)

TINY = decoder_config("tiny")


def _batch(config: DecoderConfig, batch: int = 2, seq: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab, (batch, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def test_every_projection_is_a_bias_free_linear_seven_per_block_then_lm_head() -> None:
    model = Decoder(TINY)
    names = linear_names(model)
    per_block = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up", "mlp.down")
    assert names == [f"layers.{i}.{p}" for i in range(TINY.layers) for p in per_block] + ["lm_head"]
    assert len(names) == 7 * TINY.layers + 1
    assert all(model.get_submodule(n).bias is None for n in names)


def test_grouped_query_attention_shapes() -> None:
    c = TINY
    attn = Decoder(c).layers[0].attn
    assert (c.heads, c.kv_heads, c.head_dim) == (4, 2, 16)
    assert attn.q.weight.shape == (c.heads * c.head_dim, c.hidden)
    assert attn.k.weight.shape == attn.v.weight.shape == (c.kv_heads * c.head_dim, c.hidden)
    assert attn.o.weight.shape == (c.hidden, c.heads * c.head_dim)
    x = torch.randn(2, 8, c.hidden)
    cos, sin = rope_tables(c.head_dim, 8, c.rope_theta)
    assert attn(x, cos, sin).shape == (2, 8, c.hidden)


def test_enable_gqa_and_repeat_interleave_agree() -> None:
    a = Decoder(TINY.replace(gqa="repeat_interleave"), seed=3)
    b = Decoder(TINY.replace(gqa="enable_gqa"), seed=3)
    ids, _ = _batch(TINY)
    torch.testing.assert_close(a(ids), b(ids), rtol=1e-5, atol=1e-5)


def test_multi_head_attention_without_groups() -> None:
    config = decoder_config("tiny_mha")
    ids, labels = _batch(config, seq=8)
    assert torch.isfinite(Decoder(config)(ids, labels))


def test_logits_and_loss() -> None:
    model = Decoder(TINY)
    ids, labels = _batch(TINY)
    logits = model(ids)
    assert logits.shape == (2, 16, TINY.vocab)
    loss = model(ids, labels)
    assert loss.shape == () and torch.isfinite(loss)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, TINY.vocab), labels.reshape(-1)))
    assert abs(loss.item() - math.log(TINY.vocab)) < 1.0  # near uniform at init


def test_attention_is_causal() -> None:
    model = Decoder(TINY)
    ids, _ = _batch(TINY)
    changed = ids.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % TINY.vocab
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, :10], model(changed)[:, :10])
        assert not torch.allclose(model(ids)[:, 10:], model(changed)[:, 10:])


def test_rope_is_identity_at_position_zero_and_keeps_norms() -> None:
    cos, sin = rope_tables(32, 16, 10000.0)
    x = torch.randn(1, 2, 16, 32)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_weights_follow_the_seed() -> None:
    a, b, c = Decoder(TINY, seed=1), Decoder(TINY, seed=1), Decoder(TINY, seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name


def test_deep_copy_and_dtype_keep_the_model() -> None:
    model = Decoder(TINY, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.rope_cos.dtype == torch.float32  # the tables stay fp32, cast per call
    ids, labels = _batch(TINY)
    twin = copy.deepcopy(model)
    torch.testing.assert_close(model(ids, labels), twin(ids, labels))


def test_forward_backward_and_adamw_lower_the_loss() -> None:
    model = Decoder(TINY)
    ids, labels = _batch(TINY, seq=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        loss = model(ids, labels)
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses


def test_presets_and_config_checks() -> None:
    big = PRESETS["llama3_8b_width"]
    assert (big.hidden, big.heads, big.kv_heads, big.ffn, big.vocab, big.head_dim) == (4096, 32, 8, 14336, 32000, 128)
    small = PRESETS["1b_width"]
    assert (small.hidden, small.heads, small.kv_heads, small.ffn, small.vocab, small.head_dim) == (2048, 16, 8, 8192, 32000, 128)
    assert decoder_config("llama3_8b_width", layers=4).layers == 4
    with pytest.raises(KeyError, match="unknown decoder preset"):
        decoder_config("nope")
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        TINY.replace(kv_heads=3)
    with pytest.raises(ValueError, match="gqa"):
        TINY.replace(gqa="other")
    with pytest.raises(ValueError, match="max_seq"):
        Decoder(TINY.replace(max_seq=8))(torch.zeros(1, 9, dtype=torch.long))
