"""The compiled module's first step: each input's complexness, checked by name.

Inside, a compiled module carries complex values as real ``[..., 2]`` pairs; a real
tensor passed where a complex one belongs (or the reverse) would otherwise first fail in
an engine or in ``view_as_real``, far from the input's name. So the compiled graph calls
:func:`check_complex_inputs` right after its placeholders.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from tetrt_support.compiler.io_adapters import input_placeholders

__all__ = ["add_input_check", "check_complex_inputs"]


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        kind = "complex" if value.is_complex() else "real"
        return f"a {kind} tensor of dtype {value.dtype}"
    return f"a {type(value).__name__}"


def check_complex_inputs(names: tuple[str, ...], exported: tuple[Any, ...], *values: Any) -> None:
    """Raise TypeError if a complex input gets a real tensor, or a real one a complex tensor.

    ``exported`` holds the dtype each flat input was exported with (None for non-tensors).
    """
    for name, dtype, value in zip(names, exported, values):
        if not isinstance(dtype, torch.dtype) or not isinstance(value, torch.Tensor):
            continue
        if dtype.is_complex != value.is_complex():
            want = "complex" if dtype.is_complex else "real"
            raise TypeError(
                f"input {name!r} must be a {want} tensor (exported as {dtype}), but got {_describe(value)}"
            )


if hasattr(fx.node, "has_side_effect"):  # keeps the check through dead-code elimination
    fx.node.has_side_effect(check_complex_inputs)


def add_input_check(gm: fx.GraphModule, complex_inputs: list[torch.dtype | None]) -> fx.Node:
    """Insert a :func:`check_complex_inputs` call ahead of everything but the placeholders."""
    placeholders = input_placeholders(gm)
    exported = []
    for ph, dtype in zip(placeholders, complex_inputs):
        val = ph.meta.get("val")
        exported.append(dtype if dtype is not None else (val.dtype if isinstance(val, torch.Tensor) else None))
    # after the LAST placeholder: a torch.no_grad() region makes ep.module() start with
    # get_attr nodes, so "the first non-placeholder" can come before the inputs
    with gm.graph.inserting_after(placeholders[-1]) if placeholders else gm.graph.inserting_before(next(iter(gm.graph.nodes))):
        node = gm.graph.call_function(
            check_complex_inputs, (tuple(p.name for p in placeholders), tuple(exported), *placeholders)
        )
    gm.recompile()
    return node
