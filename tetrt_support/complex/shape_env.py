"""Give a graph module its own copy of the ShapeEnv its fake tensors live in.

``ep.module()`` shares the caller's fake values and ShapeEnv, and meta kernels record guards
into it while a retrace runs (``docs/architecture.md``, "The compile pipeline").
:func:`use_private_shape_env` rebuilds every ``meta["val"]`` (and ``tensor_meta``) on a fresh
fake mode whose ShapeEnv copies the original (symbols, ranges, replacements, guards), so dims
stay dynamic under their names and later guards stay with the copy.
"""

from __future__ import annotations

import collections
import copy
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.passes.shape_prop import TensorMetadata
from torch.utils import _pytree as pytree

__all__ = ["copy_shape_env", "use_private_shape_env"]

# state ShapeEnv keeps per fake-tensor call; a copy starts without it
_FRESH_FIELDS = {"fake_tensor_cache": dict, "fx_node_cache": dict}


def _copy_container(value: Any) -> Any:
    """Two levels: ShapeEnv's state is containers of (immutable) sympy expressions, some
    holding a list or set per symbol (``var_to_sources``, ``deferred_runtime_asserts``)."""
    if isinstance(value, (dict, collections.OrderedDict)):
        out = copy.copy(value)
        for key, item in value.items():
            if isinstance(item, (list, set, dict)):
                out[key] = copy.copy(item)
        return out
    if isinstance(value, (list, set, collections.Counter)) or type(value).__name__ == "OrderedSet":
        return copy.copy(value)
    return value


def copy_shape_env(shape_env: ShapeEnv) -> ShapeEnv:
    """A ShapeEnv with the same state as ``shape_env`` that shares no mutable container
    with it. (``copy.deepcopy`` fails: it reaches fake tensors through tracked state.)"""
    new = ShapeEnv.__new__(ShapeEnv)
    for key, value in vars(shape_env).items():
        vars(new)[key] = _FRESH_FIELDS[key]() if key in _FRESH_FIELDS else _copy_container(value)
    return new


class _Rehomer:
    """Maps fake values onto ``mode``; one new value per old one (aliases stay aliases)."""

    def __init__(self, mode: FakeTensorMode) -> None:
        self.mode = mode
        self.memo: dict[int, Any] = {}

    def symbolic(self, value: Any) -> Any:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return type(value)(value.node.with_shape_env(self.mode.shape_env))
        return value

    def __call__(self, value: Any) -> Any:
        return pytree.tree_map(self._leaf, value)

    def _leaf(self, value: Any) -> Any:
        if id(value) in self.memo:
            return self.memo[id(value)]
        if isinstance(value, torch._subclasses.fake_tensor.FakeTensor):
            with self.mode:
                new = torch.empty_strided(
                    [self.symbolic(s) for s in value.shape],
                    [self.symbolic(s) for s in value.stride()],
                    dtype=value.dtype,
                    device=value.device,
                    requires_grad=value.requires_grad,
                )
        else:
            new = self.symbolic(value)
        self.memo[id(value)] = new
        return new

    def tensor_meta(self, meta: Any) -> Any:
        if not isinstance(meta, TensorMetadata):
            return meta
        return meta._replace(
            shape=torch.Size([self.symbolic(s) for s in meta.shape]),
            stride=tuple(self.symbolic(s) for s in meta.stride),
        )


def use_private_shape_env(gm: fx.GraphModule) -> fx.GraphModule:
    """Rebuild ``gm``'s fake values on a copy of their ShapeEnv (in place; returns ``gm``).

    ``gm``'s own nodes must own their ``meta`` dicts (``ep.module()`` and ``copy.deepcopy``
    give fresh ones). Submodule graphs (the bodies of ``wrap_with_set_grad_enabled`` and
    other higher-order ops), which ``ep.module()`` shares with the program, are replaced by
    copies first.
    """
    mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    if mode is None or mode.shape_env is None:
        return gm  # no symbolic sizes: nothing a pass could narrow
    private = FakeTensorMode(
        allow_non_fake_inputs=mode.allow_non_fake_inputs,
        shape_env=copy_shape_env(mode.shape_env),
        export=getattr(mode, "export", False),
    )
    rehome = _Rehomer(private)
    for node in (n for module in _own_graph_modules(gm) for n in module.graph.nodes):
        if "val" in node.meta:
            node.meta["val"] = rehome(node.meta["val"])
        if "tensor_meta" in node.meta:
            node.meta["tensor_meta"] = pytree.tree_map(
                rehome.tensor_meta, node.meta["tensor_meta"], is_leaf=lambda m: isinstance(m, TensorMetadata)
            )
    return gm


def _own_graph_modules(gm: fx.GraphModule) -> list[fx.GraphModule]:
    """``gm`` and every GraphModule below it, each submodule replaced by a copy of its
    graph (fresh nodes and ``meta`` dicts; parameters and children shared)."""
    modules = [gm]
    for module in modules:
        for name, child in list(module.named_children()):
            if isinstance(child, fx.GraphModule):
                copied = fx.GraphModule(child, copy.deepcopy(child.graph), class_name=type(child).__name__)
                copied.meta = dict(child.meta)
                setattr(module, name, copied)
                modules.append(copied)
    return modules
