"""What a graph holds and what a lowering leaves: inventories and the strategy comparison.

Op histograms, the table of complex nodes, the rule table, the code one rule emits,
torch's own ``decompose_complex_in_graph`` wrapped to take an exported program, a
side-by-side comparison of lowering strategies, and the data of the RoPE rotation plot.

Showcase only: the lowering itself lives in :mod:`tetrt_support.complex`, which this
module imports inside the functions that need it (complex detection, ``lower``), so that
importing :mod:`tetrt_support.report` stays free of the lowering stack.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from tetrt_support.report.compare import max_abs_error
from tetrt_support.report.tables import Table
from tetrt_support.report.timing import Stopwatch

__all__ = [
    "ComplexNodeRow",
    "RotationTrace",
    "Strategy",
    "StrategyReport",
    "TORCH_DECOMPOSE",
    "compare_strategies",
    "complex_node_table",
    "complex_valued_nodes",
    "graph_module_of",
    "histogram_table",
    "lowered_aten_lines",
    "one_op_program",
    "op_histogram",
    "op_name",
    "relative_position_invariance",
    "rope_rotation_traces",
    "rule_table",
    "strategy_table",
    "tetrt_strategy",
    "torch_decompose_available",
    "torch_decompose_complex",
]

GraphLike = Any  # torch.export.ExportedProgram | fx.GraphModule | fx.Graph


# --------------------------------------------------------------------------------------
# Graph inventories
# --------------------------------------------------------------------------------------


def graph_module_of(obj: GraphLike) -> fx.GraphModule | fx.Graph:
    """The graph-holding object of an exported program, a GraphModule or a Graph."""
    if isinstance(obj, torch.export.ExportedProgram):
        return obj.graph_module
    if isinstance(obj, (fx.GraphModule, fx.Graph)):
        return obj
    raise TypeError(f"expected an ExportedProgram, fx.GraphModule or fx.Graph, got {type(obj).__name__}")


def _graph(obj: GraphLike) -> fx.Graph:
    holder = graph_module_of(obj)
    return holder if isinstance(holder, fx.Graph) else holder.graph


def op_name(node: fx.Node) -> str:
    """A short stable name for what ``node`` calls: ``aten.mul.Tensor``, ``getitem``, ..."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", str(target))


def op_histogram(obj: GraphLike) -> collections.Counter[str]:
    """How many ``call_function`` nodes call each op, e.g. ``{"aten.mul.Tensor": 4, ...}``."""
    return collections.Counter(op_name(n) for n in _graph(obj).nodes if n.op == "call_function")


def _touching_complex(obj: GraphLike) -> list[fx.Node]:
    from tetrt_support.complex.detect import touches_complex

    return [n for n in _graph(obj).nodes if touches_complex(n)]


def complex_valued_nodes(obj: GraphLike) -> list[fx.Node]:
    """Nodes whose own value is complex (placeholders and constants included).

    Narrower than :func:`tetrt_support.complex.detect.complex_nodes`, which also counts a
    node that only *reads* a complex value (``view_as_real``).
    """
    from tetrt_support.complex.detect import is_complex_value

    return [n for n in _graph(obj).nodes if n.op != "output" and is_complex_value(n.meta.get("val"))]


class ComplexNodeRow(NamedTuple):
    """One row of the complex-node table."""

    node: str
    op: str
    dtype: str
    shape: str


def _describe_val(val: Any) -> tuple[str, str]:
    tensors = [v for v in pytree.tree_leaves(val) if isinstance(v, torch.Tensor)]
    if not tensors:
        return "-", "-"
    dtypes = ",".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors}))
    shapes = ",".join(str(list(t.shape)) for t in tensors)
    return dtypes, shapes


def complex_node_table(obj: GraphLike) -> Table:
    """The nodes that produce or read complex values, as ``(node, op, dtype, shape)`` rows."""
    rows = []
    for n in _touching_complex(obj):
        op = op_name(n) if n.op == "call_function" else n.op
        rows.append(ComplexNodeRow(n.name, op, *_describe_val(n.meta.get("val"))))
    return Table(rows, ComplexNodeRow._fields)


def histogram_table(histograms: Mapping[str, Mapping[str, int]], ops: Iterable[str] | None = None) -> Table:
    """Side-by-side op counts: one row per op, one column per histogram (0 where absent).

    ``ops`` picks and orders the rows; by default every op that any histogram has, sorted.
    """
    names = sorted(set().union(*histograms.values())) if ops is None else list(ops)
    rows = [(op, *(histograms[k].get(op, 0) for k in histograms)) for op in names]
    return Table(rows, ["op", *histograms])


# --------------------------------------------------------------------------------------
# Rules, and the code they generate
# --------------------------------------------------------------------------------------


def _rule_name(rule: Callable[..., Any]) -> str:
    # A rule made by a factory (``_unary(...)`` returns a closure named ``rule``) is named
    # with its factory, ``_unary.rule``: the bare name would merge unrelated factories' rules.
    qualname = getattr(rule, "__qualname__", None) or getattr(rule, "__name__", None) or repr(rule)
    return qualname.replace(".<locals>.", ".")


