"""An engine with the compile options applied, and the passes that finish their work.

:class:`ConfiguredEngine` wraps the real engine's ``supports`` and ``build`` with the options
of :class:`~tetrt_support.compiler.settings.CompilationSettings` (``torch_executed_ops``,
``truncate_double``, weights as inputs for refit, failed builds returned as
:class:`FailedBuild`). :func:`run_failed_builds_in_pytorch` and
:func:`check_full_compilation` finish ``pass_through_build_failures`` and
``require_full_compilation``. Details: ``docs/architecture.md`` ("Module notes").
"""

from __future__ import annotations

import copy
import operator
import re
import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from tetrt_support.compiler.engines.base import DynamicDims, Engine, attribute_at, standalone_block
from tetrt_support.compiler.partition import block_kind, run_block_in_pytorch
from tetrt_support.compiler.functionalize import writes_in_place
from tetrt_support.compiler.settings import CompilationSettings, op_qualified_name

if TYPE_CHECKING:
    from tetrt_support.compiler.context import CompileContext


def replace_tensor_attribute(owner: torch.nn.Module, field: str, value: torch.Tensor) -> None:
    """Put ``value`` where ``owner.field`` is, as the same kind of attribute (a Parameter
    keeps its ``requires_grad``, a buffer stays a buffer), without writing into the old
    tensor: that one may be shared with the caller's program."""
    old = getattr(owner, field)
    if isinstance(old, torch.nn.Parameter):
        owner._parameters[field] = torch.nn.Parameter(value, requires_grad=old.requires_grad)
    elif field in owner._buffers:
        owner._buffers[field] = value
    else:
        setattr(owner, field, value)


__all__ = [
    "ENGINES_THAT_BAKE_WEIGHTS",
    "BlockBuildError",
    "ConfiguredEngine",
    "FailedBuild",
    "Float64AsFloat32",
    "FullCompilationError",
    "WeightsAsInputs",
    "check_full_compilation",
    "lift_weights_to_inputs",
    "run_failed_builds_in_pytorch",
    "warn_unmatched_executed_ops",
]

#: Engines whose built artifact holds a copy of the block's weights (ONNX initializers,
#: a TensorRT plan). ONNX Runtime blocks take their weights as inputs instead (refittable);
#: TensorRT keeps its own refit path (torch_tensorrt's refitter), not run on a CPU.
ENGINES_THAT_BAKE_WEIGHTS = frozenset({"onnxruntime"})


class BlockBuildError(RuntimeError):
    """An engine block failed to build and ``pass_through_build_failures=True``."""


class FullCompilationError(RuntimeError):
    """``require_full_compilation=True`` and some ops would run in PyTorch."""


# --------------------------------------------------------------------------- weights as inputs
def lift_weights_to_inputs(block: fx.GraphModule) -> tuple[fx.GraphModule, list[str], list[torch.Tensor]]:
    """``block`` with every tensor it reads by ``get_attr`` turned into a trailing input.

    Returns the new block (no tensors of its own), the attribute names (the exported
    program's parameter/buffer names) and the tensors, in input order.
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    nodes = list(block.graph.nodes)
    for node in nodes:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node, lambda n: env[n])
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    by_target: dict[str, fx.Node] = {}
    for node in nodes:
        if node.op != "get_attr" or node.target in by_target:
            continue
        value = attribute_at(block, str(node.target))
        if not isinstance(value, torch.Tensor):
            continue
        ph = graph.placeholder("w_" + re.sub(r"\W", "_", str(node.target)))  # "0.weight": not an identifier
        ph.meta = dict(node.meta)
        by_target[str(node.target)] = ph
        names.append(str(node.target))
        tensors.append(value)
    for node in nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr" and str(node.target) in by_target:
            env[node] = by_target[str(node.target)]
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph._codegen = copy.deepcopy(block.graph._codegen)
    lifted = fx.GraphModule(block, graph, class_name=type(block).__name__)
    return lifted, names, tensors


def _set_path(root: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    *path, field = name.split(".")
    owner = root
    for part in path:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    if isinstance(value, torch.nn.Parameter):
        owner.register_parameter(field, value)
    else:
        owner.register_buffer(field, value)


class WeightsAsInputs(torch.nn.Module):
    """An engine block built with its weights as trailing inputs, and those weights.

    ``weights`` mirrors the exported program's names (``weights.layers.0.mlp.weight``),
    so the compiled module's ``state_dict`` lists what the engine computes with and
    :func:`~tetrt_support.compiler.refit.refit_module_weights` can replace it; ``graph``
    is the block's ATen graph over the same inputs (what a saved program runs).
    """

    def __init__(
        self, engine_block: torch.nn.Module, graph: fx.GraphModule, names: list[str], tensors: list[torch.Tensor]
    ) -> None:
        super().__init__()
        self.engine_block = engine_block
        self.graph_module = graph
        self.weight_names = list(names)
        self.weights = torch.nn.Module()
        for name, tensor in zip(names, tensors):
            _set_path(self.weights, name, tensor)

    def weight_values(self) -> list[torch.Tensor]:
        return [attribute_at(self.weights, name) for name in self.weight_names]

    def forward(self, *inputs: torch.Tensor) -> Any:
        weights = self.weight_values()
        if not getattr(self.engine_block, "has_backward", True):  # weights are constants, as in TRT
            weights = [w.detach() for w in weights]
        return self.engine_block(*inputs, *weights)

    def as_pytorch(self) -> torch.nn.Module:
        """The same computation in PyTorch ops (traceable by torch.export)."""
        return _GraphWithWeights(self.graph_module, self.weights, self.weight_names)


class _GraphWithWeights(torch.nn.Module):
    def __init__(self, graph: fx.GraphModule, weights: torch.nn.Module, names: list[str]) -> None:
        super().__init__()
        self.graph_module = graph
        self.weights = weights
        self.weight_names = list(names)

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.graph_module(*inputs, *(attribute_at(self.weights, n) for n in self.weight_names))


# --------------------------------------------------------------------------- truncate_double
def _truncated_to_float32(block: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``block`` computing in float32 where it computed in float64:
    float64 tensors it reads become float32 copies, ``dtype=torch.float64`` arguments float32."""
    twin = standalone_block(block)
    for node in twin.graph.nodes:
        if node.op == "get_attr":
            value = attribute_at(twin, str(node.target))
            if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
                *path, field = str(node.target).split(".")
                owner = twin.get_submodule(".".join(path)) if path else twin
                replace_tensor_attribute(owner, field, value.detach().to(torch.float32))
        if node.kwargs.get("dtype") is torch.float64:
            node.kwargs = {**node.kwargs, "dtype": torch.float32}
        node.args = tuple(torch.float32 if a is torch.float64 else a for a in node.args)
    twin.recompile()
    return twin


