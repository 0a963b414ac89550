"""Keeping an exported program's call signature through a compile, and how it gets lost.

``ep.module()`` is called like the user's model because its graph carries a
``_PyTreeCodeGen``: ``forward`` takes the original parameter names, flattens them with the
export's ``in_spec``, and rebuilds the outputs with ``out_spec`` (a dict, namedtuple,
registered dataclass, ``ModelOutput``...). Three things have broken that in
Torch-TensorRT's complex support; each is reproduced here as a :class:`SignaturePolicy`
that :func:`tetrt_support.complex.compiler.compile_with_policy` can run:

- :data:`BEFORE_FIX`: a ``make_fx`` retrace returns a plain ``CodeGen`` with placeholders
  ``arg0_1, ...``, so a keyword call fails (``forward() got an unexpected keyword argument
  'input_ids'``); after complex I/O adapters the codegen is rebuilt from placeholder names
  (``x_unpacked_complex``), so complex-I/O models are callable by position only; and the
  output boundary unpacks only a block call returned directly, so a complex output
  returned through a getitem of a multi-output block comes back packed real.
- :data:`RESTORE_ONLY`: put the pytree codegen back after a retrace that traced THROUGH
  it. The retrace recorded the user's output structure, and the restored ``out_spec``
  re-builds it from that structure as if it were the flat leaves: a dict comes back as its
  KEYS, a ``(1, 4)`` tensor as its first row, a dataclass is "not iterable".
- :data:`FLATTEN_FIX`: the same, flattening the retraced output first (the first version
  of the fix). Dicts and tensors work, but make_fx records a namedtuple or registered
  dataclass as ONE node, so the spec finds one leaf where it expects two.
- :data:`EVERY_COMPLEX_OUTPUT`: the getitem-following boundary without a dtype check:
  genuinely complex outputs (eig in a fallback block) get wrapped a second time.
- :data:`FINAL`: plain ``CodeGen`` during the retrace (flat outputs), then the exported
  program's codegen back on the result and the input module, placeholders renamed back;
  complex I/O adapters that keep the codegen; a boundary that unpacks an output only if
  it was packed real.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.graph import CodeGen, _PyTreeCodeGen, _PyTreeInfo
from torch.utils import _pytree as pytree

from tetrt_support.complex.codegen import restore_signature, retrace_preserving_signature
from tetrt_support.complex.io_adapters import OutputRule, input_placeholders

__all__ = [
    "BEFORE_FIX",
    "EVERY_COMPLEX_OUTPUT",
    "FINAL",
    "FLATTEN_FIX",
    "POLICIES",
    "RETRACE_MODES",
    "RESTORE_ONLY",
    "SignaturePolicy",
    "add_input_check",
    "check_complex_inputs",
    "rebuild_codegen_from_placeholders",
    "restore_codegen",
    "retrace",
]

# --------------------------------------------------------------------------- retraces

RETRACE_MODES = ("plain", "restore", "flatten", "swap")


def _without_hooks(gm: fx.GraphModule) -> Callable[..., Any]:
    """``gm``'s forward without ``ep.module()``'s input-check pre-hooks.

    Those hooks accept only the exact positional/keyword split of the export; a retrace
    calls with flat positional tensors.
    """

    def run(*args: Any) -> Any:
        return gm.forward(*args)

    return run


def _make_fx(gm: fx.GraphModule, flat_args: list[Any]) -> fx.GraphModule:
    return make_fx(_without_hooks(gm), tracing_mode="fake", _allow_non_fake_inputs=True)(*flat_args)


def retrace(gm: fx.GraphModule, flat_args: list[Any], mode: str) -> fx.GraphModule:
    """Retrace ``gm`` with ``make_fx``, handling its pytree codegen as ``mode`` says.

    ``"plain"`` keeps what make_fx returns (plain ``CodeGen``, flat positional
    ``arg0_1, ...``); ``"restore"`` puts the pytree codegen back on the retrace as is;
    ``"flatten"`` flattens the retraced output, then restores; ``"swap"`` (the fix,
    :func:`tetrt_support.complex.codegen.retrace_preserving_signature`) gives ``gm`` a
    plain ``CodeGen`` while retracing so the graph's flat outputs are recorded, then
    restores the codegen on the result AND on ``gm`` and renames placeholders back.
    """
    if mode not in RETRACE_MODES:
        raise ValueError(f"unknown retrace mode {mode!r}; valid: {', '.join(RETRACE_MODES)}")
    if mode == "swap":
        return retrace_preserving_signature(gm, lambda flat_gm: _make_fx(flat_gm, flat_args))
    original = gm.graph._codegen
    traced = _make_fx(gm, flat_args)
    if mode == "plain":
        return traced
    out = traced.graph.output_node()
    if mode == "flatten":
        out.args = (tuple(pytree.tree_leaves(out.args[0])),)
    _set_codegen(traced, copy.deepcopy(original))
    return traced


# --------------------------------------------------------------------------- codegen


def _set_codegen(gm: fx.GraphModule, codegen: CodeGen) -> None:
    gm.graph._codegen = codegen
    gm.recompile()


def restore_codegen(gm: fx.GraphModule, ep: torch.export.ExportedProgram) -> None:
    """Give ``gm`` the exported program's codegen back, placeholders named as in ``ep.module()``."""
    restore_signature(ep.module(), gm)


