"""Split a lowered graph into engine blocks and PyTorch fallback blocks.

:class:`EngineSupport` takes a node only if every value it reads or writes is real and the
engine implements the op; torch.fx's ``CapabilityBasedPartitioner`` (as in Torch-TensorRT)
groups such nodes into blocks, and what is left becomes fallback blocks: ``engine_0``,
``fallback_0``, .... :func:`block_of` follows a multi-output block's ``getitem`` back to the
block; :func:`run_block_in_pytorch` is the one place that demotes (renames) a block.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.utils import _pytree as pytree

from tetrt_support.complex._inline import inline_grad_mode_wrappers
from tetrt_support.complex.detect import is_complex_value, touches_complex

if TYPE_CHECKING:
    from tetrt_support.compiler.context import CompileContext

__all__ = [
    "BLOCK_OPS_KEY",
    "ENGINE_PREFIX",
    "FALLBACK_PREFIX",
    "Block",
    "EngineSupport",
    "FallbackSupport",
    "SupportsNodes",
    "block_kind",
    "block_ops",
    "block_of",
    "blocks_of",
    "blocks_summary",
    "compute_op_count",
    "is_real_valued",
    "partition",
    "prepare_for_partitioning",
    "run_block_in_pytorch",
]

ENGINE_PREFIX = "engine_"
#: ``meta`` key of a compiled module: block name -> its ATen ops, recorded before an engine
#: replaces the graph
BLOCK_OPS_KEY = "tetrt_block_ops"
FALLBACK_PREFIX = "fallback_"


class SupportsNodes(Protocol):
    """The part of an engine the partitioner needs: op-level support."""

    def supports(self, node: fx.Node) -> bool: ...


def is_real_valued(node: fx.Node) -> bool:
    """True iff the node and its inputs have recorded values and none is complex.

    A node without ``meta["val"]`` cannot be proven real, so it is not engine-capable:
    sending an unknown value to an engine that has no complex dtype could only fail later,
    far from the cause.
    """
    return all("val" in n.meta for n in (node, *node.all_input_nodes)) and not touches_complex(node)


def _is_aten_or_getitem(node: fx.Node) -> bool:
    return node.op == "call_function" and (
        isinstance(node.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
        or node.target is operator.getitem
    )


def _is_symbolic_scalar(node: fx.Node) -> bool:
    """A node computing a size (``aten.sym_size.int`` and arithmetic on it), not a tensor."""
    return node.op == "call_function" and isinstance(
        node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)
    )


_ASSERTIONS = tuple(
    op
    for op in (
        getattr(torch.ops.aten, "_assert_tensor_metadata", None),
        getattr(torch.ops.aten, "_assert_scalar", None),
        getattr(torch.ops.aten, "sym_constrain_range_for_size", None),
        getattr(torch.ops.aten, "_assert_async", None),
    )
    if op is not None
)


#: torch's functions on symbolic scalars (``min(a.shape[-1], b.shape[-1])`` is ``sym_min``)
_SYM_NAMES = (
    "sym_min", "sym_max", "sym_float", "sym_int", "sym_not", "sym_ite", "sym_sum", "_sym_sqrt",
)  # fmt: skip
_SYM_FUNCTIONS = frozenset(
    f for f in (getattr(torch, name, None) for name in _SYM_NAMES) if f is not None
)


def _is_size_arithmetic(node: fx.Node) -> bool:
    """Python arithmetic on symbolic sizes (``operator.mul`` of two ``sym_size`` values,
    ``torch.sym_min`` of two lengths...): what export records for a size computed in Python,
    e.g. ``torch.arange(b * s)``. It computes nothing on tensors, so it never splits a block."""
    target = node.target
    return (
        node.op == "call_function"
        and (
            target in _SYM_FUNCTIONS
            or getattr(target, "__module__", None) in ("_operator", "operator", "math")
        )
        and target is not operator.getitem
        and isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))
    )


def _is_assertion(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "overloadpacket", None) in _ASSERTIONS


_CONVERSIONS = (torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout, torch.ops.aten.to.device)


def _normalize_conversion(graph: fx.Graph, node: fx.Node) -> None:
    """``aten.to`` to what the tensor already is -> the tensor; otherwise -> ``_to_copy``.

    ``aten.to`` is CompositeImplicit: export keeps it, engines translate ``_to_copy``.
    """
    src, out = node.args[0], node.meta.get("val")
    src_val = src.meta.get("val") if isinstance(src, fx.Node) else None
    if not isinstance(out, torch.Tensor) or not isinstance(src_val, torch.Tensor):
        return
    if out.dtype == src_val.dtype and out.device == src_val.device and not node.kwargs.get("copy", False):
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        return
    if out.device != src_val.device:
        return  # a device move is not a block's business
    with graph.inserting_before(node):
        copy = graph.call_function(torch.ops.aten._to_copy.default, (src,), {"dtype": out.dtype})
    copy.meta = dict(node.meta)
    node.replace_all_uses_with(copy)
    graph.erase_node(node)


def prepare_for_partitioning(gm: fx.GraphModule) -> None:
    """Small clean-ups so that block boundaries fall on tensors, as Torch-TensorRT's
    lowering passes do before it partitions:

    - inline each ``torch.no_grad()`` region (``wrap_with_set_grad_enabled`` of a
      submodule, in a program exported with grad on): no engine takes a higher-order op and
      no fallback block holds one, so it ran in PyTorch between the blocks, uncounted, and the
      sizes it took made a fallback block of ``sym_size`` reads (Xcodec2's semantic model);
    - drop export's run-time assertions (``_assert_tensor_metadata``, ``_assert_scalar``):
      they have no users and would otherwise form PyTorch blocks of their own;
    - ``aten.to`` to the dtype and device the tensor already has is the tensor itself,
      and any other dtype conversion is the ``_to_copy`` it decomposes to;
    - give every user of a symbolic size (``sym_size.int``) its own copy of it, so each
      block computes the sizes it needs from its tensor inputs: engines take and return
      tensors, not SymInts.
    """
    inline_grad_mode_wrappers(gm)
    graph = gm.graph
    for node in list(graph.nodes):
        if _is_assertion(node) and not node.users:
            graph.erase_node(node)
        elif node.op == "call_function" and node.target in _CONVERSIONS:
            _normalize_conversion(graph, node)
    for node in reversed(list(graph.nodes)):
        if not _is_symbolic_scalar(node) or len(node.users) < 2:
            continue
        for user in list(node.users)[1:]:
            with graph.inserting_after(node):
                twin = graph.node_copy(node)
            twin.meta = dict(node.meta)
            user.replace_input_with(node, twin)
    graph.lint()
    gm.recompile()


def _argument(node: fx.Node, schema_arg: Any, position: int) -> Any:
    if schema_arg.name in node.kwargs:
        return node.kwargs[schema_arg.name]
    if position < len(node.args):
        return node.args[position]
    return schema_arg.default_value if schema_arg.has_default_value() else None


def draws_random_numbers(node: fx.Node) -> bool:
    """An ATen op tagged ``nondeterministic_seeded`` (randn, rand, normal, bernoulli, ...)
    that really draws here: a dropout (or attention) whose probability is 0, or whose
    ``train`` flag is False, draws nothing."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    values = {a.name: _argument(node, a, i) for i, a in enumerate(target._schema.arguments)}
    if values.get("train", values.get("training", True)) is False:
        return False
    probability = values.get("dropout_p", values.get("p"))
    return not (target._schema.name.endswith(("dropout", "attention")) and probability == 0)


class EngineSupport(OperatorSupportBase):
    """A node goes to the engine iff its values are all real and the engine runs the op.

    Ops that draw random numbers stay in PyTorch: there they draw from torch's generator,
    so a compiled module reproduces ``ep.module()`` under the same ``torch.manual_seed``
    (an engine's own generator would draw other numbers) and can be checked against it.

    ``get_attr`` nodes (weights, lowered constants) follow their users, so that an engine
    block owns its weights instead of receiving them as inputs on every call.
    """

    def __init__(self, engine: SupportsNodes) -> None:
        self.engine = engine

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: fx.Node) -> bool:
        if node.op == "get_attr":
            return bool(node.users) and "val" in node.meta and all(
                u.op == "call_function" and self.is_node_supported(submodules, u) for u in node.users
            ) and not is_complex_value(node.meta["val"])
        if _is_size_arithmetic(node):  # b * s - 1 on sizes: computed where its (single) user is,
            # so that no engine block takes a plain int (a SymInt) as an input
            return bool(node.users) and all(self.is_node_supported(submodules, u) for u in node.users)
        if not _is_aten_or_getitem(node) or draws_random_numbers(node):
            return False
        if _is_symbolic_scalar(node):  # a size goes where its (single) user goes
            return bool(node.users) and all(self.is_node_supported(submodules, u) for u in node.users) and bool(
                self.engine.supports(node)
            )
        return is_real_valued(node) and bool(self.engine.supports(node))


