"""Rotary-embedding models, shared by the notebooks, the tests and the benchmarks.

Tiny, seeded, exportable with ``strict=False``; together they cover how complex numbers
reach an exported ATen graph: :class:`ComplexRoPE` (a complex64 ``freqs_cis`` buffer,
``view_as_complex`` -> ``mul`` -> ``view_as_real``), :class:`ComplexRoPEPolar` (``aten.polar``
in forward), :class:`ComplexRoPEAttention` (keyword input, attention), :class:`RotateHalfRoPE`
(real cos/sin, the contrast) and :func:`tiny_llama4` (transformers' Llama 4 text model from a
tiny config, returning a ``ModelOutput``). :func:`~tetrt_support.zoo.registry.export_model`
exports each by name.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tetrt_support.zoo.registry import MAX_SEQ, ZooEntry, ZooExport, batch_seq_dims, register_model, seeded

__all__ = [
    "ComplexRoPE",
    "ComplexRoPEAttention",
    "ComplexRoPEPolar",
    "LLAMA4_TINY_SIZES",
    "RotateHalfRoPE",
    "apply_complex_rope",
    "apply_rotate_half_rope",
    "export_llama4",
    "half_to_interleaved",
    "interleaved_to_half",
    "llama4_config",
    "llama4_example_inputs",
    "precompute_freqs_cis",
    "rope_inverse_frequencies",
    "rotate_half",
    "tiny_llama4",
]

# Default sizes: small enough for a notebook on two shared cores, big enough to have
# several heads and several frequency pairs.
HEADS = 4
HEAD_DIM = 16
HIDDEN = HEADS * HEAD_DIM
THETA = 10000.0


# --------------------------------------------------------------------------------------
# RoPE math
# --------------------------------------------------------------------------------------


def rope_inverse_frequencies(dim: int, theta: float = THETA) -> torch.Tensor:
    """``theta ** (-2i / dim)`` for ``i < dim // 2``: one rotation speed per pair of features."""
    if dim % 2:
        raise ValueError(f"rotary dim must be even (features are rotated in pairs), got dim={dim}")
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32)[: dim // 2] / dim))


def precompute_freqs_cis(dim: int, end: int, theta: float = THETA) -> torch.Tensor:
    """Llama's ``freqs_cis``: ``exp(i * pos * inv_freq)`` as complex64 of shape ``[end, dim // 2]``.

    Row ``p`` holds the unit complex numbers that rotate each feature pair at position ``p``.
    """
    positions = torch.arange(end, dtype=torch.float32)
    angles = torch.outer(positions, rope_inverse_frequencies(dim, theta))
    return torch.polar(torch.ones_like(angles), angles)


def apply_complex_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved feature pairs ``(x[2i], x[2i+1])`` of ``x[batch, seq, heads, dim]``.

    The pair is read as the complex number ``x[2i] + i x[2i+1]`` and multiplied by
    ``freqs_cis[seq, i]``; this is the exact op sequence of Meta's Llama reference code.
    """
    x_c = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rotated = torch.view_as_real(x_c * freqs_cis[None, :, None, :]).flatten(3)
    return rotated.type_as(x)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF's ``rotate_half``: ``[x1, x2] -> [-x2, x1]`` on the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate half-split feature pairs ``(x[i], x[i + dim/2])`` of ``x[batch, seq, heads, dim]``.

    ``cos``/``sin`` are ``[seq, dim]`` (each frequency repeated for both halves), as in HF Llama.
    """
    return x * cos[None, :, None, :] + rotate_half(x) * sin[None, :, None, :]


def interleaved_to_half(x: torch.Tensor) -> torch.Tensor:
    """Permute the last dim from pairs ``(0,1),(2,3),...`` to halves ``[0,2,4,... | 1,3,5,...]``.

    This is the layout change that turns a Meta (complex, interleaved) checkpoint into an HF
    (rotate-half) one; under it the two RoPE formulations are the same rotation.
    """
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def half_to_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`interleaved_to_half`."""
    first, second = x.chunk(2, dim=-1)
    return torch.stack((first, second), dim=-1).flatten(-2)


# --------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------


class ComplexRoPE(nn.Module):
    """Llama-style complex RoPE on ``q, k`` of shape ``[batch, seq, heads, head_dim]``.

    ``freqs_cis`` is a non-persistent complex64 buffer (not in ``state_dict``; a complex
    constant of the exported program), sliced to the sequence length in forward.
    """

    def __init__(self, head_dim: int = HEAD_DIM, max_seq_len: int = MAX_SEQ, theta: float = THETA) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.register_buffer("freqs_cis", precompute_freqs_cis(head_dim, max_seq_len, theta), persistent=False)

    def forward(self, xq: torch.Tensor, xk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs_cis = self.freqs_cis[: xq.shape[1]]
        return apply_complex_rope(xq, freqs_cis), apply_complex_rope(xk, freqs_cis)


class ComplexRoPEPolar(nn.Module):
    """Complex RoPE whose ``freqs_cis`` is computed in forward: ``aten.polar`` is in the graph.

    This is how HF's Llama 4 builds it (``Llama4TextRotaryEmbedding``); only a real
    ``inv_freq`` buffer is stored.
    """

    def __init__(self, head_dim: int = HEAD_DIM, theta: float = THETA) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.register_buffer("inv_freq", rope_inverse_frequencies(head_dim, theta), persistent=False)

    def forward(self, xq: torch.Tensor, xk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(xq.shape[1], dtype=torch.float32, device=xq.device)
        angles = positions[:, None] * self.inv_freq[None, :]
        freqs_cis = torch.polar(torch.ones_like(angles), angles)
        return apply_complex_rope(xq, freqs_cis), apply_complex_rope(xk, freqs_cis)


class RotateHalfRoPE(nn.Module):
    """HF Llama 1-3 style RoPE: real ``cos``/``sin`` buffers and ``rotate_half``; no complex values.

    With the same frequencies it equals :class:`ComplexRoPE` up to the
    :func:`interleaved_to_half` permutation of the head dim.
    """

    def __init__(self, head_dim: int = HEAD_DIM, max_seq_len: int = MAX_SEQ, theta: float = THETA) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), rope_inverse_frequencies(head_dim, theta))
        emb = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, xq: torch.Tensor, xk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seq = xq.shape[1]
        cos, sin = self.cos_cached[:seq], self.sin_cached[:seq]
        return apply_rotate_half_rope(xq, cos, sin), apply_rotate_half_rope(xk, cos, sin)


class ComplexRoPEAttention(nn.Module):
    """Self-attention with complex RoPE on q and k, called with a keyword-only mask.

    ``forward(hidden_states, *, attention_mask=None)``: ``hidden_states`` is
    ``[batch, seq, hidden]``; ``attention_mask`` (bool ``[batch, 1, seq, seq]``, True = attend)
    replaces the default causal mask when given. The keyword-only input is the point: a
    compiled module must still accept it by name.
    """

    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS, max_seq_len: int = MAX_SEQ, theta: float = THETA) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
        self.heads = heads
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.rope = ComplexRoPE(self.head_dim, max_seq_len, theta)

    def forward(self, hidden_states: torch.Tensor, *, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, _ = hidden_states.shape
        shape = (batch, seq, self.heads, self.head_dim)
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        v = self.v_proj(hidden_states).view(shape)
        q, k = self.rope(q, k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


# --------------------------------------------------------------------------------------
# Hugging Face Llama 4 (text), tiny and random
# --------------------------------------------------------------------------------------


def _llama4_classes() -> tuple[Any, Any]:
    """``(Llama4TextConfig, Llama4ForCausalLM)``, imported on first use (transformers is slow to import).

    transformers imports ``tqdm.auto``, which warns "IProgress not found" in a Jupyter
    kernel without ipywidgets; that warning says nothing about the model and would land in
    a notebook's (compared) stderr, so it is silenced for this one import.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import Llama4ForCausalLM, Llama4TextConfig
    return Llama4TextConfig, Llama4ForCausalLM


# The sizes of the tiny Llama 4, by Llama4TextConfig's field names; llama4_config(**sizes)
# overrides them (a benchmark builds a mid-size model from the same recipe).
LLAMA4_TINY_SIZES: dict[str, int] = {
    "vocab_size": 128,
    "hidden_size": HIDDEN,
    "intermediate_size": 64,  # expert size
    "intermediate_size_mlp": 128,  # dense MLP size
    "num_attention_heads": HEADS,
    "num_key_value_heads": 2,
    "head_dim": HEAD_DIM,
    "max_position_embeddings": 256,
    "num_local_experts": 2,
    "attention_chunk_size": 64,
}


def llama4_config(num_layers: int = 2, *, with_moe: bool = False, attn_implementation: str = "sdpa", **sizes: int) -> Any:
    """A tiny ``Llama4TextConfig``: hidden 64, 4 heads (2 KV heads) of dim 16, vocab 128.

    Every fourth layer is a no-RoPE layer, as in the real model (``no_rope_layer_interval=4``).
    ``with_moe=False`` makes every layer a dense MLP (``moe_layers=[]``); ``with_moe=True``
    makes every layer a 2-expert top-1 mixture of experts with a shared expert.
    ``sizes`` replace entries of :data:`LLAMA4_TINY_SIZES` (e.g. ``hidden_size=2048``); a
    name that is not one of them raises rather than being ignored.
    """
    Llama4TextConfig, _ = _llama4_classes()
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    unknown = sorted(set(sizes) - set(LLAMA4_TINY_SIZES))
    if unknown:
        raise TypeError(f"llama4_config: unknown sizes {unknown}; valid: {', '.join(LLAMA4_TINY_SIZES)}")
    return Llama4TextConfig(
        **(LLAMA4_TINY_SIZES | sizes),
        num_hidden_layers=num_layers,
        num_experts_per_tok=1,
        interleave_moe_layer_step=1,
        moe_layers=None if with_moe else [],
        use_cache=False,  # no DynamicCache object in the exported signature
        attn_implementation=attn_implementation,
    )


def tiny_llama4(
    num_layers: int = 2, with_moe: bool = False, seed: int = 0, attn_implementation: str = "sdpa", **sizes: int
) -> nn.Module:
    """HF ``Llama4ForCausalLM`` from :func:`llama4_config`, random weights from ``seed``, eval mode.

    Builds in milliseconds and downloads nothing. ``sdpa`` and ``eager`` attention both export
    (with dynamic batch and sequence); ``sdpa`` is the default. ``sizes`` go to
    :func:`llama4_config` (larger models for benchmarks).
    """
    _, Llama4ForCausalLM = _llama4_classes()
    config = llama4_config(num_layers, with_moe=with_moe, attn_implementation=attn_implementation, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Llama4ForCausalLM(config)
    return model.eval()


def llama4_example_inputs(model: nn.Module, batch: int = 2, seq: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """``{"input_ids": LongTensor[batch, seq]}`` drawn from the model's vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, model.config.vocab_size, (batch, seq), generator=generator)}


def export_llama4(model: nn.Module, batch: int = 2, seq: int = 8, dynamic: bool = False, seed: int = 0) -> ZooExport:
    """Export a (tiny) Llama 4 with ``torch.export.export(strict=False)``, called as ``input_ids=...``."""
    kwargs = llama4_example_inputs(model, batch, seq, seed)
    dims = batch_seq_dims(model.config.max_position_embeddings) if dynamic else None
    shapes = None if dims is None else {"input_ids": {0: dims[0], 1: dims[1]}}
    program = torch.export.export(model, (), kwargs, dynamic_shapes=shapes, strict=False)
    return ZooExport(program, (), kwargs)


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------


def _qk_inputs(model: nn.Module, batch: int, seq: int, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    shape = (batch, seq, HEADS, model.head_dim)
    return (torch.randn(shape, generator=g), torch.randn(shape, generator=g)), {}


def _attention_inputs(model: nn.Module, batch: int, seq: int, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, seq, model.heads * model.head_dim, generator=g)
    mask = torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch, 1, seq, seq).contiguous()
    return (hidden,), {"attention_mask": mask}


def _llama4_inputs(model: nn.Module, batch: int, seq: int, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return (), llama4_example_inputs(model, batch, seq, seed)


def _qk_dynamic(b: Any, s: Any) -> Any:
    return ({0: b, 1: s}, {0: b, 1: s})


for _model in (
    ZooEntry("complex_rope", "Llama-style RoPE, complex64 freqs_cis buffer", seeded(ComplexRoPE), _qk_inputs, _qk_dynamic, True),
    ZooEntry("complex_rope_polar", "complex RoPE, freqs built with torch.polar in forward", seeded(ComplexRoPEPolar), _qk_inputs, _qk_dynamic, True),
    ZooEntry(
        "rope_attention",
        "attention block with complex RoPE, keyword attention_mask",
        seeded(ComplexRoPEAttention),
        _attention_inputs,
        lambda b, s: {"hidden_states": {0: b, 1: s}, "attention_mask": {0: b, 2: s, 3: s}},
        True,
    ),
    ZooEntry("rotate_half_rope", "HF rotate-half RoPE, real cos/sin (no complex values)", seeded(RotateHalfRoPE), _qk_inputs, _qk_dynamic, False),
    ZooEntry("llama4", "HF Llama4ForCausalLM, tiny config, 2 dense layers", lambda seed: tiny_llama4(2, False, seed), _llama4_inputs, lambda b, s: {"input_ids": {0: b, 1: s}}, True),
    ZooEntry("llama4_moe", "HF Llama4ForCausalLM, tiny config, 2 MoE layers", lambda seed: tiny_llama4(2, True, seed), _llama4_inputs, lambda b, s: {"input_ids": {0: b, 1: s}}, True),
):
    register_model(_model)
