"""Measure how a quantizer argument traces under ``torch.compile(fullgraph=True)``.

Whether a quantizer is an opaque *value* (guarded by ``__eq__``, rebuilt in FX code from
``__fx_repr__``) or keeps identity semantics decides how often a step that takes it
recompiles. The helpers here count compiles and graphs, keep the FX graphs for printing,
and check the compiled results against eager. Showcase code: nothing here is registered
with torch at import; the contrast class :class:`IdentityMXFP8Quantizer` is registered on
first use by :func:`make_step`. :class:`GraphCapture` is the one capturing backend of the
report helpers (:mod:`.fake_impl_measure` uses it too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._dynamo.utils import counters

from tetrt_support.quant import MXFP8Quantizer, Quantizer
from tetrt_support.quant.dynamo import _registration_api, qdq_op

Step = Callable[[torch.Tensor, Quantizer], torch.Tensor]


class IdentityMXFP8Quantizer(MXFP8Quantizer):
    """MXFP8 numerics with identity semantics: == is ``is``, the FX code refers to this very object.

    The contrast case: what a quantizer holding live tensors must be. A subclass of a
    value quantizer that does not register itself as a value type, hence identity
    semantics; registered with torch as an opaque type all the same (on first use, by
    :func:`make_step`), so that a custom op can take it as an argument.
    """

    def __fx_repr__(self) -> tuple[str, dict[str, Any]]:
        return "identity_quantizer", {"identity_quantizer": self}


@functools.cache
def _register_identity_quantizer() -> None:
    api = _registration_api()
    if api is not None:  # no opaque-object API (torch < 2.11): ops taking it graph-break
        register, typ = api
        register(IdentityMXFP8Quantizer, typ=typ)


class GraphCapture:
    """A ``torch.compile`` backend that keeps every FX graph it is handed, then runs it
    through ``backend`` (a name or callable; None runs the graph as is).

    ``frames`` counts the graphs (one per compiled frame); ``code`` and ``signatures``
    ((opcode, target) per node: comparable across graphs whose variable names differ) are
    read from the kept graphs.
    """

    def __init__(self, backend: str | Callable | None = None) -> None:
        if isinstance(backend, str):
            from torch._dynamo.backends.registry import lookup_backend

            backend = lookup_backend(backend)
        self.backend = backend
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        self.graphs.append(gm)
        return gm if self.backend is None else self.backend(gm, example_inputs)

    @property
    def frames(self) -> int:
        return len(self.graphs)

    @property
    def code(self) -> list[str]:
        return [gm.code for gm in self.graphs]

    @property
    def signatures(self) -> list[tuple[tuple[str, str], ...]]:
        return [tuple((node.op, _target_name(node.target)) for node in gm.graph.nodes) for gm in self.graphs]


def _target_name(target: object) -> str:
    if isinstance(target, str):
        return target if not target.startswith(("L_", "G_", "l_", "g_")) else "<input>"
    return getattr(target, "__qualname__", None) or str(target)


@dataclass
class TraceReport:
    """What compiling one step over a sequence of quantizers cost, and whether it was exact."""

    frames: int  # frames Dynamo compiled (graphs handed to the backend)
    unique_graphs: int  # Dynamo's own ``unique_graphs`` counter
    matches_eager: bool  # every compiled output bit-equal to the eager one
    graphs: list[torch.fx.GraphModule] = field(default_factory=list)


def make_step(cls: type[Quantizer]) -> Step:
    """A tiny model around the custom op whose quantizer argument has ``cls``'s opaque type."""
    if cls is IdentityMXFP8Quantizer:
        _register_identity_quantizer()
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
