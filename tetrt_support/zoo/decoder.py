"""A plain-PyTorch, Llama-3-style decoder-only transformer for training benchmarks.

Token embedding, ``layers`` blocks of RMSNorm -> attention (rotate-half RoPE in real
arithmetic, grouped-query attention through ``F.scaled_dot_product_attention(is_causal=True)``)
-> RMSNorm -> SwiGLU MLP, a final RMSNorm and an ``lm_head``; ``forward(ids, labels)`` returns
the cross-entropy loss. Every projection is a ``torch.nn.Linear(bias=False)`` -- q, k, v, o,
gate, up, down in each block, then ``lm_head`` -- so a converter that swaps Linears by name
(``module_filter_fn=lambda m, fqn: fqn != "lm_head"``) sees the whole model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PRESETS", "Attention", "Block", "Decoder", "DecoderConfig", "MLP", "RMSNorm", "apply_rope", "decoder_config",
           "linear_names", "rotate_half"]

GQA_MODES = ("repeat_interleave", "enable_gqa")


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a :class:`Decoder`. ``gqa``: how KV heads meet the query heads --
    ``"repeat_interleave"`` (copies of the KV heads, every SDPA back end) or ``"enable_gqa"``
    (SDPA's own grouped-query argument)."""

    vocab: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    layers: int
    max_seq: int = 8192
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    gqa: str = "repeat_interleave"

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"DecoderConfig: hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"DecoderConfig: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"DecoderConfig: RoPE needs an even head dim, got {self.head_dim}")
        if self.gqa not in GQA_MODES:
            raise ValueError(f"DecoderConfig: gqa must be one of {GQA_MODES}, got {self.gqa!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def replace(self, **changes: object) -> DecoderConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


PRESETS: dict[str, DecoderConfig] = {
    # Llama 3 8B's widths (its 128256-token vocabulary cut to 32000), all 32 layers.
    "llama3_8b_width": DecoderConfig(vocab=32000, hidden=4096, heads=32, kv_heads=8, ffn=14336, layers=32),
    # a 1B-class width: 16 heads of 128, 8 KV heads.
    "1b_width": DecoderConfig(vocab=32000, hidden=2048, heads=16, kv_heads=8, ffn=8192, layers=16),
    # CPU tests and smoke runs.
    "tiny": DecoderConfig(vocab=256, hidden=64, heads=4, kv_heads=2, ffn=128, layers=2, max_seq=256),
    "tiny_mha": DecoderConfig(vocab=128, hidden=32, heads=2, kv_heads=2, ffn=64, layers=1, max_seq=64),
}


def decoder_config(name: str, **changes: object) -> DecoderConfig:
    """The preset ``name`` with ``changes`` applied (``decoder_config("llama3_8b_width", layers=4)``)."""
    try:
        config = PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown decoder preset {name!r}; known: {', '.join(PRESETS)}") from None
    return config.replace(**changes) if changes else config


class RMSNorm(nn.Module):
    """Llama's RMSNorm: normalised in float32, cast back, then scaled by the weight."""

    def __init__(self, dim: int, eps: float, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` (batch, heads, seq, head_dim) by ``cos``/``sin`` (seq, head_dim)."""
    return x * cos + rotate_half(x) * sin


def rope_tables(head_dim: int, max_seq: int, theta: float,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``cos`` and ``sin`` of shape (max_seq, head_dim), the frequencies repeated for both halves."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def _linear(fan_in: int, fan_out: int, device: torch.device | str | None, dtype: torch.dtype | None) -> nn.Linear:
    return nn.Linear(fan_in, fan_out, bias=False, device=device, dtype=dtype)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.gqa = config.heads, config.kv_heads, config.head_dim, config.gqa
        self.q = _linear(config.hidden, config.heads * config.head_dim, device, dtype)
        self.k = _linear(config.hidden, config.kv_heads * config.head_dim, device, dtype)
        self.v = _linear(config.hidden, config.kv_heads * config.head_dim, device, dtype)
        self.o = _linear(config.heads * config.head_dim, config.hidden, device, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        groups = self.heads // self.kv_heads
        if groups > 1 and self.gqa == "enable_gqa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            if groups > 1:  # query head i reads KV head i // groups, as enable_gqa does
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: DecoderConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.gate = _linear(config.hidden, config.ffn, device, dtype)
        self.up = _linear(config.hidden, config.ffn, device, dtype)
        self.down = _linear(config.ffn, config.hidden, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, config: DecoderConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden, config.norm_eps, device=device, dtype=dtype)
        self.attn = Attention(config, device=device, dtype=dtype)
        self.mlp_norm = RMSNorm(config.hidden, config.norm_eps, device=device, dtype=dtype)
        self.mlp = MLP(config, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """The decoder of ``config``, weights drawn from ``seed`` on ``device`` (so the same seed
    gives the same weights on one device kind; CPU and CUDA generators differ).

    ``forward(input_ids)`` returns the logits (batch, seq, vocab); ``forward(input_ids, labels)``
    the mean cross-entropy (computed in float32) of the logits against ``labels`` (batch, seq),
    the target of each position, already shifted; ``-100`` is ignored."""

    def __init__(self, config: DecoderConfig, *, seed: int = 0, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.hidden, device=device, dtype=dtype)
        self.layers = nn.ModuleList(Block(config, device=device, dtype=dtype) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps, device=device, dtype=dtype)
        self.lm_head = _linear(config.hidden, config.vocab, device, dtype)
        cos, sin = rope_tables(config.head_dim, config.max_seq, config.rope_theta, device=device)
        # float32 tables, not saved, cast to the activations' dtype per call
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """N(0, 0.02) for the embedding and every Linear, the residual projections (o, down)
        scaled by 1/sqrt(2 layers); norm weights one. Drawn from a generator on the
        parameters' device, in module order."""
        device = self.embed.weight.device
        g = torch.Generator(device=device).manual_seed(seed)
        std, residual_std = 0.02, 0.02 / (2 * self.config.layers) ** 0.5
        self.embed.weight.normal_(0.0, std, generator=g)
        for layer in self.layers:
            for name, linear in (*layer.attn.named_children(), *layer.mlp.named_children()):
                linear.weight.normal_(0.0, residual_std if name in ("o", "down") else std, generator=g)
            layer.attn_norm.weight.fill_(1.0)
            layer.mlp_norm.weight.fill_(1.0)
        self.norm.weight.fill_(1.0)
        self.lm_head.weight.normal_(0.0, std, generator=g)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        seq = input_ids.shape[1]
        if seq > self.config.max_seq:
            raise ValueError(f"Decoder: sequence of {seq} tokens exceeds max_seq {self.config.max_seq}")
        x = self.embed(input_ids)
        cos, sin = self.rope_cos[:seq].to(x.dtype), self.rope_sin[:seq].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if labels is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def linear_names(model: nn.Module) -> list[str]:
    """The qualified names of ``model``'s ``torch.nn.Linear`` modules, in module order."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
