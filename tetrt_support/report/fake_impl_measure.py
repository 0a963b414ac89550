"""Measure the two fake-impl strategies the same way in tests, benchmarks and notebooks.

A tiny MLP of quantized Linears trained for a few SGD steps, eagerly or under
``torch.compile(fullgraph=True)``, with the compile statistics that matter here: frames
compiled, graphs captured, graph breaks, the time of the first (compiling) step and of
the steady-state steps, and the FX code Dynamo captured (through the one
:class:`~tetrt_support.report.quant_tracing.GraphCapture`, timed with the one
:class:`~tetrt_support.report.timing.Stopwatch`).
"""

from __future__ import annotations

import ast
import inspect
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tetrt_support.quant.linear import Linear
from tetrt_support.quant.recipes import Recipe, get_recipe
from tetrt_support.report.quant_tracing import GraphCapture
from tetrt_support.report.tables import Table
from tetrt_support.report.timing import Stopwatch


def fp32_recipe(name: str) -> Recipe:
    """The recipe ``name`` for an fp32 model: TE's defaults, except that nvfp4's Hadamard
    transform takes the fp32 activations as TE's reference quantizer does
    (``rht_any_input_dtype=True``; TE's kernels take bf16 only and would refuse them)."""
    return get_recipe(name, rht_any_input_dtype=True) if name == "nvfp4" else get_recipe(name)


def tiny_mlp(
    recipe: str | Recipe, fake_impl: str, sizes: Sequence[int] = (64, 64, 32), *, seed: int = 0
) -> torch.nn.Sequential:
    """Linear -> ReLU -> ... -> Linear over ``sizes`` in fp32, deterministically initialised;
    a recipe name goes through :func:`fp32_recipe`, a Recipe is used as given. The layers
    compile as their custom ops (``compile_as="custom_ops"``): the fake impls are what is measured."""
    recipe = fp32_recipe(recipe) if isinstance(recipe, str) else recipe
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        if i:
            layers.append(torch.nn.ReLU())
        layers.append(Linear(fan_in, fan_out, recipe=recipe, fake_impl=fake_impl, compile_as="custom_ops"))
    return torch.nn.Sequential(*layers)


