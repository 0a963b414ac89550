"""``fold_constants``: Torch-TensorRT's post-lowering constant folding, results stored compact.

Every node whose inputs are all constants is evaluated once and stored as a ``get_attr``,
as torch's ``ConstantFolder`` does, except that strided views are stored contiguous, mutated
state stays live, the caller's module is not changed, and the constant subgraph is kept
(:class:`FoldedConstants`, ``meta[FOLDED_KEY]``) for refit. Why: ``docs/architecture.md``
("The compile pipeline" and "Module notes").
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch._inductor.constant_folding import ConstantFolder

__all__ = ["FOLDED_KEY", "FOLDED_PREFIX", "FoldedConstants", "fold_constants", "mutated_attributes"]

#: name prefix of the attributes the pass adds (``_folded_constant0``, ...)
FOLDED_PREFIX = "_folded_constant"
#: ``meta`` key of a folded module: its :class:`FoldedConstants`
FOLDED_KEY = "tetrt_folded_constants"


#: calls that switch a global mode (a retrace records ``with torch.no_grad()`` as two of them):
#: not values, and running one while folding would fold the rest with grad mode switched
_MODE_SWITCHES = (
    torch._C._set_grad_enabled,
    torch.autograd.grad_mode.set_grad_enabled,
    torch.amp.autocast_mode._enter_autocast,
    torch.amp.autocast_mode._exit_autocast,
)


def _is_mode_switch(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in _MODE_SWITCHES


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
    """``ConstantFolder`` that treats written buffers, mutating ops and grad-mode or
    autocast switches as unknown values (none is run)."""

    def __init__(self, gm: fx.GraphModule, mutated: set[str]) -> None:
        super().__init__(gm, skip_constructors=False)
        self._mutated = mutated

    def run_node(self, node: fx.Node):  # type: ignore[no-untyped-def]
        if (node.op == "get_attr" and str(node.target) in self._mutated) or _is_mutating(node):
            return self.unknown_value
        if _is_mode_switch(node):
            return self.unknown_value
        return super().run_node(node)

    def run(self) -> None:  # type: ignore[override]
        # ConstantFolder.run, without the graph's output processing: the values at the
        # output are mostly unknown, and unflattening them through the graph's pytree
        # codegen is no part of folding (it fails on a codegen a pass left inconsistent,
        # which must fail where the module is called, not here).
        env: dict[fx.Node, object] = {n: self.unknown_value for n in self.module.graph.find_nodes(op="placeholder")}
        fx.Interpreter.run(self, initial_env=env, enable_io_processing=False)


def _view_key(t: torch.Tensor) -> tuple:
    """Equal for two tensors that are the same elements of the same storage."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _dense(t: torch.Tensor) -> bool:
    """True iff ``t``'s elements fill a block of its storage without gaps or overlaps (a
    permutation of a contiguous layout, a transposed weight)."""
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _stored_form(value: torch.Tensor) -> torch.Tensor:
    """What a folded attribute holds for ``value`` (see the module docstring): broadcast
    dims reduced to size 1, a view with gaps copied contiguous, anything else as it is."""
    if value.numel() and 0 in value.stride():
        value = value.as_strided([1 if st == 0 else n for n, st in zip(value.shape, value.stride())], value.stride())
    if value._base is None and value.is_contiguous():
        return value
    return value if _dense(value) else value.clone(memory_format=torch.contiguous_format)


@dataclasses.dataclass
class FoldedConstants:
    """How a folded module's ``_folded_constant*`` attributes were computed.

    ``recipe`` is the constant subgraph of the graph before folding: it reads the same
    attributes (weights, buffers, tensor constants) and returns one value per name of
    ``names``; :meth:`evaluate` puts each in its stored form.
    """

    names: list[str]
    recipe: fx.GraphModule

    def sources(self) -> list[str]:
        """The attributes the recipe reads."""
        return list(dict.fromkeys(str(n.target) for n in self.recipe.graph.nodes if n.op == "get_attr"))

    def evaluate(self) -> dict[str, torch.Tensor]:
        """{name: value}, computed from the recipe's attributes as they are now."""
        with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
            values = self.recipe()
        return {name: _stored_form(value) for name, value in zip(self.names, values)}


def _recipe(gm: fx.GraphModule, outputs: list[fx.Node]) -> fx.GraphModule:
    """The nodes of ``gm`` that ``outputs`` are computed from, returning ``outputs``."""
    needed: set[fx.Node] = set()
    stack = list(outputs)
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node in needed:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in outputs))
    return fx.GraphModule(gm, graph, class_name="FoldedConstantsRecipe")


def _free_name(gm: fx.GraphModule, index: int) -> str:
    while hasattr(gm, f"{FOLDED_PREFIX}{index}"):
        index += 1
    return f"{FOLDED_PREFIX}{index}"


def fold_constants(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` with every all-constant subgraph evaluated into an attribute in its
    stored form; ``meta[FOLDED_KEY]`` says how to compute them again (no key if nothing folds)."""
    if FOLDED_KEY in gm.meta:
        raise ValueError(
            "fold_constants: this module was folded already (meta has its FoldedConstants); a second "
            "folding would compute from folded values, which a refit could not recompute"
        )
    folded = fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    folded.meta = dict(gm.meta)
    with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
        folder = _Folder(folded, mutated_attributes(folded))
        folder.run()
        replaced = {node: v for node, v in folder.node_replacements.items() if isinstance(v, torch.Tensor)}
        names: dict[tuple, str] = {}
        sources: dict[str, fx.Node] = {}
        for node, value in replaced.items():
            key = _view_key(value)
            if key not in names:
                names[key] = _free_name(folded, len(names))
                sources[names[key]] = node
        recipe = _recipe(folded, list(sources.values())) if sources else None
        # the graph's fake mode, for the new nodes' meta["val"] (the partitioner reads it)
        fake_mode = detect_fake_mode([n.meta.get("val") for n in folded.graph.nodes])
        stored: dict[str, torch.Tensor] = {}
        for node, value in replaced.items():
            name = names[_view_key(value)]
            if name not in stored:
                stored[name] = _stored_form(value)
                folded.register_buffer(name, stored[name])
            with folded.graph.inserting_before(node):
                attr = folded.graph.get_attr(name)
                kept = {k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")}
                attr.meta.update(kept)
                fake = fake_mode.from_tensor(stored[name], static_shapes=True) if fake_mode is not None else None
                if fake is not None:
                    attr.meta["val"] = fake
                replacement = attr
                if stored[name].shape != value.shape:  # broadcast: expanded again here
                    replacement = folded.graph.call_function(torch.ops.aten.expand.default, (attr, list(value.shape)))
                    replacement.meta.update(kept)
                    if fake is not None:
                        replacement.meta["val"] = fake.expand(value.shape)
            node.replace_all_uses_with(replacement)
    for node in reversed(list(folded.graph.nodes)):
        if node.op in ("call_function", "get_attr") and not node.users and not node.is_impure():
            folded.graph.erase_node(node)
    folded.graph.lint()
    folded.recompile()
    if recipe is not None:
        folded.meta[FOLDED_KEY] = FoldedConstants(list(sources), recipe)
    return folded