def rebuild_codegen_from_placeholders(gm: fx.GraphModule) -> None:
    """What Torch-TensorRT's complex I/O adapter did (the bug): a codegen whose parameters
    are the graph's placeholder names (``arg0_1``, ``x_unpacked_complex``), so the module
    can only be called by position."""
    names = [p.name for p in input_placeholders(gm)]
    old = gm.graph._codegen
    out_spec = old.pytree_info.out_spec if isinstance(old, _PyTreeCodeGen) else None
    in_spec = pytree.tree_structure((tuple(range(len(names))), {}))
    _set_codegen(gm, _PyTreeCodeGen(_PyTreeInfo(names, in_spec, out_spec)))


# --------------------------------------------------------------------------- input check


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        kind = "complex" if value.is_complex() else "real"
        return f"a {kind} tensor of dtype {value.dtype}"
    return f"a {type(value).__name__}"


def check_complex_inputs(names: tuple[str, ...], exported: tuple[Any, ...], *values: Any) -> None:
    """Raise TypeError if a complex input gets a real tensor, or a real one a complex tensor.

    ``exported`` holds the dtype each flat input was exported with (None for non-tensors).
    Runs first in a compiled module: without it the first symptom would be an engine or
    ``view_as_real`` error far from the input's name.
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
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(first):
        node = gm.graph.call_function(
            check_complex_inputs, (tuple(p.name for p in placeholders), tuple(exported), *placeholders)
        )
    gm.recompile()
    return node


# --------------------------------------------------------------------------- policies


@dataclasses.dataclass(frozen=True)
class SignaturePolicy:
    """How a compile treats the call signature; only :data:`FINAL` is right."""

    name: str
    #: what to do with a make_fx retrace's codegen: "plain", "restore", "flatten", or
    #: "trust" (lowering already retraced with the codegen swap, see ``retrace(mode="swap")``)
    retrace_mode: str
    output_rule: OutputRule
    rebuild_codegen_after_io_adapters: bool
    input_rename: str | None
    restore_lost_codegen: bool

    def retrace(self, gm: fx.GraphModule, flat_args: list[Any]) -> fx.GraphModule:
        """The retrace path's codegen handling (identity for "trust")."""
        if self.retrace_mode == "trust":
            return gm
        traced = retrace(gm, flat_args, self.retrace_mode)
        traced.meta.update(gm.meta)
        return traced


BEFORE_FIX = SignaturePolicy("before the fix", "plain", OutputRule.BLOCK_CALL_ONLY, True, "{}_unpacked_complex", False)
RESTORE_ONLY = SignaturePolicy("restore only", "restore", OutputRule.BLOCK_CALL_ONLY, True, "{}_unpacked_complex", False)
FLATTEN_FIX = SignaturePolicy("flatten fix", "flatten", OutputRule.BLOCK_CALL_ONLY, True, "{}_unpacked_complex", False)
EVERY_COMPLEX_OUTPUT = SignaturePolicy("every complex output", "trust", OutputRule.EVERY_COMPLEX_OUTPUT, False, None, True)
FINAL = SignaturePolicy("final", "trust", OutputRule.PACKED_ONLY, False, None, True)
POLICIES = {p.name: p for p in (BEFORE_FIX, RESTORE_ONLY, FLATTEN_FIX, EVERY_COMPLEX_OUTPUT, FINAL)}
