#!/usr/bin/env python3
"""Training-loss study: one small transformer trained with each recipe, loss curves stored.

    python -m benchmarks.loss_study                      # -> benchmarks/results/loss_curves_cuda.json

A decoder-only transformer (4 layers, width 512, 8 heads, MLP 2048, sequence 256, batch
16) learns a synthetic language: sequences from a fixed random order-1 Markov chain
over 512 tokens whose transition rows are sparse (8 likely successors per token), so the
lowest reachable loss is the chain's entropy rate, printed with the curves. Every recipe
starts from the same initial weights and sees the same batches; every ``Linear`` of the
blocks is this project's quantized Linear with that recipe (``bf16``: ``torch.nn.Linear``);
embeddings, norms, attention and the output head stay bf16, as in TransformerEngine's
usual setup. MXFP8 and NVFP4 run emulated on Hopper, where TransformerEngine does not
run them at all.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time
from typing import Any

import torch
import torch.nn.functional as F

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
RECIPES = ("bf16", "fp8_current", "fp8_block", "mxfp8", "nvfp4")


class MarkovLanguage:
    """A fixed random order-1 Markov chain with sparse rows; sampled on the GPU."""

    def __init__(self, vocab: int = 512, successors: int = 8, seed: int = 0, device: str = "cuda") -> None:
        g = torch.Generator().manual_seed(seed)
        logits = torch.full((vocab, vocab), -float("inf"))
        for row in range(vocab):
            cols = torch.randperm(vocab, generator=g)[:successors]
            logits[row, cols] = torch.randn(successors, generator=g) * 1.5
        self.probs = logits.softmax(-1).to(device)
        p = self.probs.double()
        self.entropy_rate = float(-(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1).mean())
        self.vocab = vocab

    def batch(self, batch: int, seq: int, g: torch.Generator) -> torch.Tensor:
        tokens = torch.empty(batch, seq, dtype=torch.long, device=self.probs.device)
        tokens[:, 0] = torch.randint(0, self.vocab, (batch,), generator=g, device=self.probs.device)
        for t in range(1, seq):
            tokens[:, t] = torch.multinomial(self.probs[tokens[:, t - 1]], 1, generator=g).squeeze(1)
        return tokens


def linear(recipe: str, fan_in: int, fan_out: int) -> torch.nn.Module:
    if recipe == "bf16":
        return torch.nn.Linear(fan_in, fan_out, bias=False, device="cuda", dtype=torch.bfloat16)
    from tetrt_support.quant.linear import Linear

    return Linear(fan_in, fan_out, bias=False, recipe=recipe, device="cuda", dtype=torch.bfloat16)


class Block(torch.nn.Module):
    def __init__(self, recipe: str, width: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.RMSNorm(width, device="cuda", dtype=torch.bfloat16)
        self.norm2 = torch.nn.RMSNorm(width, device="cuda", dtype=torch.bfloat16)
        self.qkv = linear(recipe, width, 3 * width)
        self.proj = linear(recipe, width, width)
        self.up = linear(recipe, width, mlp)
        self.down = linear(recipe, mlp, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, w)
        x = x + self.proj(attn)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, recipe: str, vocab: int, width: int = 512, layers: int = 4, heads: int = 8, mlp: int = 2048,
                 seq: int = 256) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width, device="cuda", dtype=torch.bfloat16)
        self.pos = torch.nn.Parameter(torch.randn(seq, width, device="cuda", dtype=torch.bfloat16) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(recipe, width, heads, mlp) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(width, device="cuda", dtype=torch.bfloat16)
        self.head = torch.nn.Linear(width, vocab, bias=False, device="cuda", dtype=torch.bfloat16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(recipe: str, data: torch.Tensor, vocab: int, lr: float) -> dict[str, Any]:
    """AdamW over the pre-drawn batches ``data`` (steps, batch, seq + 1)."""
    seq = data.shape[2] - 1
    torch.manual_seed(0)
    model = TinyLM(recipe, vocab, seq=seq)
    if recipe != "bf16":  # the same initial weights as the bf16 model
        torch.manual_seed(0)
        reference = TinyLM("bf16", vocab, seq=seq)
        model.load_state_dict(reference.state_dict(), strict=True)
        del reference
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    started = time.perf_counter()
    for tokens in data:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        if not math.isfinite(losses[-1]):
            break
    return {"losses": losses, "wall_s": time.perf_counter() - started,
            "final_mean_of_last_20": sum(losses[-20:]) / len(losses[-20:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "loss_curves_cuda.json")
    args = parser.parse_args()
    try:
        from benchmarks.record import machine

        record = machine("cuda")
    except Exception as e:  # noqa: BLE001
        record = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "record_error": str(e)}
    language = MarkovLanguage()
    result: dict[str, Any] = {
        "benchmark": "loss_study",
        "machine": record,
        "setup": {"layers": 4, "width": 512, "heads": 8, "mlp": 2048, "seq": args.seq, "batch": args.batch,
                  "steps": args.steps, "lr": args.lr, "optimizer": "AdamW", "vocab": language.vocab,
                  "data": "order-1 Markov chain, 8 successors per token",
                  "entropy_rate_nats": language.entropy_rate},
        "recipes": {},
    }
    g = torch.Generator(device="cuda").manual_seed(1234)
    data = language.batch(args.steps * args.batch, args.seq + 1, g).reshape(args.steps, args.batch, args.seq + 1)
    for recipe in [r for r in args.recipes.split(",") if r]:
        try:
            result["recipes"][recipe] = train(recipe, data, language.vocab, args.lr)
        except Exception as e:  # noqa: BLE001 - one recipe failing must not lose the others
            result["recipes"][recipe] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        entry = result["recipes"][recipe]
        print(recipe, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in entry.items() if k != "losses"},
              flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"entropy rate {language.entropy_rate:.4f} nats; wrote {args.out}")


if __name__ == "__main__":
    main()
