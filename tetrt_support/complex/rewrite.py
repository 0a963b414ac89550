"""The "rewrite" strategy: lower complex nodes in place in the exported graph.

Like Torch-TensorRT's legacy rewriter: complex placeholders and ``get_attr`` tensors
become real ``[..., 2]`` ones (same nodes, same names), and each complex node is replaced
by running its rule from :data:`~tetrt_support.complex.rules.RULES` on
``torch.fx.Proxy`` objects bound to the graph (a ``GraphAppendingTracer`` inserting
before the node). ``meta["val"]`` of every new node is computed right away with the
program's own fake mode, so symbolic (dynamic) sizes survive and later passes see
correct metadata. Everything else (codegen, pre-hooks, ``_guards_fn``, other nodes) is
untouched, which is why this strategy keeps the call signature for free.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch.fx.proxy import GraphAppendingTracer, Proxy

from tetrt_support.complex._attrs import pack_complex_attributes
from tetrt_support.complex._driver import (
    Unsupported,
    check_packed,
    expected_packed,
    lower_node,
    program_fake_mode,
)
from tetrt_support.complex.detect import is_guards_call, touches_complex

__all__ = ["rewrite_complex"]

aten = torch.ops.aten


def _propagate(node: fx.Node, fake_mode: Any) -> None:
    def val(a: Any) -> Any:
        return a.meta["val"]

    args = fx.node.map_arg(node.args, val)
    kwargs = fx.node.map_arg(node.kwargs, val)
    with fake_mode:
        node.meta["val"] = node.target(*args, **kwargs)


class _ConstantLiftingTracer(GraphAppendingTracer):
    """Appends to ``gm.graph``; a real tensor that a rule built from Python values alone
    (a fill, say) becomes a ``get_attr`` constant instead of an unprintable argument."""

    def __init__(self, gm: fx.GraphModule, fake_mode: Any) -> None:
        super().__init__(gm.graph)
        self.gm = gm
        self.fake_mode = fake_mode

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor) and not isinstance(a, fx.Proxy):
            i = 0
            while hasattr(self.gm, f"_tetrt_constant{i}"):
                i += 1
            name = f"_tetrt_constant{i}"
            self.gm.register_buffer(name, a, persistent=False)  # not in state_dict
            node = self.graph.get_attr(name)
            node.meta["val"] = self.fake_mode.from_tensor(a, static_shapes=True)
            return node
        return super().create_arg(a)


def rewrite_complex(gm: fx.GraphModule, unsupported: Unsupported = "raise") -> fx.GraphModule:
    """Lower every complex node of ``gm`` in place; returns ``gm``."""
    graph = gm.graph
    fake_mode = program_fake_mode(gm)
    original = {n: n.meta.get("val") for n in graph.nodes}
    existing = set(graph.nodes)
    tracer = _ConstantLiftingTracer(gm, fake_mode)
    packed: dict[fx.Node, Any] = {}  # complex-touching node -> its packed value (Proxy, list, ...)
    replaced: list[fx.Node] = []
    created: list[fx.Node] = []

    for name, tensor in pack_complex_attributes(gm).items():
        for node in graph.find_nodes(op="get_attr", target=name):
            node.meta["val"] = fake_mode.from_tensor(tensor, static_shapes=True)

    def lookup(n: fx.Node) -> Any:
        return packed[n] if n in packed else Proxy(n, tracer)

    for node in list(graph.nodes):
        if node.op in ("get_attr", "output") or is_guards_call(node) or not touches_complex(node, original):
            continue
        if node.op == "placeholder":
            with fake_mode:
                node.meta["val"] = torch.view_as_real(original[node])
            continue
        with graph.inserting_before(node):
            result = lower_node(node, lookup, original, unsupported)
            if isinstance(result, torch.Tensor):  # built from Python values only
                result = Proxy(tracer.create_arg(result), tracer)
            result = _finish(node, result, original[node], existing, created, fake_mode)
        packed[node] = result
        replaced.append(node)

    for node in replaced:
        value = packed[node]
        if isinstance(value, Proxy):
            node.replace_all_uses_with(value.node)
        elif node.users and not all(u.target is operator.getitem for u in node.users):
            raise AssertionError(f"complex lowering left users of {node.name!r} without a value")
    for node in reversed(replaced):
        if not node.users:
            graph.erase_node(node)
    _erase_unused(graph, created)
    graph.lint()
    gm.recompile()
    return gm


def _finish(
    node: fx.Node, result: Any, out: Any, existing: set[fx.Node], created: list[fx.Node], fake_mode: Any
) -> Any:
    """Fill ``meta["val"]`` of the nodes just inserted before ``node``; check the result
    against the original value and cast it if its dtype differs."""
    new: list[fx.Node] = []
    cursor = node.prev
    while cursor.op != "root" and cursor not in existing:
        new.append(cursor)
        cursor = cursor.prev
    for n in reversed(new):
        if n.op == "call_function":
            _propagate(n, fake_mode)
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in node.meta:
                n.meta[key] = node.meta[key]
        existing.add(n)
        created.append(n)
    want = expected_packed(out)
    if want is not None and isinstance(result, Proxy):
        if check_packed(node, result.node.meta["val"], want):
            cast = node.graph.call_function(aten._to_copy.default, (result.node,), {"dtype": want[0]})
            _propagate(cast, fake_mode)
            existing.add(cast)
            created.append(cast)
            result = Proxy(cast, result.tracer)
    return result


def _erase_unused(graph: fx.Graph, created: list[fx.Node]) -> None:
    """Rules compute both parts of a value; drop inserted nodes that nobody reads."""
    for node in reversed(created):
        if not node.users and not node.is_impure():
            graph.erase_node(node)
