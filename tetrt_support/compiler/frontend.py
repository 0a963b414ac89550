"""What ``compile`` accepts: an ``ExportedProgram``, or a module and its example inputs.

Torch-TensorRT's ``compile(module, ir="dynamo", arg_inputs=..., kwarg_inputs=...)``
exports an ``nn.Module`` itself; so does this package, with ``torch.export.export(...,
strict=False)`` (the same non-strict export Torch-TensorRT's ``dynamo.trace`` runs) and
the user's ``dynamic_shapes``. The program is then compiled exactly as a program the user
exported, so both spellings give the same blocks. ``inputs`` is Torch-TensorRT's older
alias of ``arg_inputs``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["as_exported_program"]


def _as_tuple(arg_inputs: Any) -> tuple[Any, ...]:
    if isinstance(arg_inputs, torch.Tensor):
        return (arg_inputs,)
    if isinstance(arg_inputs, Sequence) and not isinstance(arg_inputs, str):
        return tuple(arg_inputs)
    raise TypeError(f"arg_inputs must be a tensor or a sequence of inputs, got {type(arg_inputs).__name__}")


def _describe_leaf(x: Any) -> str:
    return f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else repr(x)


def _check_agrees_with_program(program: torch.export.ExportedProgram, arg_inputs: Any, kwarg_inputs: Any) -> None:
    """Inputs given with a program, as Torch-TensorRT accepts them: they must be the program's
    example inputs in kind, structure, dtype and shape (the engine is built for those)."""
    example = program.example_inputs
    args = _as_tuple(arg_inputs) if arg_inputs is not None else ()
    given = (args, dict(kwarg_inputs or {}))
    if example is None:
        raise TypeError("compile() got an ExportedProgram without example inputs and inputs beside it; "
                        "export the module with those inputs instead")
    want_leaves, want_spec = pytree.tree_flatten_with_path(example)
    got_leaves, got_spec = pytree.tree_flatten_with_path(given)
    if want_spec != got_spec:
        raise TypeError(f"compile(): the inputs given do not have the program's structure: expected {want_spec}, "
                        f"got {got_spec} (a program was exported with its own inputs)")
    for (path, want), (_, got) in zip(want_leaves, got_leaves):
        same = (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and want.dtype == got.dtype
                and want.shape == got.shape) or (not isinstance(want, torch.Tensor) and want == got)
        if not same:
            raise TypeError(f"compile(): input {pytree.keystr(path)} is {_describe_leaf(got)}, but the program was "
                            f"exported with {_describe_leaf(want)}; export the module with these inputs instead")


def as_exported_program(
    model: torch.nn.Module | torch.export.ExportedProgram,
    arg_inputs: Sequence[Any] | torch.Tensor | None = None,
    kwarg_inputs: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    inputs: Sequence[Any] | None = None,
) -> torch.export.ExportedProgram:
    """``model`` itself if it is a program, else ``model`` exported with the inputs given.

    A program carries its example inputs and shapes: passing inputs with it raises rather
    than being ignored (export the module with them instead).
    """
    if inputs is not None:
        if arg_inputs is not None:
            raise TypeError("give arg_inputs or its alias inputs, not both")
        arg_inputs = inputs
    if isinstance(model, torch.export.ExportedProgram):
        if dynamic_shapes is not None:
            raise TypeError(
                "compile() got an ExportedProgram and dynamic_shapes; a program was exported with its own "
                "dynamic shapes. Pass the nn.Module instead to export it here"
            )
        if arg_inputs is not None or kwarg_inputs is not None:
            _check_agrees_with_program(model, arg_inputs, kwarg_inputs)
        return model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"compile() takes a torch.nn.Module (with arg_inputs/kwarg_inputs) or a "
            f"torch.export.ExportedProgram, got {type(model).__name__}"
        )
    if arg_inputs is None and kwarg_inputs is None:
        raise TypeError(
            f"compile() got the module {type(model).__name__} without example inputs; pass "
            f"arg_inputs=(...) and/or kwarg_inputs={{...}} (as for torch_tensorrt.compile), "
            f"or an ExportedProgram"
        )
    args = _as_tuple(arg_inputs) if arg_inputs is not None else ()
    kwargs = dict(kwarg_inputs or {})
    return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
