"""``torch.compile(model, backend="tetrt", options={...})``: the compiler as a Dynamo backend.

:func:`tetrt_backend` exports each graph Dynamo captures to ATen and compiles it with
``tetrt_support.compile`` and ``options``, as Torch-TensorRT's ``"tensorrt"`` backend does
with its own compiler. "Backend" is torch.compile's word; ``options["backend"]`` names the
engine of the engine blocks. Importing :mod:`tetrt_support.compiler` registers it.
Differences from Torch-TensorRT: ``docs/architecture.md`` ("Module notes").
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx

from tetrt_support.compiler.configured_engine import BlockBuildError, FullCompilationError
from tetrt_support.compiler.settings import CompilationSettings, settings_from_options

__all__ = ["BACKEND_NAME", "register_backend", "tetrt_backend"]

BACKEND_NAME = "tetrt"


def _check_inference(example_inputs: Sequence[Any]) -> None:
    if not torch.is_grad_enabled():
        return
    needing = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
    if needing:
        raise RuntimeError(
            f"the {BACKEND_NAME!r} backend compiles inference graphs (its engines have no backward), "
            f"but grad mode is on and {len(needing)} graph input(s) require grad (parameters, "
            f"usually); call the compiled model under torch.no_grad()"
        )


def _size_source(symbol: Any, tensors: list[tuple[fx.Node, Any]]) -> tuple[fx.Node, int] | None:
    for node, fake in tensors:
        for dim, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt) and size.node.expr == symbol:
                return node, dim
    return None


def tensors_only(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[int], tuple[dict[int, Any] | None, ...]]:
    """A copy of Dynamo's graph that takes its tensor inputs only.

    Returns the graph, the positions of the tensor inputs among Dynamo's inputs, and
    ``dynamic_shapes`` for export (``Dim.DYNAMIC`` for each symbolic dim).
    """
    graph = copy.deepcopy(gm.graph)
    placeholders = list(graph.find_nodes(op="placeholder"))
    tensors = [(n, n.meta["example_value"]) for n in placeholders if isinstance(n.meta.get("example_value"), torch.Tensor)]
    positions = [i for i, n in enumerate(placeholders) if isinstance(n.meta.get("example_value"), torch.Tensor)]
    last = tensors[-1][0] if tensors else placeholders[-1]
    for node in placeholders:
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            continue
        if not isinstance(value, torch.SymInt):
            raise NotImplementedError(
                f"graph input {node.name} is a {type(value).__name__}; the {BACKEND_NAME!r} backend compiles "
                f"graphs of tensor (and tensor-size) inputs"
            )
        source = _size_source(value.node.expr, tensors)
        if source is None:
            raise NotImplementedError(
                f"graph input {node.name} is the symbolic int {value}, which is no size of a tensor "
                f"input; engine blocks take tensors only"
            )
        with graph.inserting_after(last):
            size = graph.call_function(torch.ops.aten.sym_size.int, source)
        size.meta["example_value"] = value
        node.replace_all_uses_with(size)
        graph.erase_node(node)
    dynamic = tuple(
        {d: torch.export.Dim.DYNAMIC for d, s in enumerate(fake.shape) if isinstance(s, torch.SymInt)} or None
        for _, fake in tensors
    )
    return fx.GraphModule(gm, graph), positions, dynamic


def _compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], settings: CompilationSettings) -> Callable[..., Any]:
    from tetrt_support.compiler.pipeline import compile_program

    flat_gm, positions, dynamic = tensors_only(gm)
    tensors = tuple(example_inputs[i] for i in positions)
    # Outside Dynamo's tracing context: torch.export (here and in the engines) must make its
    # own ShapeEnv and guards, not add to those of the frame Dynamo is compiling.
    with torch._guards.tracing(None), torch.no_grad():
        program = torch.export.export(
            flat_gm, tensors, dynamic_shapes=dynamic if any(d for d in dynamic) else None, strict=False
        )
        compiled = compile_program(program, settings)

    def run(*args: Any) -> Any:
        return compiled(*(args[i] for i in positions))

    run.compiled_module = compiled  # type: ignore[attr-defined] - for inspection
    return run


def tetrt_backend(
    gm: fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None
) -> Callable[..., Any]:
    """The Dynamo backend: compile ``gm`` with ``tetrt_support.compile``'s ``options``."""
    settings = settings_from_options(options)
    _check_inference(example_inputs)
    try:
        return _compile_graph(gm, example_inputs, settings)
    except (FullCompilationError, BlockBuildError):
        raise
    except (AssertionError, RuntimeError, TypeError, NotImplementedError) as error:
        if settings.pass_through_build_failures:
            raise
        n_ops = sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)
        first = (str(error).strip().splitlines() or [""])[0]
        warnings.warn(
            f"the {BACKEND_NAME!r} backend could not compile a graph of {n_ops} ops "
            f"({type(error).__name__}: {first}); it runs in PyTorch as Dynamo captured it",
            stacklevel=2,
        )
        return gm.forward


def register_backend() -> None:
    """Register :func:`tetrt_backend` with Dynamo as ``"tetrt"`` (idempotent).

    When Dynamo is itself loading the ``torch_dynamo_backends`` entry point, it registers
    the function after this import: registering here too would be a duplicate.
    """
    from torch._dynamo.backends import registry

    if BACKEND_NAME in registry._COMPILER_FNS:
        if registry._COMPILER_FNS[BACKEND_NAME] is not tetrt_backend:
            raise RuntimeError(f"another Dynamo backend is already registered as {BACKEND_NAME!r}")
        return
    if registry._BACKENDS.get(BACKEND_NAME) is not None:
        return  # an entry point Dynamo is loading (or will load) itself
    registry.register_backend(compiler_fn=tetrt_backend, name=BACKEND_NAME)
