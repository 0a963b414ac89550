"""Turn in-place writes through views into functional ops before partitioning.

:func:`functionalize_view_writes` rewrites each ``copy_`` into a view of a tensor made in the
graph (``slice(new_empty) -> copy_``) into the view's scatter op, chained back to the base,
so an engine that exports its block cannot drop the write (``docs/architecture.md``,
"Module notes", view writes). What it cannot prove safe it leaves alone;
:func:`writes_in_place` lets an engine refuse such an op, which then runs in PyTorch.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

if TYPE_CHECKING:
    from tetrt_support.compiler.context import CompileContext

__all__ = ["functionalize_view_writes", "writes_in_place"]

aten = torch.ops.aten

# view op -> how to write a value back through it: (scatter op, the view's extra arguments)
_SCATTERS = {
    aten.slice.Tensor: aten.slice_scatter.default,
    aten.select.int: aten.select_scatter.default,
}


def writes_in_place(node: fx.Node) -> bool:
    """Whether ``node`` mutates one of its arguments (an in-place or ``out=`` op)."""
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target._schema.is_mutable
    )


def _view_chain(node: fx.Node) -> tuple[fx.Node, list[fx.Node]] | None:
    """``(base, [view_1, ..., view_k])`` if ``node`` is slices/selects of ``base``."""
    chain = []
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in _SCATTERS:
        chain.append(node)
        node = node.args[0]
    if not chain or not isinstance(node, fx.Node):
        return None
    return node, list(reversed(chain))


def _made_in_graph(base: fx.Node) -> bool:
    """A tensor the graph itself creates (not an input, weight or constant it was given)."""
    return base.op == "call_function" and not writes_in_place(base)


def _order(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def _aliases_read_later(base: fx.Node, chain: list[fx.Node], write: fx.Node, order: dict[fx.Node, int]) -> bool:
    """Whether a view of ``base`` taken before ``write`` (other than ``chain``) is read after
    it: it would see the write through aliasing, which redirecting the later readers of
    ``base`` alone would miss. Views taken after the write are redirected with them."""
    for user in base.users:
        if user is write or user in chain or order[user] > order[write]:
            continue
        if user.op == "call_function" and isinstance(user.target, torch._ops.OpOverload):
            if user.target.is_view and any(order[u] > order[write] for u in user.users):
                return True
    return False


def _value(node: fx.Node) -> Any:
    return node.meta.get("val")


def _functional_twin(target: Any) -> Any:
    """``aten.add.Tensor`` for ``aten.add_.Tensor``: the out-of-place overload of an in-place op."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target.overloadpacket.__name__
    if not name.endswith("_") or name.startswith("_"):
        return None
    return getattr(getattr(aten, name[:-1], None), target._overloadname, None)


def _written_value(graph: fx.Graph, write: fx.Node, dst_val: torch.Tensor) -> Any:
    """The value ``write`` leaves in its destination, as a new functional node (or the source)."""
    if write.target is aten.copy_.default:
        src = write.args[1]
        src_val = src.meta.get("val") if isinstance(src, fx.Node) else None
        if not isinstance(src_val, torch.Tensor):
            return None
        value: Any = src
        if src_val.dtype != dst_val.dtype:
            value = graph.call_function(aten._to_copy.default, (value,), {"dtype": dst_val.dtype})
        same_shape = src_val.dim() == dst_val.dim() and all(
            statically_known_true(a == b) for a, b in zip(src_val.shape, dst_val.shape)
        )
        if not same_shape:  # copy_ broadcasts its source
            sizes = [graph.call_function(aten.sym_size.int, (write.args[0], i)) for i in range(dst_val.dim())]
            value = graph.call_function(aten.expand.default, (value, sizes))
        return value
    twin = _functional_twin(write.target)
    if twin is None:
        return None
    value = graph.call_function(twin, write.args, dict(write.kwargs))
    out_val = write.meta.get("val")
    if isinstance(out_val, torch.Tensor) and out_val.dtype != dst_val.dtype:  # in-place keeps the dtype
        value = graph.call_function(aten._to_copy.default, (value,), {"dtype": dst_val.dtype})
    return value


def _rewrite_one(graph: fx.Graph, write: fx.Node) -> bool:
    dst = write.args[0]
    if not isinstance(dst, fx.Node) or write.kwargs.get("non_blocking"):
        return False
    found = _view_chain(dst)
    base, chain = found if found is not None else (dst, [])
    order = _order(graph)
    if not _made_in_graph(base) or _aliases_read_later(base, chain, write, order):
        return False
    dst_val = dst.meta.get("val")
    if not isinstance(dst_val, torch.Tensor):
        return False
    with graph.inserting_before(write):
        value = _written_value(graph, write, dst_val)
        if value is None:
            return False
        # write back through the chain, innermost view first: view_k <- value, ..., base <- ...
        for view in reversed(chain):
            parent = view.args[0]
            value = graph.call_function(_SCATTERS[view.target], (parent, value, *view.args[1:]), dict(view.kwargs))
            value.meta.update({k: view.meta[k] for k in ("stack_trace", "nn_module_stack") if k in view.meta})
    new_base = value
    # every reader of the base after the write (and of the write's own result) reads the new value
    for user in list(base.users):
        if user is not new_base and order.get(user, -1) > order[write]:
            user.replace_input_with(base, new_base)
    write.replace_all_uses_with(new_base if not chain else _view_of(graph, write, new_base, chain))
    graph.erase_node(write)
    return True


def _view_of(graph: fx.Graph, write: fx.Node, new_base: fx.Node, chain: list[fx.Node]) -> fx.Node:
    """The written view, re-taken from the new base (for readers of an in-place op's result)."""
    if not write.users:
        return new_base
    value = new_base
    with graph.inserting_after(new_base):
        for view in chain:
            value = graph.call_function(view.target, (value, *view.args[1:]), dict(view.kwargs))
    return value


def _fill_meta(gm: fx.GraphModule) -> None:
    """``meta["val"]`` for the nodes this pass created."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    if mode is None:
        return
    for node in gm.graph.nodes:
        if node.op != "call_function" or "val" in node.meta:
            continue
        args = fx.node.map_arg(node.args, lambda a: a.meta.get("val"))
        kwargs = fx.node.map_arg(node.kwargs, lambda a: a.meta.get("val"))
        with mode:
            node.meta["val"] = node.target(*args, **kwargs)


def functionalize_view_writes(gm: fx.GraphModule, ctx: CompileContext | None = None) -> fx.GraphModule:
    """Rewrite in-place ops on graph-made tensors (``copy_`` into a slice of ``new_empty``,
    ``x.add_(y)``, ``detach_``) as their functional twins, written back through the view
    chain by scatter ops (a pass; it reads nothing of ``ctx``, so it also runs on its own)."""
    graph = gm.graph
    changed, progress = False, True
    while progress:  # a write into the result of a rewritten write needs that one's metadata
        progress = False
        for node in list(graph.nodes):
            if writes_in_place(node) and (node.target is aten.copy_.default or _functional_twin(node.target) is not None):
                if _rewrite_one(graph, node):
                    _fill_meta(gm)
                    progress = changed = True
    if changed:
        graph.eliminate_dead_code()
        graph.lint()
        gm.recompile()
    return gm
