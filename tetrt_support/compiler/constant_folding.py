"""``fold_constants``: Torch-TensorRT's post-lowering constant folding, results stored compact.

Torch-TensorRT's post-lowering pass list runs ``constant_fold``: torch's
``ConstantFolder`` (constructors included) evaluates every node whose inputs are all
constants (parameters, buffers, tensor constants, ``arange``...), and each value used by
the rest of the graph becomes a new ``get_attr``. This is the same pass, with three
differences, each for a reason:

- **compact results.** After the complex lowering, a folded value is typically a strided
  view: the real or imaginary plane of a packed ``[..., 2]`` buffer (RoPE's frequencies
  as ``select(-1, 0)``). Kept as a view, a kernel still reads it with a stride of 2;
  a TensorRT build copies constants into its plan anyway, but a PyTorch back end (eager,
  inductor) reads them where they lie. So each folded value is stored contiguous, and
  equal views (q and k read the same planes) share one tensor.
- **mutated state stays live.** A buffer the graph writes (``copy_`` into it, an in-place
  op on it) is not a constant: nothing computed from it is folded, and no mutating op is
  evaluated. ``ConstantFolder`` itself assumes mutations were removed.
- **the caller's module is not changed.** The pass folds a copy of the graph module
  (sharing its tensors) and returns it.

The compile pipeline does not run this pass yet: its refit
(:mod:`~tetrt_support.compiler.refit`) replaces parameters and buffers by name, and a
value folded from them would keep the old weights. Torch-TensorRT's refit re-runs its
lowering on the new weights to recompute such constants; that is not built here.
"""

from __future__ import annotations

import copy

import torch
from torch import fx
from torch._inductor.constant_folding import ConstantFolder

__all__ = ["FOLDED_PREFIX", "fold_constants", "mutated_attributes"]

#: name prefix of the attributes the pass adds (``_folded_constant0``, ...)
FOLDED_PREFIX = "_folded_constant"


def _is_mutating(node: fx.Node) -> bool:
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def mutated_attributes(gm: fx.GraphModule) -> set[str]:
    """Targets of the ``get_attr`` nodes whose tensors a mutating op writes (a buffer update)."""
    mutated: set[str] = set()
    for node in gm.graph.nodes:
        if not _is_mutating(node):
            continue
        schema = node.target._schema  # type: ignore[union-attr]
        for argument, value in zip(schema.arguments, node.args):
            if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, fx.Node):
                root = value
                while root.op == "call_function" and root.args and isinstance(root.args[0], fx.Node):
                    root = root.args[0]  # a write into a view of the buffer writes the buffer
                if root.op == "get_attr":
                    mutated.add(str(root.target))
    return mutated


class _Folder(ConstantFolder):
    """``ConstantFolder`` that treats written buffers and mutating ops as unknown values."""

    def __init__(self, gm: fx.GraphModule, mutated: set[str]) -> None:
        super().__init__(gm, skip_constructors=False)
        self._mutated = mutated

    def run_node(self, node: fx.Node):  # type: ignore[no-untyped-def]
        if (node.op == "get_attr" and str(node.target) in self._mutated) or _is_mutating(node):
            return self.unknown_value
        return super().run_node(node)


def _view_key(t: torch.Tensor) -> tuple:
    """Equal for two tensors that are the same elements of the same storage."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def fold_constants(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with every all-constant subgraph evaluated into a contiguous attribute."""
    folded = fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    folded.meta = dict(gm.meta)
    with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
        folder = _Folder(folded, mutated_attributes(folded))
        folder.run()
        names: dict[tuple, str] = {}
        for node, value in folder.node_replacements.items():
            if not isinstance(value, torch.Tensor):
                continue
            key = _view_key(value)
            if key not in names:
                names[key] = f"{FOLDED_PREFIX}{len(names)}"
                is_view = value._base is not None or not value.is_contiguous()
                folded.register_buffer(names[key], value.clone(memory_format=torch.contiguous_format) if is_view else value)
            with folded.graph.inserting_before(node):
                attr = folded.graph.get_attr(names[key])
            attr.meta.update({k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")})
            node.replace_all_uses_with(attr)
    for node in reversed(list(folded.graph.nodes)):
        if node.op in ("call_function", "get_attr") and not node.users and not node.is_impure():
            folded.graph.erase_node(node)
    folded.graph.lint()
    folded.recompile()
    return folded
