"""Complex inputs and outputs at the edge of a compiled module.

Inside, complex values travel as real ``[..., 2]`` tensors; outside, the caller passes and
receives complex tensors as with ``ep.module()``. :func:`add_input_adapters` puts a
``view_as_real`` after each complex input (a conjugate view resolved first);
:func:`add_output_adapters` a ``view_as_complex`` before each output that was complex in the
exported program AND is packed real there: an output computed complex in a fallback block
(``torch.linalg.eig``) passes untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

__all__ = [
    "add_input_adapters",
    "add_output_adapters",
    "flat_outputs",
    "input_placeholders",
    "is_packed_real",
    "pass_complex_outputs_through",
    "view_outputs_as_complex",
]

_VIEW_AS_REAL = torch.ops.aten.view_as_real.default
_RESOLVE_CONJ = torch.ops.aten.resolve_conj.default
_VIEW_AS_COMPLEX = torch.ops.aten.view_as_complex.default


def input_placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _complex_like(packed: Any, dtype: torch.dtype) -> Any:
    """The complex value a packed ``[..., 2]`` meta value stands for (fake or real)."""
    if not isinstance(packed, torch.Tensor):
        return packed
    try:
        return torch.view_as_complex(packed)
    except RuntimeError:  # non-contiguous fake value: the shape and dtype are what matter
        return torch.empty_strided(packed.shape[:-1], [s // 2 for s in packed.stride()[:-1]], dtype=dtype, device=packed.device)


def add_input_adapters(gm: fx.GraphModule, complex_inputs: list[torch.dtype | None]) -> list[fx.Node]:
    """Make each complex user input complex again at the placeholder: ``view_as_real`` after
    it (after ``resolve_conj``: a ``z.conj()`` input is a conjugate view, which
    ``view_as_real`` refuses; a no-op for any other tensor).

    The placeholder keeps its name, so the exported codegen's parameter names still match.
    Returns the placeholders that became complex.
    """
    placeholders = input_placeholders(gm)
    if len(placeholders) != len(complex_inputs):
        raise ValueError(
            f"the lowered graph has {len(placeholders)} inputs but its complex I/O record lists "
            f"{len(complex_inputs)}"
        )
    changed = []
    # adapters go after ALL inputs (get_attr nodes may come before them: a no_grad region)
    first_op = placeholders[-1].next if placeholders else next(iter(gm.graph.nodes))
    for ph, dtype in zip(placeholders, complex_inputs):
        if dtype is None:
            continue
        packed_val = ph.meta.get("val")
        with gm.graph.inserting_before(first_op):
            # a conjugate view (z.conj()) must be resolved first: view_as_real refuses it
            resolved = gm.graph.call_function(_RESOLVE_CONJ, (ph,))
            unpack = gm.graph.call_function(_VIEW_AS_REAL, (resolved,))
        ph.replace_all_uses_with(unpack, delete_user_cb=lambda user: user is not resolved)
        unpack.meta["val"] = packed_val
        ph.meta["val"] = resolved.meta["val"] = _complex_like(packed_val, dtype)
        ph.meta["tetrt_complex_input"] = dtype
        changed.append(ph)
    gm.recompile()
    return changed


def _is_complex(node: Any) -> bool | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.is_complex() if isinstance(val, torch.Tensor) else None


def pass_complex_outputs_through(gm: fx.GraphModule, complex_outputs: list[torch.dtype | None]) -> int:
    """Return a complex result as it is, not as ``view_as_real`` of it.

    When an output is ``view_as_real(z)`` of a complex ``z`` (a fallback op such as eig,
    wrapped by the lowering), packing it only for the boundary to unpack it again is
    waste: output ``z`` itself. Such an output reaches the boundary genuinely complex,
    which is why the boundary must look at the value's dtype. Returns how many changed.
    """
    out = gm.graph.output_node()
    flat = list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else None
    if flat is None or len(flat) != len(complex_outputs):
        return 0
    changed = 0
    for i, (value, dtype) in enumerate(zip(flat, complex_outputs)):
        if (
            dtype is not None
            and isinstance(value, fx.Node)
            and value.target is _VIEW_AS_REAL
            and _is_complex(value.args[0])
        ):
            flat[i] = value.args[0]
            changed += 1
    if changed:
        out.args = (type(out.args[0])(flat),)
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed


def is_packed_real(value: Any) -> bool:
    """Whether an output value is a real tensor standing for a complex one (its recorded
    value is real); a genuinely complex value (eig in a fallback block) is not."""
    return isinstance(value, fx.Node) and _is_complex(value) is False


def flat_outputs(gm: fx.GraphModule) -> list[Any]:
    """The values the output node returns, as a list (one value if it returns one)."""
    out = gm.graph.output_node()
    return list(out.args[0]) if isinstance(out.args[0], (list, tuple)) else [out.args[0]]


def view_outputs_as_complex(gm: fx.GraphModule, complex_outputs: list[torch.dtype | None], indices: list[int]) -> int:
    """Put ``view_as_complex`` before the flat outputs at ``indices``; returns how many."""
    out = gm.graph.output_node()
    flat = flat_outputs(gm)
    for i in indices:
        value, dtype = flat[i], complex_outputs[i]
        with gm.graph.inserting_before(out):
            pack = gm.graph.call_function(_VIEW_AS_COMPLEX, (value,))
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor) and not val.is_complex():
            pack.meta["val"] = _complex_like(val, dtype)
        flat[i] = pack
    if isinstance(out.args[0], (list, tuple)):
        out.args = (type(out.args[0])(flat),)
    else:
        out.args = (flat[0],)
    gm.recompile()
    return len(indices)


def add_output_adapters(gm: fx.GraphModule, complex_outputs: list[torch.dtype | None]) -> int:
    """Put ``view_as_complex`` before each output that was complex in the program and is
    packed real here (:func:`is_packed_real`); returns how many.

    The output node must hold the flat outputs (the pytree codegen rebuilds the user's
    structure from them). If it does not - a retrace recorded a namedtuple as one node -
    the outputs cannot be matched to the program's, and nothing is wrapped.
    """
    flat = flat_outputs(gm)
    if len(flat) != len(complex_outputs):
        return 0
    chosen = [i for i, (v, dtype) in enumerate(zip(flat, complex_outputs)) if dtype is not None and is_packed_real(v)]
    return view_outputs_as_complex(gm, complex_outputs, chosen)
