"""Keep an exported module's call signature across a ``make_fx`` retrace.

``ep.module()`` carries a ``_PyTreeCodeGen``: ``forward`` takes the user's positional
and keyword arguments, flattens them by ``in_spec`` and rebuilds the output pytree by
``out_spec``. A retrace of that ``forward`` yields a plain ``CodeGen`` with placeholders
``arg0_1, ...`` (keyword calls fail), and, worse, traces THROUGH the output rebuild:
make_fx records a namedtuple or registered dataclass output as ONE call_function node.
Restoring the out_spec over such a graph, or flattening its output, is wrong (a
dataclass is not iterable; a dict comes back as its keys: :mod:`tetrt_support.history`
re-enacts both).

The right fix, implemented here: give the graph a plain ``CodeGen()`` WHILE retracing,
so the retrace sees flat inputs and returns the graph's flat outputs; then put the
original pytree codegen back on the input module and on the retraced one, and rename
the retraced placeholders back to the original names.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch.fx as fx
from torch.fx.graph import CodeGen

__all__ = ["restore_signature", "retrace_preserving_signature"]


def retrace_preserving_signature(
    gm: fx.GraphModule, retrace: Callable[[fx.GraphModule], fx.GraphModule]
) -> fx.GraphModule:
    """Run ``retrace(gm)`` with ``gm`` temporarily given a plain (flat) ``CodeGen``, then
    restore ``gm``'s codegen and give the retraced module the same signature.

    ``retrace`` receives ``gm`` whose ``forward`` takes the flat placeholders
    positionally and returns the flat outputs as a tuple (``ep.module()``'s input check
    is off meanwhile: ``validate_inputs = False``); it must return a module whose
    placeholders and outputs are those same flat values, in the same order.
    """
    original = gm.graph._codegen
    validate = getattr(gm, "validate_inputs", None)
    gm.graph.set_codegen(CodeGen())
    gm.recompile()
    if validate is not None:
        gm.validate_inputs = False  # ep.module()'s pre-hook would reject the flat call
    try:
        retraced = retrace(gm)
    finally:
        gm.graph.set_codegen(original)
        gm.recompile()
        if validate is not None:
            gm.validate_inputs = validate
    return restore_signature(gm, retraced)


def restore_signature(original: fx.GraphModule, retraced: fx.GraphModule) -> fx.GraphModule:
    """Give ``retraced`` the codegen (pytree in/out specs) and placeholder names of
    ``original``; returns ``retraced``. Both graphs must have the same number of flat
    placeholders in the same order, and ``retraced`` must return flat outputs."""
    old = original.graph.find_nodes(op="placeholder")
    new = retraced.graph.find_nodes(op="placeholder")
    if len(old) != len(new):
        raise ValueError(
            f"cannot restore the signature: the original graph has {len(old)} placeholders "
            f"({[n.name for n in old]}), the retraced one {len(new)} ({[n.name for n in new]})"
        )
    taken = {n.name: n for n in retraced.graph.nodes}
    for o, n in zip(old, new):
        clash = taken.get(o.name)
        if clash is not None and clash is not n:
            clash._rename(f"{o.name}_1")  # free the name for the placeholder
    for o, n in zip(old, new):
        n.target = o.target
        n._rename(o.name)
    retraced.graph.set_codegen(copy.copy(original.graph._codegen))
    retraced.recompile()
    return retraced
