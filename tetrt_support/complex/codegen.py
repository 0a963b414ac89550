"""Keep an exported module's call signature across a ``make_fx`` retrace.

The graph gets a plain ``CodeGen()`` WHILE retracing, so the retrace sees flat inputs and
returns flat outputs; then the original ``_PyTreeCodeGen`` goes back on the input module and
the retraced one, and the retraced placeholders get their original names. Why the simpler
fixes fail (``docs/architecture.md``, section 4): a retrace traces THROUGH the output rebuild;
:mod:`tetrt_support.history` re-enacts them.
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
