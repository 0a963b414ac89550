"""Training-loss study: one small transformer trained with each recipe, loss curves stored.

    python -m benchmarks.perf --device cuda --suites loss_study   # -> results/loss_curves_cuda.json
    python -m benchmarks.perf --device cpu --suites loss_study    # -> results/loss_curves_cpu.json

A decoder-only transformer learns a synthetic language: sequences from a fixed random
order-1 Markov chain whose transition rows are sparse (8 likely successors per token), so
the lowest reachable loss is the chain's entropy rate, stored with the curves. Every recipe
starts from the same initial weights and sees the same batches; every ``Linear`` of the
blocks is this project's quantized Linear with that recipe (``bf16``: ``torch.nn.Linear``);
embeddings, norms, attention and the output head stay bf16, as in TransformerEngine's usual
setup. MXFP8 and NVFP4 run emulated (on Hopper, where TransformerEngine does not run them at
all, and on a CPU, where every recipe runs the reference quantizers and GEMMs).

The model size depends on the device (:data:`MODELS`): the GPU study is 4 layers of width
512; the CPU study shrinks the model and the batches so that all five recipes train in a
few minutes on two cores. The two are different experiments; compare recipes within one.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F

RECIPES = ("bf16", "fp8_current", "fp8_block", "mxfp8", "nvfp4")

# device -> model, data and optimiser of the study (``--quick``: the smoke sizes)
MODELS: dict[str, dict[str, Any]] = {
    "cuda": {"layers": 4, "width": 512, "heads": 8, "mlp": 2048, "seq": 256, "batch": 16, "vocab": 512, "steps": 300, "lr": 1e-3},
    "cpu": {"layers": 1, "width": 64, "heads": 2, "mlp": 128, "seq": 32, "batch": 4, "vocab": 64, "steps": 200, "lr": 3e-3},
    "quick": {"layers": 1, "width": 32, "heads": 2, "mlp": 64, "seq": 16, "batch": 2, "vocab": 32, "steps": 5, "lr": 1e-3},
}
SUCCESSORS = 8  # likely next tokens per token of the Markov language


class MarkovLanguage:
    """A fixed random order-1 Markov chain with sparse rows, sampled on ``device``."""

    def __init__(self, vocab: int = 512, successors: int = SUCCESSORS, seed: int = 0, device: str = "cuda") -> None:
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


def linear(recipe: str, fan_in: int, fan_out: int, device: str) -> torch.nn.Module:
    if recipe == "bf16":
        return torch.nn.Linear(fan_in, fan_out, bias=False, device=device, dtype=torch.bfloat16)
    from tetrt_support.quant.linear import Linear

    return Linear(fan_in, fan_out, bias=False, recipe=recipe, device=device, dtype=torch.bfloat16)


class Block(torch.nn.Module):
    def __init__(self, recipe: str, width: int, heads: int, mlp: int, device: str) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.RMSNorm(width, device=device, dtype=torch.bfloat16)
        self.norm2 = torch.nn.RMSNorm(width, device=device, dtype=torch.bfloat16)
        self.qkv = linear(recipe, width, 3 * width, device)
        self.proj = linear(recipe, width, width, device)
        self.up = linear(recipe, width, mlp, device)
        self.down = linear(recipe, mlp, width, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, w)
        x = x + self.proj(attn)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(torch.nn.Module):
    def __init__(self, recipe: str, vocab: int, *, width: int, layers: int, heads: int, mlp: int, seq: int,
                 device: str) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width, device=device, dtype=torch.bfloat16)
        self.pos = torch.nn.Parameter(torch.randn(seq, width, device=device, dtype=torch.bfloat16) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(recipe, width, heads, mlp, device) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(width, device=device, dtype=torch.bfloat16)
        self.head = torch.nn.Linear(width, vocab, bias=False, device=device, dtype=torch.bfloat16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(recipe: str, data: torch.Tensor, model_setup: dict[str, Any], device: str) -> dict[str, Any]:
    """AdamW over the pre-drawn batches ``data`` (steps, batch, seq + 1); the loss of every step."""
    shape = {k: model_setup[k] for k in ("width", "layers", "heads", "mlp")}
    vocab, seq = model_setup["vocab"], data.shape[2] - 1
    torch.manual_seed(0)
    model = TinyLM(recipe, vocab, seq=seq, device=device, **shape)
    if recipe != "bf16":  # the same initial weights as the bf16 model
        torch.manual_seed(0)
        reference = TinyLM("bf16", vocab, seq=seq, device=device, **shape)
        model.load_state_dict(reference.state_dict(), strict=True)
        del reference
    opt = torch.optim.AdamW(model.parameters(), lr=model_setup["lr"], weight_decay=0.0)
    losses = []
    started = time.perf_counter()
    for tokens in data:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            break  # a diverged run is a result too: its curve ends at the first non-finite loss
    return {"losses": losses, "wall_s": time.perf_counter() - started,
            "final_mean_of_last_20": sum(losses[-20:]) / len(losses[-20:])}


def run(device: str, quick: bool = False, *, recipes: list[str] | None = None, steps: int | None = None,
        progress: bool = True) -> dict[str, Any]:
    """The ``loss_study`` suite of ``python -m benchmarks.perf``: ``{"setup": ..., "recipes": ...}``."""
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the loss_study suite on cuda needs a CUDA device")
    model_setup = dict(MODELS["quick" if quick else device])
    if steps is not None:
        model_setup["steps"] = steps
    language = MarkovLanguage(model_setup["vocab"], device=device)
    setup = {**model_setup, "optimizer": "AdamW (weight decay 0)", "dtype": "bfloat16",
             "data": f"order-1 Markov chain over {language.vocab} tokens, {SUCCESSORS} successors per token",
             "entropy_rate_nats": language.entropy_rate}
    if device == "cpu":
        setup["threads"] = torch.get_num_threads()
    g = torch.Generator(device=device).manual_seed(1234)
    n, batch, seq = model_setup["steps"], model_setup["batch"], model_setup["seq"]
    data = language.batch(n * batch, seq + 1, g).reshape(n, batch, seq + 1)
    out: dict[str, Any] = {}
    for recipe in recipes or RECIPES:
        try:
            out[recipe] = train(recipe, data, model_setup, device)
        except Exception as e:  # noqa: BLE001 - one recipe failing must not lose the others
            out[recipe] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
        if progress:
            print(recipe, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out[recipe].items() if k != "losses"},
                  flush=True)
    return {"setup": setup, "recipes": out}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Mean of the last 20 losses and wall time per recipe, and the language's entropy rate."""
    s: dict[str, Any] = {"entropy_rate_nats": round(result["setup"]["entropy_rate_nats"], 4)}
    for recipe, entry in result["recipes"].items():
        s[recipe] = (f"last-20 mean {entry['final_mean_of_last_20']:.4f}, {len(entry['losses'])} steps, "
                     f"{entry['wall_s']:.1f} s" if "losses" in entry else entry.get("error"))
    return s


if __name__ == "__main__":  # python -m benchmarks.loss_study ARGS: the entry point, this suite
    from benchmarks import perf

    perf.suite_main("loss_study")