class FallbackSupport(OperatorSupportBase):
    """Every ATen op (or getitem) left in the parent graph after the engine blocks are cut.

    Python-level calls (a namedtuple constructor a retrace recorded, ``_guards_fn``) and
    the engine blocks themselves (``call_module``) stay where they are.
    """

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: fx.Node) -> bool:
        if node.op == "get_attr":
            return bool(node.users) and all(self.is_node_supported(submodules, u) for u in node.users)
        if node.op == "call_function" and node.target is operator.getitem:
            src = node.args[0]
            return isinstance(src, fx.Node) and src.op == "call_function"
        return _is_aten_or_getitem(node)


def _in_topological_order(gm: fx.GraphModule, partitions: list[Partition]) -> list[dict[fx.Node, int | None]]:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    ordered = sorted(partitions, key=lambda p: min(order[n] for n in p.nodes))
    return [dict(p.nodes) for p in ordered]


def compute_op_count(nodes: Any) -> int:
    """Compute ops among ``nodes`` as Torch-TensorRT counts them for ``min_block_size``:
    ``call_function`` nodes other than ``operator.getitem`` (its capability-based
    ``TRTPartitioner``, the one this partitioner mirrors; its fast partitioner counts
    getitem nodes too)."""
    return sum(n.op == "call_function" and n.target is not operator.getitem for n in nodes)


