"""Lower ONE complex node with the shared rule table; used by both strategies.

The strategies differ only in what a value is (a tensor under ``make_fx``, or a
``torch.fx.Proxy`` bound to the graph being rewritten) and in how a node's inputs are
looked up; this module is the part they share: find the rule, bind the arguments, call
it, or build the complex island / raise :class:`UnsupportedComplexOp`.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Literal

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true

from tetrt_support.complex.detect import is_complex_value
from tetrt_support.complex.errors import UnsupportedComplexOp, user_source_line
from tetrt_support.complex.rules import RULES, RuleContext, bind_arguments, real_dtype

aten = torch.ops.aten

Unsupported = Literal["raise", "fallback"]

def program_fake_mode(gm: fx.GraphModule) -> Any:
    """The fake mode (and so the ShapeEnv of symbolic dims) of ``gm``'s meta values."""
    mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    if mode is None:
        raise ValueError(
            "complex lowering needs node.meta['val'] (fake tensors) on the graph; pass an "
            "ExportedProgram, ep.module(), or a make_fx graph"
        )
    return mode


def lower_node(
    node: fx.Node,
    lookup: Callable[[fx.Node], Any],
    original: dict[fx.Node, Any],
    unsupported: Unsupported,
) -> Any:
    """The packed result of ``node``. ``lookup`` gives the packed value of an input node,
    ``original`` the ORIGINAL (complex) meta value of every node of the graph."""
    if node.op != "call_function":
        return _unsupported(node, unsupported, lookup, original)
    target = node.target
    if target is operator.getitem:
        return lookup(node.args[0])[node.args[1]]
    rule, in_place = RULES.get(target), False
    if rule is None and (twin := _functional_twin(target)) is not None:
        rule, in_place = RULES[twin], True
    if rule is None:
        return _unsupported(node, unsupported, lookup, original)
    args = fx.node.map_arg(node.args, lookup)
    kwargs = fx.node.map_arg(node.kwargs, lookup)
    arg_vals = fx.node.map_arg(node.args, lambda n: original[n])
    kwarg_vals = fx.node.map_arg(node.kwargs, lambda n: original[n])
    ctx = RuleContext(node, bind_arguments(target, arg_vals, kwarg_vals), original[node])
    bound = bind_arguments(target, args, kwargs)
    result = rule(ctx, **bound)
    if in_place:  # write the functional result back into the packed destination
        result = aten.copy_.default(bound["self"], result)
    return result


def _functional_twin(target: Any) -> Any:
    """``aten.mul.Tensor`` for ``aten.mul_.Tensor``: the functional overload of an
    in-place op, when it has a rule."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target.overloadpacket.__name__
    if not name.endswith("_") or name.startswith("_") or not target._schema.is_mutable:
        return None
    twin = getattr(getattr(aten, name[:-1], None), target._overloadname, None)
    return twin if twin in RULES else None


def _unsupported(
    node: fx.Node, mode: Unsupported, lookup: Callable[[fx.Node], Any], original: dict[fx.Node, Any]
) -> Any:
    if mode == "raise" or node.op != "call_function":
        raise UnsupportedComplexOp(node.target, node.name, user_source_line(node))
    return complex_island(node, lookup, original)


def complex_island(node: fx.Node, lookup: Callable[[fx.Node], Any], original: dict[fx.Node, Any]) -> Any:
    """Keep an op with no rule as complex: ``view_as_complex`` on each packed input, the
    op itself, ``view_as_real`` on each complex result (through ``getitem`` for a
    multi-output op). A later partitioner can put the island into a PyTorch block."""

    def unpack(n: fx.Node) -> Any:
        x = lookup(n)
        v = original[n]
        if isinstance(v, torch.Tensor) and v.is_complex():
            # packed values always have a unit-stride pair dim and even strides, so
            # view_as_complex aliases them: a mutating op writes through to the packed form
            return aten.view_as_complex.default(x)
        return x

    result = node.target(*fx.node.map_arg(node.args, unpack), **fx.node.map_arg(node.kwargs, unpack))
    out = original[node]
    if isinstance(out, torch.Tensor):
        return aten.view_as_real.default(result) if out.is_complex() else result
    if isinstance(out, (tuple, list)):
        return [
            aten.view_as_real.default(result[i]) if is_complex_value(o) else result[i]
            for i, o in enumerate(out)
        ]
    return result


def expected_packed(val: Any) -> tuple[torch.dtype, tuple] | None:
    """(dtype, shape) the packed form of a tensor value must have; None for non-tensors."""
    if not isinstance(val, torch.Tensor):
        return None
    if val.is_complex():
        return real_dtype(val.dtype), (*val.shape, 2)
    return val.dtype, tuple(val.shape)


def check_packed(node: fx.Node, got: torch.Tensor, want: tuple[torch.dtype, tuple]) -> bool:
    """Raise if a rule's result provably has the wrong shape; return whether its dtype
    differs from the wanted one (the caller casts: promotion corner cases such as a
    0-dim float64 operand are easier to fix once than in every rule)."""
    dtype, shape = want
    mismatch = len(got.shape) != len(shape) or any(
        statically_known_true(a != b) for a, b in zip(got.shape, shape)
    )
    if mismatch:
        raise AssertionError(
            f"complex lowering rule for {node.target} (node {node.name!r}) produced shape "
            f"{tuple(got.shape)}, expected {shape}: a bug in tetrt_support.complex.rules"
        )
    return got.dtype != dtype
