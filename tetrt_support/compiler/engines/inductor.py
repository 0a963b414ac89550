"""The inductor engine: the block's ATen graph compiled by inductor, on first call, without Dynamo.

The block goes to ``torch._inductor.compile_fx.compile_fx`` with fake inputs (symbolic where
``dynamic_dims`` says), one compiled graph per set of guards; the weights are graph inputs,
so a refit is seen. Compiled graphs are not pickled, and inductor's on-disk caches are off.
Why each: ``docs/architecture.md`` ("Module notes", the inductor engine).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from tetrt_support.compiler.engines.base import DynamicDims, Engine, attribute_at, is_int_input, standalone_block

__all__ = ["InductorBlock", "InductorEngine"]


@dataclass
class _Compiled:
    """One compiled graph and the inputs it was compiled for."""

    key: tuple[Any, ...]
    guards: Any  # ShapeEnv.produce_guards_expression over the fake inputs, compiled; or None
    run: Any

    def applies(self, key: tuple[Any, ...], inputs: tuple[Any, ...]) -> bool:
        """Whether this graph serves ``inputs`` (ShapeEnv.evaluate_guards_expression's test)."""
        if key != self.key:
            return False
        if self.guards is None:
            return True
        from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

        local = {"L": {f"t{i}": x for i, x in enumerate(inputs)}}
        return bool(eval(self.guards, SYMPY_INTERP, local))  # noqa: S307 - torch's own guard code


def _weight_names(block: fx.GraphModule) -> list[str]:
    """The tensor attributes ``block``'s graph reads, in graph order, each once."""
    names: list[str] = []
    for node in block.graph.find_nodes(op="get_attr"):
        if node.target not in names and isinstance(attribute_at(block, node.target), torch.Tensor):
            names.append(node.target)
    return names


def _weights_as_inputs(block: fx.GraphModule, names: list[str]) -> fx.GraphModule:
    """A copy of ``block`` whose tensor attributes ``names`` are extra inputs after its
    own, in that order; flat (plain codegen)."""
    graph = copy.deepcopy(block.graph)
    graph._codegen = fx.graph.CodeGen()
    placeholders = list(graph.find_nodes(op="placeholder"))
    anchor = placeholders[-1] if placeholders else None
    lifted: dict[str, fx.Node] = {}
    for node in list(graph.find_nodes(op="get_attr")):
        if node.target not in names:
            continue
        if node.target not in lifted:
            if anchor is None:
                with graph.inserting_before(next(iter(graph.nodes))):
                    anchor = graph.placeholder(f"weight_{len(lifted)}")
            else:
                with graph.inserting_after(anchor):
                    anchor = graph.placeholder(f"weight_{len(lifted)}")
            anchor.meta.update(node.meta)
            lifted[node.target] = anchor
        node.replace_all_uses_with(lifted[node.target])
        graph.erase_node(node)
    if list(lifted) != names:
        raise AssertionError(f"lifted {list(lifted)}, expected {names}")
    graph.lint()
    return fx.GraphModule(block, graph)


def _static_key(inputs: tuple[Any, ...], dynamic: list[set[int]]) -> tuple[Any, ...]:
    """What a compiled graph is specialised to beyond its shape guards."""
    key: list[Any] = [torch.is_grad_enabled()]
    for x, dims in zip(inputs, dynamic):
        if is_int_input(x):
            key.append("int")
        elif isinstance(x, torch.Tensor):
            sizes = tuple(None if d in dims else s for d, s in enumerate(x.shape))
            strides = x.stride() if not dims else x.is_contiguous()
            key.append((x.dtype, x.device, x.requires_grad, sizes, strides))
        else:
            key.append(type(x))
    return tuple(key)


def _fake_inputs(inputs: tuple[Any, ...], dynamic: list[set[int]]) -> tuple[Any, list[Any]]:
    """A fresh fake mode and ShapeEnv, and ``inputs`` as fake values with symbolic dims."""
    from torch._dynamo.source import ConstantSource, LocalSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    # An int input of 0 or 1 stays a symbol too: made a constant, it would be baked into the
    # code while inductor's on-disk cache keys the graph without its value, so a graph
    # compiled for 0 could be served for 1.
    shape_env = ShapeEnv(specialize_zero_one=False)
    mode = FakeTensorMode(shape_env=shape_env)
    fakes: list[Any] = []
    for i, (x, dims) in enumerate(zip(inputs, dynamic)):
        if is_int_input(x):
            source = ConstantSource(f"int{i}")
            symbol = shape_env.create_symbol(x, source, DimDynamic.DYNAMIC)
            fakes.append(shape_env.create_symintnode(symbol, hint=x, source=source))
        elif isinstance(x, torch.Tensor):
            sizes = [
                DimDynamic.DYNAMIC if d in dims and x.shape[d] > 1 else DimDynamic.STATIC
                for d in range(x.dim())
            ]
            context = StatelessSymbolicContext(dynamic_sizes=sizes)
            source = LocalSource(f"input{i}")
            fakes.append(mode.from_tensor(x, source=source, symbolic_context=context))
        else:
            fakes.append(x)
    return mode, fakes


class InductorBlock(torch.nn.Module):
    def __init__(self, block: fx.GraphModule, dynamic_dims: DynamicDims | None = None) -> None:
        super().__init__()
        self.block = block
        self.dynamic_dims = [dict(d) for d in dynamic_dims] if dynamic_dims else None
        # Kept out of _modules (each wraps self.block: state_dict would list the weights twice).
        self.__dict__["_compiled"] = []
        self.__dict__["_weights"] = _weight_names(block)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_compiled"] = []  # recompiled lazily after unpickling
        state.pop("_out_spec", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("_compiled") is None:  # pickled before the compiled graphs were a list
            state["_compiled"] = []
        self.__dict__.update(state)
        if "_weights" not in state:
            self.__dict__["_weights"] = _weight_names(self.block)

    @property
    def compiled_graphs(self) -> int:
        """How many graphs inductor has compiled for this block (one per shape family)."""
        return len(self._compiled)

    def _dynamic(self, inputs: tuple[Any, ...]) -> list[set[int]]:
        given = self.dynamic_dims or [{} for _ in inputs]
        return [{d % x.dim() for d in dims} if isinstance(x, torch.Tensor) and x.dim() else set()
                for x, dims in zip(inputs, given)]

    def _find(self, inputs: tuple[Any, ...], key: tuple[Any, ...]) -> _Compiled | None:
        return next((entry for entry in self._compiled if entry.applies(key, inputs)), None)

    def _compile(self, inputs: tuple[Any, ...]) -> tuple[_Compiled, tuple[Any, ...]]:
        """The compiled graph for ``inputs``, and the inputs to call it with (weights added)."""
        from torch._inductor.compile_fx import compile_fx

        weights = self._weights
        flat = inputs + tuple(attribute_at(self.block, name) for name in weights)
        dynamic = self._dynamic(inputs) + [set() for _ in weights]
        key = (tuple(weights), *_static_key(flat, dynamic))
        found = self._find(flat, key)
        if found is not None:
            return found, flat
        mode, fakes = _fake_inputs(flat, dynamic)
        # compile_fx takes ownership of (and may change) the module it compiles: a fresh copy.
        graph_module = _weights_as_inputs(self.block, weights)
        # No ambient tracing context: the fake mode is this one, not a caller's.
        with (
            torch._guards.tracing(torch._guards.TracingContext(mode)),
            torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False),
            torch._functorch.config.patch(
                enable_autograd_cache=False, enable_remote_autograd_cache=False
            ),
        ):
            run = compile_fx(graph_module, fakes)
        guards = mode.shape_env.produce_guards_expression(fakes)  # block inputs: tensors and ints
        code = None if guards is None else compile(guards, "<inductor block guards>", "eval")
        entry = _Compiled(key, code, run)
        self._compiled.append(entry)
        return entry, flat

    def _output_spec(self) -> pytree.TreeSpec:
        codegen = self.block.graph._codegen
        info = getattr(codegen, "pytree_info", None)
        if info is not None and info.out_spec is not None:
            return info.out_spec
        if "_out_spec" not in self.__dict__:
            outputs = self.block.graph.output_node().args[0]
            self.__dict__["_out_spec"] = pytree.tree_structure(outputs)
        return self.__dict__["_out_spec"]

    def forward(self, *inputs: Any) -> Any:
        entry, flat = self._compile(inputs)
        outputs = entry.run(*flat)
        spec = self._output_spec()  # inductor returns a flat list: the block's structure again
        if spec.is_leaf():
            return outputs[0] if isinstance(outputs, (list, tuple)) else outputs
        return pytree.tree_unflatten(list(outputs), spec)

    def as_pytorch(self) -> fx.GraphModule:
        """The graph it compiles (with the weights it computes with)."""
        return self.block


class InductorEngine(Engine):
    """Inductor lowers what it can and falls back to the ATen kernel for the rest, so it
    takes every ATen op (the default ``supports``)."""

    name = "inductor"

    def build_block(
        self,
        block: fx.GraphModule,
        example_inputs: list[torch.Tensor],
        dynamic_dims: DynamicDims | None,
    ) -> torch.nn.Module:
        return InductorBlock(standalone_block(block), dynamic_dims)
