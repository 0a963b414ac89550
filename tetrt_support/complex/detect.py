"""Find the nodes of an ATen graph that produce or consume complex values, and the
node that is torch.export's input-guard call."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

__all__ = ["GUARDS_FN", "complex_nodes", "is_complex_value", "is_guards_call", "touches_complex"]

#: The submodule ``ep.module()`` calls first to check the export's shape guards on its
#: inputs. Not a complex op: the lowering leaves it alone (packed inputs keep their leading
#: dims), the compiler drops it, and serialization cannot pickle it (a local function).
GUARDS_FN = "_guards_fn"


def is_guards_call(node: fx.Node) -> bool:
    """Whether ``node`` is ``ep.module()``'s call of its :data:`GUARDS_FN` submodule."""
    return node.op == "call_module" and node.target == GUARDS_FN


def is_complex_value(val: Any) -> bool:
    """True for a complex tensor (fake or real), or a container holding one."""
    return any(
        isinstance(leaf, torch.Tensor) and leaf.is_complex() for leaf in pytree.tree_leaves(val)
    )


def _val(node: Any, vals: dict[fx.Node, Any] | None) -> Any:
    if not isinstance(node, fx.Node):
        return None
    return vals[node] if vals is not None and node in vals else node.meta.get("val")


def touches_complex(node: fx.Node, vals: dict[fx.Node, Any] | None = None) -> bool:
    """Whether ``node`` produces a complex value or takes one as an input.

    ``vals`` overrides ``node.meta["val"]`` (the rewrite keeps a snapshot of the
    original values while it changes the graph). Python complex scalars among the
    arguments count too: ``x * 1j`` on a real ``x`` is a complex node.
    """
    if node.op == "output":
        return False
    if is_complex_value(_val(node, vals)):
        return True
    inputs = pytree.tree_leaves((node.args, node.kwargs))
    return any(
        isinstance(a, complex) or (isinstance(a, fx.Node) and is_complex_value(_val(a, vals)))
        for a in inputs
    )


def complex_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """Nodes of ``gm`` (an exported program's graph module, or ``ep.module()``) that
    produce or consume complex values, in graph order.

    Placeholders and ``get_attr`` nodes of complex parameters, buffers and constants
    count. Reads ``node.meta["val"]``, which ``torch.export`` and ``make_fx`` record.
    """
    return [n for n in gm.graph.nodes if touches_complex(n)]