def _fuse(gm: fx.GraphModule, support: OperatorSupportBase, prefix: str, min_block_size: int = 1) -> None:
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    partitions = [p for p in partitioner.propose_partitions() if any(n.op != "get_attr" for n in p.nodes)]
    # Too small to be worth an engine: its nodes stay in the graph for the fallback blocks.
    partitions = [p for p in partitions if compute_op_count(p.nodes) >= min_block_size]
    if partitions:
        fuse_by_partitions(gm, _in_topological_order(gm, partitions), prefix=prefix)
    _record_block_values(gm, prefix)


def _record_block_values(gm: fx.GraphModule, prefix: str) -> None:
    """Give block calls and their getitems the ``meta["val"]`` of the block's outputs.

    fuse_by_partitions inserts the call without values; the output boundary needs them to
    tell a packed-real output from a genuinely complex one.
    """
    for node in gm.graph.nodes:
        if node.op != "call_module" or not node.target.startswith(prefix):
            continue
        sub = gm.get_submodule(node.target)
        outs = sub.graph.output_node().args[0]
        vals = [o.meta.get("val") if isinstance(o, fx.Node) else o for o in pytree.tree_leaves(outs)]
        if isinstance(outs, fx.Node):
            node.meta["val"] = vals[0]
            continue
        node.meta["val"] = tuple(vals)
        for user in node.users:
            if user.target is operator.getitem and isinstance(user.args[1], int):
                user.meta["val"] = vals[user.args[1]]


def _keep_blocks_that_write(gm: fx.GraphModule) -> None:
    """Mark a block holding an in-place op impure, so dead-code elimination keeps it: a block
    whose only effect is a write (``copy_`` into a buffer another block reads) has no users."""
    for node in gm.graph.nodes:
        if node.op != "call_module" or block_kind(str(node.target)) is None:
            continue
        block = gm.get_submodule(str(node.target))
        graph = getattr(block, "graph", None)
        if graph is not None and any(
            n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
            for n in graph.nodes
        ):
            block._is_impure = True


