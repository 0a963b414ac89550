"""The options of ``tetrt_support.compile``, named and defaulted as Torch-TensorRT names them.

:class:`CompilationSettings` holds ``min_block_size``, ``torch_executed_ops``,
``require_full_compilation``, ``pass_through_build_failures``, ``truncate_double`` and this
package's ``backend`` and ``strategy``; :func:`settings_from_options` checks them once, up
front, naming an unknown option or a bad value and what it accepts. Defaults:
``docs/architecture.md`` ("Module notes", settings).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from tetrt_support.compiler.engines import ENGINE_NAMES
from tetrt_support.complex.lower import STRATEGIES

__all__ = [
    "DEFAULT_ENGINE",
    "MIN_BLOCK_SIZE",
    "CompilationSettings",
    "decomposed_ops",
    "op_qualified_name",
    "resolve_op",
    "settings_from_options",
]

#: torch_tensorrt.dynamo._defaults.MIN_BLOCK_SIZE
MIN_BLOCK_SIZE = 5
#: the default of ``backend``: the engine of the engine blocks
DEFAULT_ENGINE = "onnxruntime"

Op = torch._ops.OpOverload | torch._ops.OpOverloadPacket


def op_qualified_name(target: Any) -> str:
    """``"torch.ops.aten.mul.Tensor"``: how Torch-TensorRT names a node's target
    (``ConverterRegistry.qualified_name_or_str``, i.e. ``torch.fx.node._get_qualified_name``)."""
    if isinstance(target, str):
        return target
    from torch.fx.node import _get_qualified_name

    return _get_qualified_name(target)


def resolve_op(name: str | Op) -> Op:
    """The op an entry of ``torch_executed_ops`` names.

    Accepted: an ``OpOverload`` (``torch.ops.aten.mul.Tensor``), an ``OpOverloadPacket``
    (``torch.ops.aten.mul``: every overload), or their names as Torch-TensorRT spells them
    (``"torch.ops.aten.mul.Tensor"``), as torch prints them (``"aten.mul.Tensor"``) or in
    schema form (``"aten::mul.Tensor"``). A name that resolves to no op raises: a misspelt
    op would otherwise silently force nothing into PyTorch.
    """
    if isinstance(name, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return name
    if not isinstance(name, str):
        raise TypeError(
            f"torch_executed_ops: {name!r} is a {type(name).__name__}; give op overloads "
            f"(torch.ops.aten.mul.Tensor), packets (torch.ops.aten.mul) or their names"
        )
    text = name.strip()
    text = text.removeprefix("torch.ops.").replace("::", ".")
    parts = text.split(".")
    op: Any = None
    if len(parts) in (2, 3):
        try:
            op = getattr(getattr(torch.ops, parts[0]), parts[1])
            if len(parts) == 3:
                op = getattr(op, parts[2])
        except (AttributeError, RuntimeError):
            op = None
    if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        raise ValueError(
            f"torch_executed_ops: {name!r} names no op; spell it as Torch-TensorRT does, "
            f"e.g. 'torch.ops.aten.mul.Tensor' (one overload) or 'torch.ops.aten.mul' (all of them)"
        )
    return op


@dataclasses.dataclass(frozen=True)
class CompilationSettings:
    """What ``tetrt_support.compile`` and the ``"tetrt"`` torch.compile backend do.

    - ``backend``: the engine that builds engine blocks, one of :data:`ENGINE_NAMES` (the
      name is this package's; it is not a torch.compile backend);
    - ``strategy``: complex lowering, ``"rewrite"`` or ``"retrace"``;
    - ``min_block_size``: an engine block with fewer compute ops (call_function nodes
      other than ``getitem``, as Torch-TensorRT counts them) runs in PyTorch instead;
    - ``torch_executed_ops``: ops (overloads, or packets for all overloads) that always
      run in PyTorch fallback blocks, with every node whose op decomposes to one of them
      (Torch-TensorRT matches them on a core-ATen graph); an entry that matches no node warns;
    - ``require_full_compilation``: raise, naming each op and its source line, if
      anything would run in a PyTorch fallback block;
    - ``pass_through_build_failures``: ``False``: an engine block that fails to build
      runs in PyTorch, with a warning naming it and why; ``True``: the failure raises
      (Torch-TensorRT falls back a whole graph, on its ``torch.compile`` path only; here
      each block falls back on its own, and the ``"tetrt"`` torch.compile backend also
      falls back whole graphs);
    - ``truncate_double``: float64 inputs and weights of engine blocks run as float32
      inside the engine (float64 outputs are cast back), as in Torch-TensorRT.
    - ``check_engine_blocks`` (this package; on by default): each engine block is run
      against its PyTorch graph on the example inputs when it is built
      (:mod:`tetrt_support.compiler.verify`); ``on_engine_mismatch``: ``"raise"`` an error
      naming the block, its first differing output and the error, or ``"fallback"``: run
      that block in PyTorch, with a warning saying the same.
    """

    backend: str = DEFAULT_ENGINE
    strategy: str = "rewrite"
    min_block_size: int = MIN_BLOCK_SIZE
    torch_executed_ops: frozenset[Op] = frozenset()
    require_full_compilation: bool = False
    pass_through_build_failures: bool = False
    truncate_double: bool = False
    check_engine_blocks: bool = True
    on_engine_mismatch: str = "raise"

    def __post_init__(self) -> None:
        _check_choice("backend", self.backend, ENGINE_NAMES)
        _check_choice("strategy", self.strategy, STRATEGIES)
        if isinstance(self.min_block_size, bool) or not isinstance(self.min_block_size, int) or self.min_block_size < 1:
            raise ValueError(f"min_block_size must be an int >= 1, got {self.min_block_size!r}")
        _check_choice("on_engine_mismatch", self.on_engine_mismatch, ("raise", "fallback"))
        for flag in ("require_full_compilation", "pass_through_build_failures", "truncate_double", "check_engine_blocks"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be True or False, got {value!r}")
        object.__setattr__(self, "torch_executed_ops", _normalize_ops(self.torch_executed_ops))
        if self.require_full_compilation and self.torch_executed_ops:
            names = ", ".join(sorted(op_qualified_name(op) for op in self.torch_executed_ops))
            raise ValueError(
                f"require_full_compilation=True forbids running anything in PyTorch, but "
                f"torch_executed_ops forces {names} there; give one or the other"
            )

    def forces_to_pytorch(self, target: Any) -> bool:
        """Whether ``torch_executed_ops`` names ``target`` (an overload or its packet)."""
        if not self.torch_executed_ops:
            return False
        if target in self.torch_executed_ops:
            return True
        packet = getattr(target, "overloadpacket", None)
        return packet is not None and packet in self.torch_executed_ops

    def forces_node_to_pytorch(self, node: fx.Node) -> bool:
        """Whether ``torch_executed_ops`` names ``node``'s op or an op it decomposes to.

        Torch-TensorRT matches its users' names against the graph after its core-ATen
        decompositions (``aten.conv2d`` is ``aten.convolution`` there, ``aten.linear`` is
        ``aten.t`` and ``aten.addmm`` or ``aten.mm``); the graph here keeps the composite
        op, so a node runs in PyTorch if any op it decomposes to is named (:func:`decomposed_ops`).
        """
        return self.matching_executed_ops(node) != frozenset()

    def matching_executed_ops(self, node: fx.Node) -> frozenset[Op]:
        """The entries of ``torch_executed_ops`` that ``node`` matches (see :meth:`forces_node_to_pytorch`)."""
        if not self.torch_executed_ops or node.op != "call_function":
            return frozenset()
        return frozenset(
            entry
            for target in (node.target, *decomposed_ops(node))
            for entry in (target, getattr(target, "overloadpacket", None))
            if entry is not None and entry in self.torch_executed_ops
        )


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(CompilationSettings))


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")


def _normalize_ops(ops: Any) -> frozenset[Op]:
    if ops is None:
        return frozenset()
    if isinstance(ops, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        raise TypeError(
            f"torch_executed_ops takes a collection of ops, got the single op {ops!r}; "
            f"write {{{ops!r}}}"
        )
    if not isinstance(ops, Iterable):
        raise TypeError(f"torch_executed_ops takes a collection of ops, got {type(ops).__name__}")
    return frozenset(resolve_op(op) for op in ops)


# --------------------------------------------------------------------------- decompositions
@functools.cache
def _core_aten_table() -> dict[Any, Any]:
    """The core-ATen decompositions ``ExportedProgram.run_decompositions()`` applies."""
    return dict(torch.export.default_decompositions().items())


def _decomposes(target: Any) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target in _core_aten_table():
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


def _hint(value: Any) -> Any:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = value.node.hint
        return hint if hint is not None else {torch.SymInt: 2, torch.SymFloat: 2.0, torch.SymBool: True}[type(value)]
    return value


def _on_meta(value: Any) -> Any:
    """A node's recorded value as a meta tensor of its (hinted) sizes; other values hinted,
    devices made ``meta`` (a factory op must not allocate for real)."""
    if isinstance(value, torch.Tensor):
        shape = [_hint(s) for s in value.shape]
        return torch.empty(shape, dtype=value.dtype, device="meta")
    if isinstance(value, torch.device):
        return torch.device("meta")
    return _hint(value)


_DECOMPOSED: dict[Any, frozenset[Any]] = {}  # (op, argument signature) -> what it decomposes to
_DECOMPOSED_MAX = 4096


def decomposed_ops(node: fx.Node) -> frozenset[Any]:
    """The ATen ops ``node``'s op decomposes to: both what tracing leaves of a composite
    op (``aten.linear`` -> ``aten.t``, ``aten.addmm``) and the core-ATen ops of
    ``run_decompositions()`` (``aten.t`` -> ``aten.permute``); empty for an op that does
    not decompose, or whose recorded values cannot be traced."""
    if node.op != "call_function" or not _decomposes(node.target):
        return frozenset()
    missing = object()
    args, kwargs = fx.node.map_aggregate(
        fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val", missing)), _on_meta
    )
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if any(leaf is missing for leaf in leaves):
        return frozenset()
    signature = tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else repr(x) for x in leaves)
    key = (node.target, str(spec), signature)
    found = _DECOMPOSED.get(key)
    if found is None:
        if len(_DECOMPOSED) >= _DECOMPOSED_MAX:  # a long run of new shapes: start over
            _DECOMPOSED.clear()
        found = _DECOMPOSED[key] = _trace_decompositions(node.target, leaves, spec)
    return found


def _trace_decompositions(target: Any, leaves: list[Any], spec: pytree.TreeSpec) -> frozenset[Any]:
    from torch.fx.experimental.proxy_tensor import make_fx

    tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def call(*given: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, x in zip(tensors, given):
            filled[i] = x
        args, kwargs = pytree.tree_unflatten(filled, spec)
        return target(*args, **kwargs)

    found: set[Any] = set()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a decomposition's own deprecation notes are not the user's
            for table in (None, _core_aten_table()):
                traced = make_fx(call, decomposition_table=table)(*(leaves[i] for i in tensors))
                found |= {n.target for n in traced.graph.nodes if n.op == "call_function"}
    except Exception:  # noqa: BLE001 - no meta kernel, data-dependent sizes...: judged by its own op
        return frozenset()
    return frozenset(op for op in found if isinstance(op, torch._ops.OpOverload) and op is not target)


def settings_from_options(options: Mapping[str, Any] | None = None, **overrides: Any) -> CompilationSettings:
    """:class:`CompilationSettings` from option names and values, checked.

    An unknown name raises ``TypeError`` naming it, the closest valid name and all valid
    names (as ``torch.compile(options=...)`` users would otherwise lose a typo silently).
    """
    given = dict(options or {})
    given.update(overrides)
    unknown = [name for name in given if name not in OPTION_NAMES]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(str(name), OPTION_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"unknown compile option {name!r}{hint}; valid options: {', '.join(OPTION_NAMES)}")
    return CompilationSettings(**given)
