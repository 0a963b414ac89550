"""``lower``: complex ATen graph in, real-only graph out, by either strategy."""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
import torch.fx as fx

from tetrt_support.complex._inline import inline_complex_wrappers
from tetrt_support.complex.retrace import retrace_complex
from tetrt_support.complex.rewrite import rewrite_complex
from tetrt_support.complex.shape_env import use_private_shape_env

__all__ = ["COMPLEX_IO_KEY", "STRATEGIES", "complex_io", "lower"]

Strategy = Literal["rewrite", "retrace"]
#: the two ways to lower: an in-place FX rewrite, or a make_fx retrace
STRATEGIES: tuple[str, ...] = ("rewrite", "retrace")
#: ``meta`` key of a lowered module (and of a compiled one): :func:`complex_io` of the program
COMPLEX_IO_KEY = "tetrt_complex_io"


def _as_graph_module(program: Any) -> fx.GraphModule:
    """A graph module the lowering may change, fake values and ShapeEnv included."""
    if isinstance(program, torch.export.ExportedProgram):
        return use_private_shape_env(program.module())
    if isinstance(program, fx.GraphModule):
        # the lowering replaces attributes and the graph
        return use_private_shape_env(copy.deepcopy(program))
    raise TypeError(
        f"lower() takes a torch.export.ExportedProgram or a torch.fx.GraphModule, got {type(program).__name__}"
    )


def _complex_dtype(val: Any) -> torch.dtype | None:
    return val.dtype if isinstance(val, torch.Tensor) and val.is_complex() else None


def complex_io(gm: fx.GraphModule) -> dict[str, list[torch.dtype | None]]:
    """Complex dtype (or None) of each FLAT input and output of ``gm`` (before lowering)."""
    inputs = [_complex_dtype(p.meta.get("val")) for p in gm.graph.find_nodes(op="placeholder")]
    (out_node,) = gm.graph.find_nodes(op="output")
    flat = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    outputs = [_complex_dtype(o.meta.get("val")) if isinstance(o, fx.Node) else None for o in flat]
    return {"inputs": inputs, "outputs": outputs}


def lower(
    program_or_graph_module: torch.export.ExportedProgram | fx.GraphModule,
    strategy: Strategy = "rewrite",
    *,
    unsupported: Literal["raise", "fallback"] = "raise",
) -> fx.GraphModule:
    """Lower every complex-valued node to real arithmetic on a trailing ``[..., 2]`` dim.

    ``strategy="rewrite"`` edits the exported graph in place; ``"retrace"`` re-records it
    with make_fx. Both use the same rules (:data:`~tetrt_support.complex.rules.RULES`).
    The result is called exactly like ``ep.module()`` (positions, keywords, output
    pytree); complex model inputs/outputs are taken/returned as real ``[..., 2]``
    tensors, as recorded in ``gm.meta[COMPLEX_IO_KEY]`` (a complex dtype per packed
    flat input/output, None for the others). Parameter and buffer names (and so
    ``state_dict`` keys) do not change; complex ones hold their ``view_as_real``.

    Regions that export wrapped in ``wrap_with_set_grad_enabled`` / ``wrap_with_autocast``
    submodules (HF Llama 4's rotary embedding on torch 2.11) are inlined first when they
    hold complex values (:mod:`tetrt_support.complex._inline` says what that drops).

    ``unsupported="raise"`` raises :class:`UnsupportedComplexOp` for an op without a
    rule; ``"fallback"`` keeps it as a complex island between ``view_as_complex`` and
    ``view_as_real`` for a PyTorch fallback block.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be 'rewrite' or 'retrace', got {strategy!r}")
    if unsupported not in ("raise", "fallback"):
        raise ValueError(f"unsupported must be 'raise' or 'fallback', got {unsupported!r}")
    gm = inline_complex_wrappers(_as_graph_module(program_or_graph_module))
    io = complex_io(gm)
    if strategy == "rewrite":
        gm = rewrite_complex(gm, unsupported)
    else:
        gm = retrace_complex(gm, unsupported)
    gm.meta[COMPLEX_IO_KEY] = io
    return gm