def _reads_float64(block: fx.GraphModule, example_inputs: list[torch.Tensor]) -> bool:
    if any(isinstance(x, torch.Tensor) and x.dtype == torch.float64 for x in example_inputs):
        return True
    for node in block.graph.nodes:
        if node.op == "get_attr":
            value = attribute_at(block, str(node.target))
            if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
                return True
    return False


class Float64AsFloat32(torch.nn.Module):
    """Runs a float32 engine block for a float64 one: casts in, casts float64 outputs back."""

    def __init__(self, engine_block: torch.nn.Module, float64_outputs: list[bool]) -> None:
        super().__init__()
        self.engine_block = engine_block
        self.float64_outputs = list(float64_outputs)

    def forward(self, *inputs: torch.Tensor) -> Any:
        cast = [x.to(torch.float32) if isinstance(x, torch.Tensor) and x.dtype == torch.float64 else x for x in inputs]
        leaves, spec = pytree.tree_flatten(self.engine_block(*cast))
        back = [
            leaf.to(torch.float64) if wide and isinstance(leaf, torch.Tensor) else leaf
            for leaf, wide in zip(leaves, self.float64_outputs)
        ]
        return pytree.tree_unflatten(back, spec)

    def as_pytorch(self) -> torch.nn.Module:
        from tetrt_support.compiler.pytorch_twin import as_pytorch

        return Float64AsFloat32(as_pytorch(self.engine_block), self.float64_outputs)


# --------------------------------------------------------------------------- build failures
class FailedBuild(torch.nn.Module):
    """What ``build`` returns when the engine failed: the block, run in PyTorch, and why.

    It never survives the pipeline: :func:`run_failed_builds_in_pytorch` raises or turns
    it into a fallback block.
    """

    def __init__(self, block: fx.GraphModule, engine: str, error: BaseException) -> None:
        super().__init__()
        self.block = block
        self.engine = engine
        self.error = error

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.block(*inputs)


