"""The training steps the GPU suites time, and how a step is captured and timed.

Shared by :mod:`benchmarks.train_step`, :mod:`benchmarks.step_bounds`,
:mod:`benchmarks.model_step` and :mod:`benchmarks.host_breakdown`; imports no suite.

- one quantized (or bf16, or torchao float8) Linear's compiled training step
  (:func:`step_fn`) and its sizes ``TxKxN``;
- the whole step captured into one CUDA graph (:func:`whole_step_graph`, mode
  :data:`WHOLE_STEP_GRAPH`) and the host time per step (:func:`host_ms_per_step`);
- the FP8 forward against raw ``torch._scaled_mm`` (:func:`fp8_forward_case`);
- which step (inline or custom ops) a model's quantized Linears compile to (:func:`compiled_steps`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import record

record.private_inductor_cache("tetrt-train-step-")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

# Every variant of a size is compiled at once (they are timed in turn), and the quantized
# Linears of the four recipes share one ``forward`` code object: each is one cache entry.
RECOMPILE_LIMIT = 64


def allow_recompiles() -> None:
    """Raise dynamo's recompile limit to :data:`RECOMPILE_LIMIT` (a process-wide setting)."""
    torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT


# A recipe name with this suffix builds its Linear with compile_as="custom_ops": the step as
# the two custom ops, beside the default (inline where the recipe has an inline step).
CUSTOM_OPS = "+custom_ops"
DEFAULT_SIZES = ("8192x4096x4096", "16384x8192x8192")
QUICK_SIZES = ("2048x1024x1024",)

# Not a torch.compile mode: the compiled (default-mode) step captured whole -- forward and
# backward -- into one CUDA graph and replayed, as PyTorch's whole-network capture recipe
# does. One replay is one launch, so the ratios are the GPU's work without the host's.
WHOLE_STEP_GRAPH = "cuda-graph-step"
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", WHOLE_STEP_GRAPH)


def make_layer(variant: str, k: int, n: int, weight: torch.Tensor) -> torch.nn.Module:
    """The Linear (K -> N, no bias, bf16, on ``weight``'s device) of ``variant``, its weight a
    copy of ``weight``."""
    device = weight.device
    if variant in ("bf16", "torchao_float8_tensorwise"):
        layer = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            layer.weight.copy_(weight)
        if variant == "bf16":
            return layer
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        model = torch.nn.Sequential(layer)
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"))
        return model
    from tetrt_support.quant.linear import Linear

    recipe, custom_ops = variant.removesuffix(CUSTOM_OPS), variant.endswith(CUSTOM_OPS)
    layer = Linear(k, n, bias=False, recipe=recipe, device=device, dtype=torch.bfloat16,
                   compile_as="custom_ops" if custom_ops else "auto")
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def compiled_steps(model: torch.nn.Module, tokens: int) -> str | None:
    """Which step this project's quantized Linears in ``model`` take under torch.compile for
    ``tokens`` rows (``"inline"``, ``"custom_ops"``, or both joined by ``+``); None: it has none.
    ``compile_as="auto"`` decides per device and shape, so a results file records what it took."""
    from tetrt_support.quant.linear import Linear

    forms = {m.compiled_step(torch.empty(tokens, m.in_features, device=m.weight.device, dtype=m.weight.dtype))
             for m in model.modules() if isinstance(m, Linear)}
    return "+".join(sorted(forms)) or None


def step_fn(variant: str, t: int, k: int, n: int, seed: int = 0, mode: str = "default",
            device: str = "cuda") -> Callable[[], None]:
    """One compiled training step of ``variant``'s Linear: ``y = layer(x); y.backward(dy)``."""
    if mode not in MODES:
        raise ValueError(f"train_step: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == WHOLE_STEP_GRAPH and device != "cuda":
        raise ValueError(f"train_step: mode {WHOLE_STEP_GRAPH!r} captures a CUDA graph; device is {device!r}")
    allow_recompiles()
    g = torch.Generator(device=device).manual_seed(seed)
    weight = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=g) / k**0.5
    x = torch.randn(t, k, device=device, dtype=torch.bfloat16, generator=g).requires_grad_(True)
    dy = torch.randn(t, n, device=device, dtype=torch.bfloat16, generator=g)
    layer = make_layer(variant, k, n, weight)
    compile_mode = None if mode in ("default", WHOLE_STEP_GRAPH) else mode
    compiled = torch.compile(layer, fullgraph=True, mode=compile_mode)
    params = list(layer.parameters())

    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        compiled(x).backward(dy)

    return whole_step_graph(step) if mode == WHOLE_STEP_GRAPH else step


@dataclass
class GraphReplay:
    """A step recorded into one CUDA graph; calling it replays the graph.

    It holds the step (and so every tensor the step's closure reads) and what the capture
    returned, because the graph reads and writes those addresses on every replay and
    ``graph.replay`` alone keeps neither alive. Memory freed under a graph goes to other
    tensors (the replay then silently reads their values) or, at the next capture's
    ``empty_cache``, back to the driver (the replay then fails with an illegal memory access)."""

    graph: torch.cuda.CUDAGraph
    step: Callable[[], Any]
    outputs: Any

    def __call__(self) -> None:
        self.graph.replay()


def whole_step_graph(step: Callable[[], Any], warmup: int = 3) -> GraphReplay:
    """``step`` recorded into one ``torch.cuda.CUDAGraph``, as a :class:`GraphReplay`.

    Warm-up runs on a side stream first (compilation, autotuning, the allocator's pools),
    as ``torch.cuda.graph`` requires. What the capture allocates (the gradients, the step's
    return value) lives in the graph's pool and every replay overwrites it in place. A step
    that synchronises with the host, or copies from it, fails here with CUDA's capture error."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return GraphReplay(graph, step, outputs)


def host_ms_per_step(step: Callable[[], None], steps: int = 20) -> float:
    """Host time of ``steps`` steps issued back to back (the device queue absorbs them)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / steps * 1e3


def fp8_tensorwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 current-scaling data and its scale_inv (a 0-d tensor): raw ``_scaled_mm``'s operands."""
    from tetrt_support.quant import Float8CurrentScalingQuantizer

    q = Float8CurrentScalingQuantizer(columnwise_usage=False).quantize(t)  # row-wise data is all this needs
    return q._data, q._scale_inv.reshape(())


@dataclass
class ForwardCase:
    """The FP8 forward against raw ``_scaled_mm``: the input ``x``, the raw GEMM's operands
    quantized beforehand, and an fp8_current ``Linear`` whose weight cache is filled (for
    ``is_first_microbatch=False``)."""

    x: torch.Tensor
    layer: Any
    raw_operands: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # xq, wq, x_scale_inv, w_scale_inv

    def raw(self) -> torch.Tensor:
        xq, wq, xs, ws = self.raw_operands
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)

    def forward(self, first_microbatch: bool | None = None) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            with torch.no_grad():
                return self.layer(self.x, is_first_microbatch=first_microbatch)
        return call


def fp8_forward_case(size: int, device: str = "cuda") -> ForwardCase:
    """The one set-up of the FP8 forward comparison (``train_step`` and ``step_bounds``)."""
    from tetrt_support.quant.linear import Linear

    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=g)
    w = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=g) / size**0.5
    (xq, xs), (wq, ws) = fp8_tensorwise(x), fp8_tensorwise(w)
    layer = Linear(size, size, bias=False, recipe="fp8_current", device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer(x, is_first_microbatch=True)  # fills the weight cache
    return ForwardCase(x=x, layer=layer, raw_operands=(xq, wq, xs, ws))