def partition(gm: fx.GraphModule, engine: SupportsNodes, *, min_block_size: int = 1) -> fx.GraphModule:
    """Cut ``gm`` in place into ``engine_i`` and ``fallback_j`` submodules, in graph order.

    An engine block with fewer than ``min_block_size`` compute ops
    (:func:`compute_op_count`) is not cut: its ops run in a fallback block.
    """
    prepare_for_partitioning(gm)
    _fuse(gm, EngineSupport(engine), ENGINE_PREFIX, min_block_size)
    _fuse(gm, FallbackSupport(), FALLBACK_PREFIX)
    _keep_blocks_that_write(gm)
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def block_kind(name: str) -> str | None:
    """``"engine"``, ``"fallback"`` or None for a submodule name."""
    if name.startswith(ENGINE_PREFIX):
        return "engine"
    if name.startswith(FALLBACK_PREFIX):
        return "fallback"
    return None


def run_block_in_pytorch(gm: fx.GraphModule, ctx: CompileContext, name: str, module: torch.nn.Module) -> str:
    """Demote engine block ``name`` of ``gm``: ``module`` (the block's graph, in PyTorch) runs
    in its place as a fallback block, ``fallback_<name>`` (``fallback_<name>_<i>`` if that is
    taken); what ``ctx`` recorded under the old name moves to the new one. Returns the new name."""
    new, i = f"{FALLBACK_PREFIX}{name}", 0
    while hasattr(gm, new):
        i += 1
        new = f"{FALLBACK_PREFIX}{name}_{i}"
    gm.add_module(new, module)
    delattr(gm, name)
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target == name:
            node.target = new
    for recorded in (ctx.block_ops, ctx.block_weights):
        if recorded is not None and name in recorded:
            recorded[new] = recorded.pop(name)
    gm.recompile()
    return new


def block_of(node: Any) -> fx.Node | None:
    """The block call whose output ``node`` is: the call itself, or a getitem of it."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function" and node.target is operator.getitem:
        node = node.args[0]
        if not isinstance(node, fx.Node):
            return None
    if node.op == "call_module" and block_kind(str(node.target)) is not None:
        return node
    return None


@dataclasses.dataclass(frozen=True)
class Block:
    """One block of a compiled module: where it runs and which ops it holds."""

    name: str
    kind: str  # "engine" or "fallback"
    runner: str  # the class that runs it (an engine module, or GraphModule for PyTorch)
    ops: tuple[str, ...]  # ATen ops of the block graph, in order (empty if the graph is gone)


def block_ops(module: torch.nn.Module) -> tuple[str, ...]:
    graph = getattr(module, "graph", None)
    block = getattr(module, "block", None)  # engines may keep the source block
    if graph is None and isinstance(block, fx.GraphModule):
        graph = block.graph
    if graph is None:
        return ()
    return tuple(str(n.target) for n in graph.nodes if n.op == "call_function")


def blocks_of(gm: torch.nn.Module) -> list[Block]:
    """The blocks of a compiled (or merely partitioned) module, in call order."""
    called = [n.target for n in gm.graph.nodes if n.op == "call_module"] if hasattr(gm, "graph") else []
    names = [t for t in called if block_kind(str(t))] or [n for n, _ in gm.named_children() if block_kind(n)]
    recorded = getattr(gm, "meta", {}).get(BLOCK_OPS_KEY, {})
    out = []
    for name in names:
        mod = gm.get_submodule(name)
        ops = tuple(recorded.get(name, ())) or block_ops(mod)
        runner = getattr(mod, "engine_block", mod)  # an engine wrapped with its weights: the engine
        out.append(Block(name, block_kind(name) or "", type(runner).__name__, ops))
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def blocks_summary(gm: torch.nn.Module) -> str:
    """E.g. ``"1 engine block, 0 fallback blocks"``."""
    blocks = blocks_of(gm)
    n_engine = sum(b.kind == "engine" for b in blocks)
    n_fallback = sum(b.kind == "fallback" for b in blocks)
    return f"{_plural(n_engine, 'engine block')}, {_plural(n_fallback, 'fallback block')}"
