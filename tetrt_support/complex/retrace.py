"""The "retrace" strategy: re-record the graph with complex values carried as real pairs.

An ``fx.Interpreter`` runs under ``make_fx(pre_dispatch=True)`` on the graph's fake tensors,
keeps each complex value as its packed ``[..., 2]`` tensor and calls, for each complex node,
the same rule from :data:`~tetrt_support.complex.rules.RULES` as the rewrite strategy. Symbolic
dims carry over (on a copy of the ShapeEnv, :mod:`tetrt_support.complex.shape_env`), and the
module keeps its parameter names and call signature (``docs/architecture.md``, section 4).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from tetrt_support.complex._attrs import pack_complex_attributes, tensor_names_by_identity
from tetrt_support.complex._driver import (
    Unsupported,
    check_packed,
    expected_packed,
    lower_node,
    program_fake_mode,
)
from tetrt_support.complex.codegen import retrace_preserving_signature
from tetrt_support.complex.detect import GUARDS_FN, is_guards_call, touches_complex

__all__ = ["retrace_complex"]

aten = torch.ops.aten


class _PackedComplexInterpreter(fx.Interpreter):
    """Runs ``gm`` with complex values packed; complex nodes go through the rules."""

    def __init__(self, gm: fx.GraphModule, original: dict[fx.Node, Any], unsupported: Unsupported):
        super().__init__(gm)
        self.original = original
        self.unsupported = unsupported

    def run_node(self, n: fx.Node) -> Any:
        if is_guards_call(n):
            return None  # re-inserted into the traced graph afterwards
        if n.op in ("placeholder", "get_attr", "output") or not touches_complex(n, self.original):
            return super().run_node(n)
        with self._set_current_node(n):  # new nodes inherit its stack_trace / nn_module_stack
            result = lower_node(n, lambda a: self.env[a], self.original, self.unsupported)
        want = expected_packed(self.original[n])
        if want is not None and isinstance(result, torch.Tensor) and check_packed(n, result, want):
            result = aten._to_copy.default(result, dtype=want[0])
        return result


def retrace_complex(gm: fx.GraphModule, unsupported: Unsupported = "raise") -> fx.GraphModule:
    """Lower every complex node of ``gm`` by retracing; returns ``gm`` itself carrying the
    new graph (so every parameter, buffer, hook and attribute stays where it was)."""
    fake_mode = program_fake_mode(gm)
    original = {n: n.meta.get("val") for n in gm.graph.nodes}
    placeholders = gm.graph.find_nodes(op="placeholder")
    with fake_mode:
        inputs = [
            torch.view_as_real(v) if isinstance(v, torch.Tensor) and v.is_complex() else v
            for v in (original[p] for p in placeholders)
        ]
    pack_complex_attributes(gm)
    had_guards = any(is_guards_call(n) for n in gm.graph.nodes)

    def trace(flat_gm: fx.GraphModule) -> fx.GraphModule:
        interpreter = _PackedComplexInterpreter(flat_gm, original, unsupported)
        fn = lambda *args: tuple(interpreter.run(*args))  # noqa: E731
        with fx_traceback.preserve_node_meta():
            return make_fx(fn, tracing_mode="fake", pre_dispatch=True)(*inputs)

    traced = retrace_preserving_signature(gm, trace)
    _adopt_graph(gm, traced, had_guards)
    return gm


def _adopt_graph(gm: fx.GraphModule, traced: fx.GraphModule, had_guards: bool) -> None:
    """Move ``traced``'s graph into ``gm``: tensors that make_fx captured as
    ``_param_constantN``/``_tensor_constantN`` are read from their original names."""
    graph = traced.graph
    _drop_grad_mode_switches(graph)
    names = tensor_names_by_identity(gm)
    for node in graph.find_nodes(op="get_attr"):
        value = getattr(traced, str(node.target))
        name = names.get(id(value))
        if name is None:  # a tensor created while tracing (e.g. a lifted constant)
            name = _fresh_name(gm, str(node.target))
            gm.register_buffer(name, value, persistent=False)  # not in state_dict
            names[id(value)] = name
        node.target = name
        node._rename(name.replace(".", "_"))
    gm.graph = graph
    if had_guards:
        placeholders = graph.find_nodes(op="placeholder")
        with graph.inserting_after(placeholders[-1]):
            graph.call_module(GUARDS_FN, tuple(placeholders))
    gm.recompile()


def _drop_grad_mode_switches(graph: fx.Graph) -> None:
    """make_fx (``pre_dispatch=True``) records a ``with torch.no_grad()`` region of the
    program as ``_set_grad_enabled(False)`` ... ``_set_grad_enabled(<mode while tracing>)``:
    the second would leave grad mode ON in a caller that runs the module under no_grad.
    Both go, as :mod:`~tetrt_support.complex._inline` drops a wrapper's switch: lowering is
    for inference, where grad mode changes no number."""
    for node in list(graph.find_nodes(op="call_function", target=torch._C._set_grad_enabled)):
        if not node.users:
            graph.erase_node(node)


def _fresh_name(gm: fx.GraphModule, base: str) -> str:
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name
