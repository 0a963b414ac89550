"""``refit_module_weights``: new weights into a compiled module, partition and engines kept.

As Torch-TensorRT's function of that name: each weight the compiled module computes with
(recorded by :func:`record_refit_weights`) gets its new value, packed as the compile packed
it, and values folded from weights are computed again. Everything is checked before
anything is replaced; ``in_place=False`` (default) refits a copy. Details:
``docs/architecture.md`` ("Module notes", Refit).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from tetrt_support.compiler.configured_engine import Float64AsFloat32, WeightsAsInputs, replace_tensor_attribute
from tetrt_support.compiler.constant_folding import FOLDED_KEY, FoldedConstants
from tetrt_support.compiler.partition import block_kind

if TYPE_CHECKING:
    from tetrt_support.compiler.context import CompileContext

__all__ = [
    "BLOCK_WEIGHTS_KEY",
    "WEIGHTS_KEY",
    "ArchitectureMismatch",
    "RefitVerificationError",
    "UnusableWeight",
    "record_refit_weights",
    "refit_module_weights",
]

#: ``meta`` key of a compiled module: {name: (shape, dtype, persistent, device)} of the
#: program's parameters and buffers
WEIGHTS_KEY = "tetrt_weights"
#: ``meta`` key of a compiled module: {block name: names of the weights its graph reads}
BLOCK_WEIGHTS_KEY = "tetrt_block_weights"


class ArchitectureMismatch(ValueError):
    """The new weights do not belong to the architecture the module was compiled from."""


class UnusableWeight(ArchitectureMismatch):
    """A new weight of the right shape and dtype that the engines cannot compute with: it
    holds no data (a meta or fake tensor) or lives on another device than the module's."""