def _plain_graph_module(block: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``block`` as a plain ``GraphModule``, as fallback blocks are."""
    graph = fx.Graph()
    graph._codegen = copy.deepcopy(block.graph._codegen)
    graph.output(graph.graph_copy(block.graph, {}))
    return fx.GraphModule(block, graph)


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


class ConfiguredEngine(Engine):
    """``engine`` with ``settings`` applied; see the module docstring."""

    def __init__(self, engine: Engine, settings: CompilationSettings) -> None:
        self.inner = engine
        self.settings = settings
        self.name = engine.name
        self.complex_dtypes = engine.complex_dtypes

    def supports(self, node: fx.Node) -> bool:
        if node.op == "call_function" and self.settings.forces_node_to_pytorch(node):
            return False
        if writes_in_place(node):  # a mutation left after functionalization runs in PyTorch
            return False
        return self.inner.supports(node)

    def supports_op(self, node: fx.Node) -> bool:
        return self.inner.supports_op(node)

    def build(
        self, block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None = None
    ) -> torch.nn.Module:
        try:
            return self.build_block(block, example_inputs, dynamic_dims)
        except Exception as error:  # noqa: BLE001 - any engine failure: the pass decides
            return FailedBuild(_plain_graph_module(block), self.name, error)

    def build_block(
        self, block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None
    ) -> torch.nn.Module:
        if self.settings.truncate_double and _reads_float64(block, example_inputs):
            with torch.no_grad():
                outputs = pytree.tree_leaves(block(*example_inputs))
            wide = [isinstance(o, torch.Tensor) and o.dtype == torch.float64 for o in outputs]
            narrow_inputs = [
                x.to(torch.float32) if isinstance(x, torch.Tensor) and x.dtype == torch.float64 else x
                for x in example_inputs
            ]
            built = self._build_with_weights(_truncated_to_float32(block), narrow_inputs, dynamic_dims)
            return Float64AsFloat32(built, wide)
        return self._build_with_weights(block, example_inputs, dynamic_dims)

    def _build_with_weights(
        self, block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None
    ) -> torch.nn.Module:
        if self.name not in ENGINES_THAT_BAKE_WEIGHTS:
            return self.inner.build(block, example_inputs, dynamic_dims)
        lifted, names, tensors = lift_weights_to_inputs(block)
        if not names:
            return self.inner.build(block, example_inputs, dynamic_dims)
        dims = None if dynamic_dims is None else [*dynamic_dims, *({} for _ in names)]
        built = self.inner.build(lifted, [*example_inputs, *(t.detach() for t in tensors)], dims)
        return WeightsAsInputs(built, lifted, names, tensors)


# --------------------------------------------------------------------------- passes
def run_failed_builds_in_pytorch(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """Each :class:`FailedBuild`: raise (``pass_through_build_failures=True``), or run the
    block in PyTorch as ``fallback_<name>`` with a warning naming it and the error."""
    settings: CompilationSettings = ctx.settings
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or block_kind(str(node.target)) != "engine":
            continue
        module = gm.get_submodule(str(node.target))
        if not isinstance(module, FailedBuild):
            continue
        name = str(node.target)
        ops = ctx.block_ops.get(name, ())
        what = f"engine block {name} ({len(ops)} ops)" if ops else f"engine block {name}"
        if settings.pass_through_build_failures:
            raise BlockBuildError(
                f"the {module.engine} engine failed to build {what}: {_reason(module.error)} "
                f"(pass_through_build_failures=True; with False it would run in PyTorch instead)"
            ) from module.error
        new = run_block_in_pytorch(gm, ctx, name, module.block)
        warnings.warn(
            f"the {module.engine} engine failed to build {what} ({_reason(module.error)}); "
            f"it runs in PyTorch as {new}",
            stacklevel=2,
        )
    gm.recompile()
    return gm


def _call_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The ``call_function`` nodes of ``gm`` and of its (not yet built) block graphs."""
    found = [n for n in gm.graph.nodes if n.op == "call_function"]
    for name, child in gm.named_children():
        if block_kind(name) is not None and isinstance(child, fx.GraphModule):
            found += [n for n in child.graph.nodes if n.op == "call_function"]
    return found


def warn_unmatched_executed_ops(gm: fx.GraphModule, settings: CompilationSettings) -> None:
    """Warn naming each ``torch_executed_ops`` entry that no op of the partitioned ``gm``
    matches (by itself or by what it decomposes to): it forces nothing into PyTorch, which
    is usually a name the graph does not use (e.g. an op of another overload)."""
    if not settings.torch_executed_ops:
        return
    matched: set[Any] = set()
    for node in _call_nodes(gm):
        matched |= settings.matching_executed_ops(node)
    unmatched = sorted(op_qualified_name(op) for op in settings.torch_executed_ops - matched)
    for name in unmatched:
        warnings.warn(
            f"torch_executed_ops: {name} matches no op of the graph, before or after its "
            f"decomposition to core ATen; it forces nothing into PyTorch",
            stacklevel=3,
        )


def _source_line(node: fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    files = [ln for ln in lines if ln.startswith("File ")]
    if files:
        where = files[-1]
        code = lines[lines.index(where) + 1] if lines.index(where) + 1 < len(lines) else ""
        return f"{where}: {code}" if code else where
    return "no source line recorded"


def _pytorch_nodes(gm: fx.GraphModule) -> list[tuple[str, fx.Node]]:
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_module" or block_kind(str(node.target)) != "fallback":
            continue
        block = gm.get_submodule(str(node.target))
        graph = getattr(block, "graph", None)
        for inner in graph.nodes if graph is not None else ():
            if inner.op == "call_function" and inner.target is not operator.getitem:
                found.append((str(node.target), inner))
    return found


def check_full_compilation(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """``require_full_compilation=True``: raise unless every op runs in an engine block,
    naming each op left to PyTorch, its block and its source line."""
    if not ctx.settings.require_full_compilation:
        return gm
    left = _pytorch_nodes(gm)
    if left:
        lines = [f"  {op_qualified_name(n.target)} in {block} at {_source_line(n)}" for block, n in left]
        raise FullCompilationError(
            f"require_full_compilation=True, but {len(left)} op(s) would run in PyTorch, outside "
            f"the {ctx.engine_name} engine:\n" + "\n".join(lines)
        )
    return gm