def rule_table(rules: Mapping[Any, Callable[..., Any]]) -> Table:
    """``(rule function, the ops it lowers)`` rows of a rule table, in registration order."""
    grouped: dict[str, list[str]] = {}
    for op, rule in rules.items():
        label = op.name().removeprefix("aten::") if isinstance(op, torch._ops.OpOverload) else str(op)
        grouped.setdefault(_rule_name(rule), []).append(label)
    return Table([(name, ", ".join(ops)) for name, ops in grouped.items()], ["rule", "ATen ops it lowers"])


class _Call(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def one_op_program(fn: Callable[..., Any], *example_inputs: torch.Tensor) -> torch.export.ExportedProgram:
    """Export ``fn(*example_inputs)`` (typically one complex op) to show what a rule emits."""
    return torch.export.export(_Call(fn), example_inputs, strict=False)


def lowered_aten_lines(gm: fx.GraphModule) -> list[str]:
    """The computing lines of ``gm``'s generated code: ATen calls and the return.

    Drops the pytree (un)flattening and export's guard call, which every module carries.
    """
    lines = []
    for line in gm.code.strip().splitlines():
        code = line.strip().split(";")[0].strip()
        if "torch.ops." in code or code.startswith("return"):
            lines.append(code)
    return lines


# --------------------------------------------------------------------------------------
# torch's own pass
# --------------------------------------------------------------------------------------


def torch_decompose_available() -> bool:
    """Whether this torch ships ``decompose_complex_in_graph`` (torch >= 2.14)."""
    try:
        from torch._functorch._aot_autograd.complex_decomposition import decompose_complex_in_graph  # noqa: F401
    except ImportError:
        return False
    return True


def torch_decompose_complex(program: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> fx.GraphModule:
    """torch's ``decompose_complex_in_graph`` applied to ``program.module()``.

    It takes a GraphModule and its flat inputs, so the result is called with the pytree
    leaves of ``(args, kwargs)`` and returns a flat list (the exported signature is gone).
    Export's ``aten._assert_tensor_metadata`` checks are dropped first: they have no users,
    and the ``ComplexTensor`` subclass the pass runs on has no rule for them (HF Llama 4's
    ``.to(complex64)`` fails with "Multiple dispatch failed for
    'torch._ops.aten._assert_tensor_metadata.default'" otherwise).
    """
    try:
        from torch._functorch._aot_autograd.complex_decomposition import decompose_complex_in_graph
    except ImportError as e:
        raise RuntimeError(
            f"torch {torch.__version__} has no torch._functorch._aot_autograd.complex_decomposition."
            "decompose_complex_in_graph (it ships with torch >= 2.14)"
        ) from e
    gm = program.module()
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return decompose_complex_in_graph(gm, pytree.tree_leaves((tuple(args), dict(kwargs))))


# --------------------------------------------------------------------------------------
# Strategies side by side
# --------------------------------------------------------------------------------------


Lowering = Callable[[torch.export.ExportedProgram, tuple[Any, ...], Mapping[str, Any]], fx.GraphModule]


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A way to lower an exported program to a graph without complex values.

    ``lower(program, args, kwargs)`` returns a GraphModule. ``flat_inputs`` says how to call
    it: with ``(*args, **kwargs)`` (signature kept) or with the flat pytree leaves.
    """

    name: str
    lower: Lowering
    flat_inputs: bool = False

    def call(self, gm: fx.GraphModule, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Run a graph this strategy returned on the program's inputs, without autograd."""
        with torch.no_grad():
            if self.flat_inputs:
                return gm(*pytree.tree_leaves((tuple(args), dict(kwargs))))
            return gm(*args, **kwargs)


def _tetrt_lowering(strategy: str) -> Lowering:
    def run(program: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> fx.GraphModule:
        from tetrt_support.complex import lower

        return lower(program, strategy=strategy)

    run.__name__ = f"lower_{strategy}"
    return run


def tetrt_strategy(name: str) -> Strategy:
    """``tetrt_support.complex.lower(program, strategy=name)`` as a :class:`Strategy`."""
    if name not in ("rewrite", "retrace"):
        raise ValueError(f"tetrt lowers by 'rewrite' or 'retrace', got {name!r}")
    return Strategy(name, _tetrt_lowering(name))


TORCH_DECOMPOSE = Strategy("decompose_complex_in_graph", torch_decompose_complex, flat_inputs=True)


@dataclasses.dataclass(frozen=True)
class StrategyReport:
    """What one strategy did to one program."""

    strategy: str
    nodes: int  # call_function nodes after lowering
    complex_valued: int  # nodes whose value is still complex
    left_behind: tuple[str, ...]  # ops of the nodes that still produce or read complex values
    new_ops: tuple[str, ...]  # ops the lowering introduced
    max_abs_error: float  # against the reference output
    seconds: float  # median lowering time
    keeps_signature: bool  # called with the exported (*args, **kwargs)
    graph: fx.GraphModule = dataclasses.field(repr=False, compare=False)


def compare_strategies(
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    strategies: Sequence[Strategy],
    *,
    reference: Any = None,
    repeats: int = 1,
) -> list[StrategyReport]:
    """Lower ``program`` with each strategy and report node counts, leftovers, error and time.

    ``reference`` is the expected output (e.g. the eager model's); by default
    ``program.module()(*args, **kwargs)``. Each lowering runs ``repeats`` times (median
    wall time); the last result is measured and kept in ``StrategyReport.graph``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if reference is None:
        with torch.no_grad():
            reference = program.module()(*args, **kwargs)
    before = op_histogram(program)
    reports = []
    for strategy in strategies:
        times = []
        for _ in range(repeats):
            with Stopwatch() as watch:
                gm = strategy.lower(program, args, kwargs)
            times.append(watch.wall_s)
        after = op_histogram(gm)
        left = sorted({op_name(n) if n.op == "call_function" else n.op for n in _touching_complex(gm)})
        reports.append(
            StrategyReport(
                strategy=strategy.name,
                nodes=sum(after.values()),
                complex_valued=len(complex_valued_nodes(gm)),
                left_behind=tuple(left),
                new_ops=tuple(sorted(set(after) - set(before))),
                max_abs_error=max_abs_error(reference, strategy.call(gm, args, kwargs)),
                seconds=statistics.median(times),
                keeps_signature=not strategy.flat_inputs,
                graph=gm,
            )
        )
    return reports


def strategy_table(program: torch.export.ExportedProgram, reports: Sequence[StrategyReport], *, tolerance: float = 1e-5) -> Table:
    """The strategy table (no timings: they are not stable outputs).

    The exported program itself is the first row, for scale.
    """
    headers = ["graph", "call_function nodes", "complex-valued nodes", "ops still touching complex", "keeps signature", f"max abs error < {tolerance:g}"]
    rows: list[tuple[Any, ...]] = [
        ("exported", sum(op_histogram(program).values()), len(complex_valued_nodes(program)), "(the input)", True, "-")
    ]
    for r in reports:
        rows.append((r.strategy, r.nodes, r.complex_valued, r.left_behind or "-", r.keeps_signature, r.max_abs_error < tolerance))
    return Table(rows, headers)


# --------------------------------------------------------------------------------------
# RoPE rotation plot data
# --------------------------------------------------------------------------------------


class RotationTrace(NamedTuple):
    """Where the unit vector ``(1, 0)`` of one feature pair goes, position by position."""

    pair: int
    frequency: float  # radians per position
    positions: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor


def rope_rotation_traces(rope: torch.nn.Module, pairs: Sequence[int], positions: int) -> list[RotationTrace]:
    """Run ``rope`` (a zoo RoPE module taking ``q, k`` of ``[batch, seq, heads, head_dim]``)
    on a query whose every feature pair is ``(1, 0)``, and read back each chosen pair.

    The points come from the module itself (not from the formula), so the plot shows what the
    code computes. The frequency of pair ``i`` is recovered from position 1's angle.
    """
    head_dim = rope.head_dim
    bad = [p for p in pairs if not 0 <= p < head_dim // 2]
    if bad:
        raise ValueError(f"pairs {bad} out of range: head_dim={head_dim} has pairs 0..{head_dim // 2 - 1}")
    q = torch.zeros(1, positions, 1, head_dim)
    q[..., 0::2] = 1.0
    with torch.no_grad():
        rotated, _ = rope(q, q)
    traces = []
    for p in pairs:
        x, y = rotated[0, :, 0, 2 * p], rotated[0, :, 0, 2 * p + 1]
        frequency = math.atan2(float(y[1]), float(x[1])) if positions > 1 else 0.0
        traces.append(RotationTrace(p, frequency, torch.arange(positions), x.clone(), y.clone()))
    return traces


def relative_position_invariance(rope: torch.nn.Module, positions: int, seed: int = 0) -> float:
    """Max spread of ``<rope(q)_m, rope(k)_n>`` over all ``(m, n)`` with the same ``m - n``.

    The same ``q`` and ``k`` are placed at every position; RoPE's defining property is that
    their attention score depends only on the offset, so the spread is ~0 (float32 noise).
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 1, rope.head_dim, generator=g).expand(1, positions, 1, rope.head_dim).contiguous()
    k = torch.randn(1, 1, 1, rope.head_dim, generator=g).expand(1, positions, 1, rope.head_dim).contiguous()
    with torch.no_grad():
        rq, rk = rope(q, k)
    scores = rq[0, :, 0] @ rk[0, :, 0].T  # [m, n]
    spread = 0.0
    for offset in range(-positions + 1, positions):
        diagonal = torch.diagonal(scores, offset=-offset)
        spread = max(spread, float(diagonal.max() - diagonal.min()))
    return spread
