"""Inline grad-mode / autocast wrapper subgraphs that compute on complex values.

``torch.export`` puts a region under ``torch.no_grad()`` or ``torch.autocast(...,
enabled=False)`` into a submodule called through ``higher_order.wrap_with_set_grad_enabled``
/ ``wrap_with_autocast`` (HF Llama 4's rotary embedding is one, on torch 2.11). The rules
work node by node in one graph, so such a region is copied into its parent first.

What is lost: the grad-mode / autocast switch around the copied nodes. Lowering is for
inference, where grad mode changes no number; a caller that runs the lowered module
under an enclosing autocast would see the region autocast too. The partitioner inlines
every grad-mode region, complex or not (:func:`inline_grad_mode_wrappers`), so that a
``torch.no_grad()`` region runs in an engine block like the code around it.
"""

from __future__ import annotations

import copy
import operator

import torch
import torch.fx as fx

from tetrt_support.complex.detect import touches_complex

__all__ = ["inline_complex_wrappers", "inline_grad_mode_wrappers"]


def _wrapper_ops() -> tuple:
    hop = torch.ops.higher_order
    return tuple(getattr(hop, name) for name in ("wrap_with_set_grad_enabled", "wrap_with_autocast") if hasattr(hop, name))


def _submodule_arg(gm: fx.GraphModule, node: fx.Node) -> int | None:
    for i, a in enumerate(node.args):
        if isinstance(a, fx.Node) and a.op == "get_attr" and isinstance(getattr(gm, str(a.target), None), fx.GraphModule):
            return i
    return None


def inline_complex_wrappers(gm: fx.GraphModule) -> fx.GraphModule:
    """Copy into ``gm`` (in place) each wrapper subgraph that touches complex values."""
    return _inline_wrappers(gm, _wrapper_ops(), only_complex=True)


def inline_grad_mode_wrappers(gm: fx.GraphModule) -> fx.GraphModule:
    """Copy into ``gm`` (in place) every ``wrap_with_set_grad_enabled`` subgraph, complex or
    not: what a program exported with grad on records for a ``torch.no_grad()`` region.
    Torch-TensorRT compiles the inference IR, where ``run_decompositions`` has inlined them."""
    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    return gm if hop is None else _inline_wrappers(gm, (hop,), only_complex=False)


def _inline_wrappers(gm: fx.GraphModule, wrappers: tuple, only_complex: bool) -> fx.GraphModule:
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in wrappers:
            continue
        k = _submodule_arg(gm, node)
        if k is None:
            continue
        attr = node.args[k]
        sub = getattr(gm, str(attr.target))
        if any(n.op == "call_function" and n.target in wrappers for n in sub.graph.nodes):
            # ep.module() shares its submodules with the caller's program: inline into a copy
            sub = fx.GraphModule(sub, copy.deepcopy(sub.graph), class_name=type(sub).__name__)
            setattr(gm, str(attr.target), sub)
        _inline_wrappers(sub, wrappers, only_complex)
        complex_region = any(touches_complex(n) for n in sub.graph.nodes) or touches_complex(node)
        if only_complex and not complex_region:
            continue
        if any(n.op in ("get_attr", "call_module") for n in sub.graph.nodes):
            continue  # refers to the submodule's own attributes: leave it (the rules will say so)
        if not all(u.target is operator.getitem for u in node.users):
            continue
        placeholders = sub.graph.find_nodes(op="placeholder")
        operands = node.args[k + 1 :]
        val_map: dict[fx.Node, fx.Node] = dict(zip(placeholders, operands))
        with graph.inserting_before(node):
            outputs = graph.graph_copy(sub.graph, val_map)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        for user in list(node.users):
            user.replace_all_uses_with(outputs[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        if not attr.users:
            graph.erase_node(attr)
            if not graph.find_nodes(op="get_attr", target=attr.target):
                delattr(gm, str(attr.target))
        changed = True
    if changed:
        graph.lint()
        gm.recompile()
    return gm
