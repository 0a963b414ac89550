"""Measure how a quantizer argument traces under ``torch.compile(fullgraph=True)``.

Whether a quantizer is an opaque *value* (guarded by ``__eq__``, rebuilt in FX code from
``__fx_repr__``) or keeps identity semantics decides how often a step that takes it
recompiles. The helpers here count compiles and graphs, keep the FX graphs for printing,
and check the compiled results against eager -- the measurements of notebook 03.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo.utils import counters

from tetrt_support.quant import MXFP8Quantizer, Quantizer
from tetrt_support.quant.opaque import _registration_api, qdq_op

Step = Callable[[torch.Tensor, Quantizer], torch.Tensor]


class IdentityMXFP8Quantizer(MXFP8Quantizer):
    """MXFP8 numerics with identity semantics: == is ``is``, the FX code refers to this very object.

    The contrast case: what a quantizer holding live tensors must be. Registered as an
    opaque constant type all the same, so that a custom op can take it as an argument.
    """

    _value_semantics = False
    _tetrt_value_opaque = False  # not a value type, whatever MXFP8Quantizer's flag says

    def __fx_repr__(self) -> tuple[str, dict[str, Any]]:
        return "identity_quantizer", {"identity_quantizer": self}


_api = _registration_api()
if _api is not None:  # no opaque-object API (torch < 2.11): ops taking it graph-break
    _register, _typ = _api
    _register(IdentityMXFP8Quantizer, typ=_typ)
del _api


class GraphCapture:
    """A ``torch.compile`` backend that keeps every FX graph it is handed and runs it as is."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> torch.fx.GraphModule:
        self.graphs.append(gm)
        return gm


@dataclass
class TraceReport:
    """What compiling one step over a sequence of quantizers cost, and whether it was exact."""

    frames: int  # frames Dynamo compiled (graphs handed to the backend)
    unique_graphs: int  # Dynamo's own ``unique_graphs`` counter
    matches_eager: bool  # every compiled output bit-equal to the eager one
    graphs: list[torch.fx.GraphModule] = field(default_factory=list)


def make_step(cls: type[Quantizer]) -> Step:
    """A tiny model around the custom op whose quantizer argument has ``cls``'s opaque type."""
    op = qdq_op(cls)
    return lambda x, quantizer: torch.relu(op(x * 2.0, quantizer)) + 1.0


def trace_over(step: Step, quantizers: Iterable[Quantizer], x: torch.Tensor) -> TraceReport:
    """Compile ``step`` (fullgraph, from a reset Dynamo) and call it once per quantizer.

    Every call runs, also after a mismatch, so that ``frames`` counts all recompiles.
    """
    torch._dynamo.reset()
    counters.clear()
    capture = GraphCapture()
    compiled = torch.compile(step, backend=capture, fullgraph=True)
    same = [torch.equal(compiled(x, q), step(x, q)) for q in quantizers]
    return TraceReport(len(capture.graphs), counters["stats"]["unique_graphs"], all(same), capture.graphs)


def compiles_over_steps(
    cls: type[Quantizer], make_quantizer: Callable[[], Quantizer], steps: int = 5
) -> tuple[int, int, bool]:
    """(frames compiled, unique_graphs, outputs equal eager) over ``steps`` fresh quantizers.

    Models a training loop that builds its quantizer afresh on every step.
    """
    report = trace_over(make_step(cls), (make_quantizer() for _ in range(steps)), torch.randn(32, 64))
    return report.frames, report.unique_graphs, report.matches_eager


def placeholders(gm: torch.fx.GraphModule) -> list[str]:
    """The graph's inputs: a hoisted opaque value shows up here instead of as a constant."""
    return [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