# --------------------------------------------------------------------------- recording (passes)
def _program_weights(ep: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    sig = ep.graph_signature
    out: dict[str, torch.Tensor] = {}
    for name in [*sig.parameters, *sig.buffers]:
        value = ep.state_dict.get(name, ep.constants.get(name))
        if isinstance(value, torch.Tensor):
            out[name] = value
    return out


def record_refit_weights(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """Record what a refit checks and fills, right after partitioning: the program's
    parameters and buffers (names, shapes, dtypes: the architecture; ``ctx.refit_weights``)
    and, per block, the ones its graph reads, folded values included (before an engine
    replaces the graph; ``ctx.block_weights``). The compiled module keeps both in its
    ``meta``, under :data:`WEIGHTS_KEY` and :data:`BLOCK_WEIGHTS_KEY`."""
    ep = ctx.exported_program
    non_persistent = set(ep.graph_signature.non_persistent_buffers)
    known = {
        name: (tuple(t.shape), t.dtype, name not in non_persistent, str(t.device))
        for name, t in _program_weights(ep).items()
    }
    folded = ctx.folded
    refitted = set(known) | set(folded.names if folded is not None else ())
    per_block: dict[str, list[str]] = {}
    for name, module in gm.named_children():
        if block_kind(name) is None or not isinstance(module, fx.GraphModule):
            continue
        targets = {str(n.target) for n in module.graph.nodes if n.op == "get_attr"}
        per_block[name] = sorted(t for t in targets if t in refitted)
    ctx.refit_weights, ctx.block_weights = known, per_block
    return gm


# --------------------------------------------------------------------------- new weights
def _weights_of(new_weights: Any) -> tuple[dict[str, torch.Tensor], bool]:
    """{name: tensor} and whether non-persistent buffers are included."""
    if isinstance(new_weights, torch.export.ExportedProgram):
        return _program_weights(new_weights), True
    if isinstance(new_weights, torch.nn.Module):
        found = dict(new_weights.state_dict(keep_vars=True))
        found.update(new_weights.named_buffers(remove_duplicate=False))
        return {k: v for k, v in found.items() if isinstance(v, torch.Tensor)}, True
    if isinstance(new_weights, Mapping):
        bad = next((k for k, v in new_weights.items() if not isinstance(v, torch.Tensor)), None)
        if bad is not None:
            raise TypeError(f"new_weights[{bad!r}] is a {type(new_weights[bad]).__name__}, not a tensor")
        return dict(new_weights), False
    raise TypeError(
        f"refit_module_weights takes new weights as a state dict, an nn.Module or an "
        f"ExportedProgram, got {type(new_weights).__name__}"
    )


def _checked(compiled: torch.nn.Module, new_weights: Any) -> dict[str, torch.Tensor]:
    expected = getattr(compiled, "meta", {}).get(WEIGHTS_KEY)
    if expected is None:
        raise TypeError(
            f"refit_module_weights takes a module made by tetrt_support.compile, got "
            f"{type(compiled).__name__} (it records no weights)"
        )
    given, complete = _weights_of(new_weights)
    for name, (shape, dtype, persistent, *device) in expected.items():
        if name not in given:
            if not complete and not persistent:
                continue  # a state dict leaves non-persistent buffers out: they keep their values
            raise ArchitectureMismatch(f"the new weights have no {name!r} (the compiled module's architecture has it)")
        value = given[name]
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise ArchitectureMismatch(
                f"{name!r}: the compiled module has shape {list(shape)} and dtype {dtype}, "
                f"the new weights have shape {list(value.shape)} and dtype {value.dtype}"
            )
        _check_usable(name, value, device[0] if device else None)
    extra = next((name for name in given if name not in expected), None)
    if extra is not None:
        raise ArchitectureMismatch(f"the new weights have {extra!r}, which the compiled module's architecture does not")
    return given


def _check_usable(name: str, value: torch.Tensor, device: str | None) -> None:
    """Raise :class:`UnusableWeight` unless ``value`` holds data on ``device`` (the one the
    program's weight was on; None for modules compiled before it was recorded)."""
    from torch._subclasses.fake_tensor import is_fake

    if value.device.type == "meta" or is_fake(value):
        kind = "a fake tensor" if is_fake(value) else "a tensor on the meta device"
        raise UnusableWeight(
            f"{name!r}: the new weight is {kind}, which holds no data; the engines would compute "
            f"with whatever memory they find. Load the real weights first (e.g. load_state_dict(..., assign=True))"
        )
    if device is not None and str(value.device) != device:
        raise UnusableWeight(
            f"{name!r}: the compiled module computes on {device}, the new weight is on {value.device}; "
            f"move it there first (.to({device!r}))"
        )


# --------------------------------------------------------------------------- applying them
def _packed_like(name: str, value: torch.Tensor, current: torch.Tensor, truncated: bool) -> torch.Tensor:
    value = value.detach()
    if value.is_complex() and not current.is_complex():
        value = torch.view_as_real(value)  # the lowering's [..., 2] layout
    if value.dtype == torch.float64 and current.dtype == torch.float32 and truncated:
        value = value.to(torch.float32)  # truncate_double
    if value.shape != current.shape or value.dtype != current.dtype:
        raise RuntimeError(
            f"refit: {name!r} packs to shape {list(value.shape)} {value.dtype}, but the compiled module "
            f"holds {list(current.shape)} {current.dtype} there"
        )
    return value.clone()


class _Packer:
    """Each new weight packed once per stored form, so that holders which shared one tensor
    before the refit (a weight the folded recipe reads and a block reads as well) share its
    replacement, instead of each keeping a copy."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        self.weights = weights
        self._packed: dict[tuple[str, bool], torch.Tensor] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.weights

    def __call__(self, name: str, current: torch.Tensor, truncated: bool) -> torch.Tensor:
        packed = self._packed.get((name, truncated))
        if packed is None or packed.dtype != current.dtype or packed.shape != current.shape:
            packed = self._packed[(name, truncated)] = _packed_like(name, self.weights[name], current, truncated)
        return packed


def _owner(root: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    *path, field = name.split(".")
    return (root.get_submodule(".".join(path)) if path else root), field


def _weight_holders(module: torch.nn.Module, truncated: bool = False) -> list[tuple[torch.nn.Module, str, bool]]:
    """(root the names are relative to, name, truncated) for every weight in ``module``."""
    found: list[tuple[torch.nn.Module, str, bool]] = []
    if isinstance(module, WeightsAsInputs):
        found += [(module.weights, name, truncated) for name in module.weight_names]
        return found
    if isinstance(module, Float64AsFloat32):
        return _weight_holders(module.engine_block, True)
    if isinstance(module, fx.GraphModule):
        targets = dict.fromkeys(str(n.target) for n in module.graph.nodes if n.op == "get_attr")
        found += [(module, t, truncated) for t in targets]
    for child in module.children():
        found += _weight_holders(child, truncated)
    return found


class _Journal:
    """Every attribute a refit replaces, with what was there, so that a refit that fails
    half-way puts the module back exactly as it was (the same tensor objects)."""

    def __init__(self) -> None:
        self._done: list[tuple[torch.nn.Module, str, str, Any]] = []

    def replace(self, owner: torch.nn.Module, field: str, value: torch.Tensor) -> None:
        where = "_parameters" if field in owner._parameters else "_buffers" if field in owner._buffers else "__dict__"
        self._done.append((owner, field, where, getattr(owner, where).get(field, getattr(owner, field))))
        replace_tensor_attribute(owner, field, value)

    def undo(self) -> None:
        for owner, field, where, old in reversed(self._done):
            getattr(owner, where)[field] = old
        self._done.clear()


def _refolded(folded: FoldedConstants | None, pack: _Packer, journal: _Journal) -> dict[str, torch.Tensor]:
    """The folded values computed again with the new weights ``pack`` holds; the recipe keeps
    them (the same tensors the blocks get), so that a later refit from a partial state dict
    starts from these."""
    if folded is None:
        return {}
    recipe = folded.recipe
    for source in folded.sources():
        if source in pack:
            owner, field = _owner(recipe, source)
            journal.replace(owner, field, pack(source, getattr(owner, field), False))
    return folded.evaluate()


Replacement = tuple[torch.nn.Module, str, torch.Tensor]


def _plan_block(name: str, block: torch.nn.Module, expected: list[str], pack: _Packer) -> list[Replacement]:
    """What the refit puts where in ``block`` (packing each new weight; nothing changes yet);
    raises if the block was built with a weight it cannot reach."""
    plan: list[Replacement] = []
    reached: set[str] = set()
    for root, weight, truncated in _weight_holders(block):
        if weight not in pack:
            continue  # a constant of the lowering, not a weight of the program
        owner, field = _owner(root, weight)
        current = getattr(owner, field)
        if not isinstance(current, torch.Tensor):
            continue
        plan.append((owner, field, pack(weight, current, truncated)))
        reached.add(weight)
    missing = [w for w in expected if w in pack and w not in reached]  # left-out buffers keep their values
    if missing:
        raise NotImplementedError(
            f"refit: block {name} ({type(block).__name__}) was built with {missing[0]!r}"
            f"{f' and {len(missing) - 1} more weights' if len(missing) > 1 else ''}, but its engine keeps "
            f"them where refit cannot reach them; compile again with the new weights"
        )
    return plan


def _plan_graph(target: fx.GraphModule, pack: _Packer) -> list[Replacement]:
    """The weights read by the compiled graph itself, outside any block."""
    plan: list[Replacement] = []
    for weight in dict.fromkeys(str(n.target) for n in target.graph.nodes if n.op == "get_attr"):
        if weight in pack:
            owner, field = _owner(target, weight)
            current = getattr(owner, field)
            if isinstance(current, torch.Tensor):
                plan.append((owner, field, pack(weight, current, False)))
    return plan


def refit_module_weights(
    compiled_module: torch.nn.Module,
    new_weights: Mapping[str, torch.Tensor] | torch.nn.Module | torch.export.ExportedProgram | None = None,
    *,
    in_place: bool = False,
    new_weight_module: torch.nn.Module | torch.export.ExportedProgram | None = None,
    arg_inputs: Any = None,
    kwarg_inputs: Mapping[str, Any] | None = None,
    verify_output: bool = False,
    use_weight_map_cache: bool = True,
) -> torch.nn.Module:
    """``compiled_module`` with the weights of ``new_weights``; same blocks, same engines.

    ``new_weights``: a state dict (non-persistent buffers may be left out and keep their
    values), an ``nn.Module`` or an ``ExportedProgram`` of the architecture the module was
    compiled from; the first name, shape or dtype that differs raises
    :class:`ArchitectureMismatch`, a weight without data (meta, fake) or on another device
    :class:`UnusableWeight`. Everything is checked and packed before anything is replaced;
    a refit that raises leaves ``compiled_module`` as it was, ``in_place`` or not. Returns
    the refitted copy (``in_place=False``) or ``compiled_module`` itself.

    Torch-TensorRT's spelling works too: ``new_weight_module=`` (an ``ExportedProgram`` or
    module) for ``new_weights``, and ``verify_output=True`` with ``arg_inputs`` /
    ``kwarg_inputs`` compares the refitted module with ``new_weight_module`` on those
    inputs and raises :class:`RefitVerificationError` (leaving ``compiled_module`` as it
    was) where they differ. ``use_weight_map_cache`` is accepted and changes nothing: every
    refit here maps weights by name.
    """
    if (new_weights is None) == (new_weight_module is None):
        raise TypeError("refit_module_weights: give the new weights once, as new_weights or new_weight_module")
    new_weights = new_weights if new_weights is not None else new_weight_module
    if verify_output and arg_inputs is None and not kwarg_inputs:
        raise TypeError("refit_module_weights(verify_output=True) needs arg_inputs and/or kwarg_inputs to compare on")
    if not verify_output:
        return _refit(compiled_module, new_weights, in_place)
    refitted = _refit(compiled_module, new_weights, False)
    _verify_refit(refitted, new_weights, arg_inputs, kwarg_inputs)
    return _refit(compiled_module, new_weights, True) if in_place else refitted


class RefitVerificationError(RuntimeError):
    """``verify_output=True``: the refitted module does not compute what the new weights' module does."""


def _verify_refit(refitted: torch.nn.Module, source: Any, arg_inputs: Any,
                  kwarg_inputs: Mapping[str, Any] | None) -> None:
    from tetrt_support.compiler.verify import compare_outputs

    if isinstance(source, torch.export.ExportedProgram):
        source = source.module()
    if not isinstance(source, torch.nn.Module):
        raise TypeError("refit_module_weights(verify_output=True) compares against a module: pass new_weight_module "
                        f"(an nn.Module or ExportedProgram), not a {type(source).__name__}")
    from tetrt_support.compiler.frontend import _as_tuple  # how compile() reads arg_inputs

    args = () if arg_inputs is None else _as_tuple(arg_inputs)
    with torch.no_grad():
        expected = source(*args, **dict(kwarg_inputs or {}))
        actual = refitted(*args, **dict(kwarg_inputs or {}))
    difference = compare_outputs(expected, actual)
    if difference is not None:
        raise RefitVerificationError(f"refit_module_weights(verify_output=True): the refitted module does not match "
                                     f"new_weight_module on the given inputs: {difference}")


def _refit(compiled_module: torch.nn.Module, new_weights: Any, in_place: bool) -> torch.nn.Module:
    pack = _Packer(dict(_checked(compiled_module, new_weights)))  # a copy: the caller's dict stays as passed
    target = compiled_module if in_place else copy.deepcopy(compiled_module)
    per_block = target.meta.get(BLOCK_WEIGHTS_KEY, {})
    journal = _Journal()
    with torch.no_grad():
        try:
            # the folded recipe must read the new weights to compute the new folded values
            pack.weights.update(_refolded(target.meta.get(FOLDED_KEY), pack, journal))
            plan: list[Replacement] = []
            for name, block in target.named_children():
                if block_kind(name) is not None:
                    plan += _plan_block(name, block, per_block.get(name, []), pack)
            plan += _plan_graph(target, pack)
            for owner, field, value in plan:
                journal.replace(owner, field, value)
        except BaseException:
            journal.undo()
            raise
    return target
