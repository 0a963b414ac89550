"""The zoo's one registry: every model by name, how to build, feed and export it.

A :class:`ZooEntry` says how to build a model from a seed, make its example inputs and mark
their dynamic dims; :func:`register_model` adds one (a name is registered once). The RoPE
models (:mod:`.rope`) and the Hugging Face families (:mod:`.hf`) register theirs at import;
:func:`build_model`, :func:`example_inputs` and :func:`export_model` serve them all.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

__all__ = [
    "MAX_SEQ",
    "ZOO",
    "ZooEntry",
    "ZooExport",
    "build_model",
    "example_inputs",
    "export_model",
    "hf_families",
    "register_model",
    "seeded",
]

#: the default upper bound of a dynamic sequence dim
MAX_SEQ = 64
#: the upper bound of a dynamic batch dim
MAX_BATCH = 16

#: ``(model, batch, seq, seed) -> (args, kwargs)``
Inputs = Callable[[nn.Module, int, int, int], tuple[tuple[Any, ...], dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class ZooEntry:
    """How to build one zoo model, make its inputs, and mark their dynamic dims."""

    name: str
    description: str
    build: Callable[[int], nn.Module]  # seed -> model in eval mode
    inputs: Inputs
    dynamic_shapes: Callable[[Any, Any], Any]  # (batch Dim, seq Dim) -> dynamic_shapes spec
    has_complex: bool = True
    module: str | None = None  # a Hugging Face family's transformers model directory
    seq: int = 8  # the example sequence length (tokens, codes or time steps)
    max_seq: int = MAX_SEQ  # the dynamic sequence dim's upper bound


class ZooExport(NamedTuple):
    """An exported zoo model and the example inputs it was exported with."""

    program: torch.export.ExportedProgram
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


_REGISTRY: dict[str, ZooEntry] = {}
#: every registered model by name, in registration order (read-only: add with register_model)
ZOO: Mapping[str, ZooEntry] = types.MappingProxyType(_REGISTRY)


def register_model(entry: ZooEntry) -> ZooEntry:
    """Add ``entry`` to :data:`ZOO`; a name already registered is refused."""
    if entry.name in _REGISTRY:
        raise ValueError(f"zoo model {entry.name!r} is already registered ({_REGISTRY[entry.name].description})")
    _REGISTRY[entry.name] = entry
    return entry


def hf_families() -> dict[str, ZooEntry]:
    """The registered Hugging Face families (the entries with a transformers ``module``)."""
    return {name: e for name, e in _REGISTRY.items() if e.module is not None}


def seeded(factory: Callable[[], nn.Module]) -> Callable[[int], nn.Module]:
    """``seed -> factory()`` with weights drawn from ``seed`` (global RNG untouched), in eval mode."""

    def build(seed: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return factory().eval()

    return build


def _entry(name: str) -> ZooEntry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(_REGISTRY)}") from None


def batch_seq_dims(max_seq: int = MAX_SEQ) -> tuple[Any, Any]:
    """``Dim("batch", 1..16)`` and ``Dim("seq", 2..max_seq)``."""
    from torch.export import Dim

    # min=2 on the sequence keeps export from specialising on a 1-token sequence.
    return Dim("batch", min=1, max=MAX_BATCH), Dim("seq", min=2, max=max_seq)


def build_model(name: str, seed: int = 0) -> nn.Module:
    """The zoo model ``name`` with weights drawn from ``seed``, in eval mode."""
    return _entry(name).build(seed)


def example_inputs(
    name: str, model: nn.Module, batch: int = 2, seq: int | None = None, seed: int = 0
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword example inputs for ``model`` (built from zoo entry ``name``);
    ``seq`` defaults to the entry's example length."""
    entry = _entry(name)
    seq = entry.seq if seq is None else seq
    if seq < 1 or batch < 1:
        raise ValueError(f"batch and seq must be >= 1, got batch={batch}, seq={seq}")
    return entry.inputs(model, batch, seq, seed)


def export_model(
    name: str,
    *,
    model: nn.Module | None = None,
    batch: int = 2,
    seq: int | None = None,
    dynamic: bool = False,
    seed: int = 0,
) -> ZooExport:
    """Export zoo model ``name`` with ``torch.export.export(strict=False)`` under ``no_grad``.

    ``dynamic=True`` marks the entry's batch (``Dim("batch", 1..16)``) and, where it has
    one, sequence (``Dim("seq", 2..max_seq)``) dims dynamic. Pass ``model`` to export an
    instance you already hold (e.g. to compare with it in eager); otherwise one is built
    from ``seed``.
    """
    entry = _entry(name)
    seq = entry.seq if seq is None else seq
    model = entry.build(seed) if model is None else model
    args, kwargs = example_inputs(name, model, batch, seq, seed)
    shapes = None
    if dynamic:
        if not 2 <= seq <= entry.max_seq:
            raise ValueError(f"dynamic export needs 2 <= seq <= {entry.max_seq}, got seq={seq}")
        shapes = entry.dynamic_shapes(*batch_seq_dims(entry.max_seq))
    with torch.no_grad():
        program = torch.export.export(model, args, kwargs, dynamic_shapes=shapes, strict=False)
    return ZooExport(program, args, kwargs)