def mse_step(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The compiled unit: forward and loss (backward runs through the compiled autograd graph)."""
    return torch.nn.functional.mse_loss(model(x), target)


@dataclass
class TrainReport:
    """What a few training steps did, and what compiling them cost."""

    losses: list[float]
    frames: int = 0  # frames Dynamo compiled (1 = no recompiles)
    graphs: int = 0  # graphs Dynamo captured
    graph_breaks: int = 0
    first_step_s: float = 0.0  # wall clock; includes compilation when compiled
    step_s: list[float] = field(default_factory=list)  # wall clock of the later steps
    # CPU seconds of this process and its waited-for children (the C++ compiler): on a
    # shared, loaded machine far steadier than the wall clock, which counts waiting.
    first_step_cpu_s: float = 0.0
    step_cpu_s: list[float] = field(default_factory=list)

    @property
    def steady_step_s(self) -> float:
        return min(self.step_s) if self.step_s else float("nan")


def train(
    model: torch.nn.Module,
    x: torch.Tensor,
    target: torch.Tensor,
    *,
    steps: int = 3,
    backend: str | None = None,
    lr: float = 0.05,
) -> tuple[TrainReport, GraphCapture | None]:
    """``steps`` SGD steps of :func:`mse_step`; ``backend=None`` runs eagerly.

    Returns the report and the graphs Dynamo captured (None when eager).
    """
    from torch._dynamo.utils import counters

    step = mse_step
    capture = None
    if backend is not None:
        torch._dynamo.reset()
        counters.clear()
        capture = GraphCapture(backend)
        step = torch.compile(mse_step, backend=capture, fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    report = TrainReport(losses=[])
    for i in range(steps):
        with Stopwatch() as watch:
            opt.zero_grad(set_to_none=True)
            loss = step(model, x, target)
            loss.backward()
            opt.step()
            report.losses.append(loss.item())
        elapsed, elapsed_cpu = watch.wall_s, watch.cpu_s
        if i == 0:
            report.first_step_s, report.first_step_cpu_s = elapsed, elapsed_cpu
        else:
            report.step_s.append(elapsed)
            report.step_cpu_s.append(elapsed_cpu)
    if capture is not None:
        report.frames = capture.frames
        report.graphs = int(counters["stats"]["unique_graphs"])
        report.graph_breaks = sum(counters["graph_break"].values())
    return report, capture


def code_lines(path: str | pathlib.Path) -> int:
    """Non-blank, non-comment source lines, docstrings excluded (what a reviewer must read)."""
    source = pathlib.Path(path).read_text()
    docstring_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstring_lines.update(range(first.lineno, first.end_lineno + 1))
    return sum(
        1
        for n, line in enumerate(source.splitlines(), start=1)
        if line.strip() and not line.strip().startswith("#") and n not in docstring_lines
    )


def strategy_code_lines() -> dict[str, int]:
    """Code lines of each strategy's module and of the plumbing both share."""
    from tetrt_support.quant import fake_impls, ops
    from tetrt_support.quant.fake_impls import make_empty_traceable, tensor_proto

    return {
        "tensor_proto": code_lines(inspect.getfile(tensor_proto)),
        "make_empty_traceable": code_lines(inspect.getfile(make_empty_traceable)),
        "shared (ops.py + fake_impls/__init__.py)": code_lines(inspect.getfile(ops)) + code_lines(inspect.getfile(fake_impls)),
    }


def same_graphs_up_to_strategy(a: GraphCapture, strategy_a: str, b: GraphCapture, strategy_b: str) -> bool:
    """Whether two captures hold the same graphs node for node, up to the strategy name
    inside the custom ops' names (and the names of variables)."""

    def normalized(capture: GraphCapture, strategy: str) -> list[tuple[tuple[str, str], ...]]:
        return [tuple((op, target.replace(strategy, "<strategy>")) for op, target in sig) for sig in capture.signatures]

    return normalized(a, strategy_a) == normalized(b, strategy_b)


def schema_table(op: torch._ops.OpOverload) -> Table:
    """A custom op's schema as rows: each argument with its type, then each return."""
    schema = op._schema
    rows = [(a.name, str(a.type)) for a in schema.arguments]
    rows += [(f"return {i}", str(r.type)) for i, r in enumerate(schema.returns)]
    return Table(rows, ["argument", "type"], title=schema.name)


def _describe_arg(value: object) -> str:
    if isinstance(value, torch.fx.Node):
        return value.name
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe_arg(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return type(value).__name__  # an opaque value (a quantizer): its type, not its fields


def graph_head_table(gm: torch.fx.GraphModule, until_op: str) -> Table:
    """The first nodes of ``gm``, through the first call of ``until_op`` (e.g. ``"relu"``):
    each node's name and what it computes, ``op on arguments`` (nodes by name, opaque
    values by type), or ``graph input``. Two columns, so that long node and op names fit."""
    from tetrt_support.report.complex_graphs import op_name

    rows = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            rows.append((node.name, "graph input"))
            continue
        called = op_name(node)
        args = ", ".join([*(_describe_arg(a) for a in node.args),
                          *(f"{k}={_describe_arg(v)}" for k, v in node.kwargs.items())])
        rows.append((node.name, f"{called} on {args}" if args else called))
        if called == until_op:
            return Table(rows, ["node", "computes"])
    raise ValueError(f"the graph calls no {until_op!r}; it calls {sorted({op_name(n) for n in gm.graph.nodes})}")


def compile_matrix(
    recipes: Sequence[str], fake_impls: Sequence[str], *, backend: str = "aot_eager", steps: int = 3
) -> list[dict[str, object]]:
    """For each (fake impl, recipe name): compile stats of a few training steps of the fp32
    :func:`tiny_mlp` (its recipes are :func:`fp32_recipe`'s) and whether the losses equal the
    uncompiled run's (the same quantized model, so exactly)."""
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(32, 64, generator=g), torch.randn(32, 32, generator=g)
    rows = []
    for fake_impl in fake_impls:
        for recipe in recipes:
            eager, _ = train(tiny_mlp(recipe, fake_impl), x, target, steps=steps)
            compiled, _ = train(tiny_mlp(recipe, fake_impl), x, target, steps=steps, backend=backend)
            rows.append({
                "fake_impl": fake_impl, "recipe": recipe, "frames": compiled.frames, "graphs": compiled.graphs,
                "graph_breaks": compiled.graph_breaks, "losses == eager": compiled.losses == eager.losses,
                "loss drop": f"{compiled.losses[0]:.4f} -> {compiled.losses[-1]:.4f}",
            })
    return rows
