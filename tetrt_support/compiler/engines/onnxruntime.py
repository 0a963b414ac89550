"""The ONNX Runtime engine: the CPU stand-in for a TensorRT engine.

Each block is exported with ``torch.export`` then torch.onnx's dynamo exporter (what
``torch.onnx.export(..., dynamo=True)`` runs, its translation registry built once) and run
by ``onnxruntime.InferenceSession`` on the CPU provider, dtypes kept; a block equal to one
exported before in the process reuses its bytes (:data:`EXPORTED`). Like TensorRT, it
has no complex arithmetic here, so ``supports`` refuses every complex node (why:
``docs/architecture.md``, "Module notes"). The built module keeps the ONNX bytes, pickles as
them, and recreates the session on first use after unpickling.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from tetrt_support.compiler.engines.base import (
    DynamicDims,
    Engine,
    check_ints_stayed_symbolic,
    dynamic_shapes_for_export,
    is_int_input,
    refuse_gradient_inputs,
    standalone_block,
)
from tetrt_support.compiler.engines.build_cache import BuildCache, block_key
from tetrt_support.compiler.engines.onnx_exact_ops import EXACT_DECOMPOSITIONS

__all__ = [
    "EXPORTED", "OnnxRuntimeBlock", "OnnxRuntimeEngine", "export_block_to_onnx", "exported_block_key",
    "onnx_translatable",
]

# The registry logs one warning per missing torchvision op on every export; not our concern.
_NOISY_LOGGERS = ("torch.onnx._internal.exporter._registration",)
# onnx_ir warns when a constant block output cannot share its initializer: expected here.
_DEDUP_LOGGER = "onnx_ir.passes.common.initializer_deduplication"


def _not_output_dedup_notice(record: logging.LogRecord) -> bool:
    return "as it is a graph input or output" not in str(record.msg)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    dedup = logging.getLogger(_DEDUP_LOGGER)
    dedup.addFilter(_not_output_dedup_notice)
    try:
        with warnings.catch_warnings():
            # Engine blocks are ATen graphs: train/eval mode changes nothing in them.
            warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
            # Inputs sharing one dynamic dim name share one ONNX axis name: expected, not news.
            warnings.filterwarnings("ignore", message="# The axis name: .* will not be used")
            yield
    finally:
        dedup.removeFilter(_not_output_dedup_notice)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _opset() -> int:
    """The opset ``torch.onnx.export`` targets when not told, and so the engine's."""
    from torch.onnx import _constants

    return _constants.ONNX_DEFAULT_OPSET


@functools.cache
def _registry(custom: tuple[tuple[Any, Any], ...] = ()) -> Any:
    """Torchlib's ONNX registry with the ``custom`` translations added, built once per table.

    ``torch.onnx.export`` rebuilds it on every call, reading the source of every onnxscript
    function, which costs more than exporting a small block; export only reads it.
    """
    from torch.onnx._internal.exporter import _registration

    with _quiet_exporter():
        registry = _registration.ONNXRegistry.from_torchlib(opset_version=_opset())
    for op, function in custom:
        registry.register_op(op, function, is_complex=False)
    return registry


@functools.cache
def _torchlib() -> tuple[Any, frozenset[Any]]:
    """The exporter's own registry and the ATen decompositions it applies before translating."""
    from torch.onnx._internal.exporter import _decomp

    registry = _registry()
    decomposed = frozenset(
        _decomp.create_onnx_friendly_decomposition_table(set(_decomp.get_onnx_implemented_overloads(registry)))
    )
    return registry, decomposed


def _assertion_targets() -> frozenset[Any]:
    """Check-only ops the exporter erases before translating.

    The list in torch/onnx/_internal/exporter/_fx_passes.py (``remove_assertion_nodes``).
    """
    aten = torch.ops.aten
    names = [("sym_constrain_range_for_size", "default"), ("_assert_async", "default"), ("_assert_async", "msg")]
    names += [("_assert_scalar", "default"), ("_assert_tensor_metadata", "default")]
    return frozenset(getattr(getattr(aten, op), overload) for op, overload in names if hasattr(aten, op))


def extra_translations() -> dict[Any, Any]:
    """ONNX translations that transformers ships for its own ops, for the exporter's
    ``custom_translation_table``: the mixture-of-experts matmul
    ``transformers::grouped_mm_fallback`` (one MatMul per expert), which torchlib lacks.
    Empty unless transformers (and so its op) is loaded: the engine imports nothing for it."""
    if "transformers" not in sys.modules or not hasattr(torch.ops, "transformers"):
        return {}
    try:
        from transformers.exporters.exporter_onnx import _ONNX_TRANSLATION_TABLE as table
    except ImportError:  # an older transformers without the exporter
        return {}
    wanted = [getattr(getattr(torch.ops.transformers, "grouped_mm_fallback", None), "default", None)]
    return {op: table[op] for op in wanted if op is not None and op in table}


def onnx_translatable(target: Callable[..., Any]) -> bool:
    """Whether torch.onnx's dynamo exporter translates ``target`` (for real dtypes).

    True when torchlib has a real-dtype function for it, when the exporter decomposes it
    first (``run_decompositions`` with its ONNX-friendly table, which always expands
    CompositeImplicitAutograd ops such as ``aten.to.dtype``), or when the exporter erases
    it (assertion ops). A decomposed op is judged by itself, not by what it expands into.
    """
    registry, decomposed = _torchlib()
    if target in extra_translations() or target in EXACT_DECOMPOSITIONS:
        return True
    if registry.is_registered(target):
        return any(not meta.is_complex for meta in registry.get_decomps(target))
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target in decomposed or target in _assertion_targets():
        return True
    return torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


def export_block_to_onnx(
    block: fx.GraphModule,
    example_inputs: list[torch.Tensor],
    dynamic_dims: DynamicDims | None = None,
) -> bytes:
    """Serialized ONNX model of ``block``; dims named in ``dynamic_dims`` stay symbolic."""
    from torch.onnx._internal.exporter import _core as onnx_exporter

    dynamic_shapes = dynamic_shapes_for_export(example_inputs, dynamic_dims, block)
    input_names = [f"input_{i}" for i in range(len(example_inputs))]
    with _quiet_exporter():
        # torch.export first, by hand: given a module, torch.onnx.export would retry a failed
        # export with other capture strategies and hide the real error.
        exported = torch.export.export(
            _with_exact_decompositions(block), tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=False
        )
        check_ints_stayed_symbolic("onnxruntime", exported, example_inputs)  # an int input is a 0-d int64
        inexact = {n.target for n in exported.graph.nodes} & EXACT_DECOMPOSITIONS.keys()
        if inexact:  # from a block that is not an ATen graph (torch.atan2): one more trace
            exported = exported.run_decompositions({op: EXACT_DECOMPOSITIONS[op] for op in inexact})
        # What torch.onnx.export(exported, dynamo=True, optimize=True) runs, with the
        # registry built once instead of on every call (``_registry``).
        program = onnx_exporter.export(
            exported,
            registry=_registry(tuple(extra_translations().items())),
            input_names=input_names,
            optimize=True,
            verbose=False,
            opset_version=_opset(),
        )
    return program.model_proto.SerializeToString()


#: the ONNX bytes of every block this process exported (dropped past 512 MiB), so that a block
#: built again (the same model compiled twice, equal blocks of two models) is not exported again
EXPORTED = BuildCache(max_bytes=512 * 2**20)


def exported_block_key(
    block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None = None
) -> str | None:
    """:func:`~tetrt_support.compiler.engines.build_cache.block_key` of what
    :func:`export_block_to_onnx` reads, the exporter's configuration included."""
    config = (_opset(), tuple(map(str, extra_translations())), tuple(map(str, EXACT_DECOMPOSITIONS)))
    return block_key(block, example_inputs, dynamic_shapes_for_export(example_inputs, dynamic_dims, block), *config)


def _with_exact_decompositions(block: fx.GraphModule) -> fx.GraphModule:
    """``block``, or a copy whose ATen atan2/copysign/signbit nodes call the exact
    decompositions (torchlib's would be wrong or missing: see onnx_exact_ops), which
    torch.export then traces in the same pass instead of a second one."""
    if not any(n.op == "call_function" and n.target in EXACT_DECOMPOSITIONS for n in block.graph.nodes):
        return block
    exact = standalone_block(block)
    for node in exact.graph.nodes:
        if node.op == "call_function" and node.target in EXACT_DECOMPOSITIONS:
            node.target = EXACT_DECOMPOSITIONS[node.target]
    exact.recompile()
    return exact


def _to_numpy(x: torch.Tensor | int, index: int) -> np.ndarray:
    if is_int_input(x):  # a size (SymInt) block input: the exported model takes a 0-d int64
        return np.asarray(x, dtype=np.int64)
    if x.is_complex() or x.dtype == torch.bfloat16:
        raise TypeError(f"onnxruntime engine: input {index} has dtype {x.dtype}, which numpy/ONNX Runtime cannot take")
    array = x.detach().cpu().numpy()
    # np.ascontiguousarray returns at least 1-d: a 0-d input would reach the session as (1,)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


class OnnxRuntimeBlock(torch.nn.Module):
    """Runs one exported block in ONNX Runtime; ``forward(*tensors)`` mirrors the block's outputs.

    It has no backward: an input that requires grad in grad mode is refused by name
    (:func:`~tetrt_support.compiler.engines.base.refuse_gradient_inputs`).

    ``output_spec`` is the pytree structure of the block's ``return``; each leaf is either
    a graph value (taken from the session's outputs, in order) or a literal kept as is
    (``None``, a Python number). ``graph_module`` is the block it was exported from, kept
    for :meth:`as_pytorch` outside ``_modules``: the session computes with the weights
    baked into its bytes, so ``state_dict``, ``to()`` and refit must not see the graph's.
    """

    has_backward = False  # ONNX Runtime computes forward only

    def __init__(
        self,
        model_bytes: bytes,
        input_names: list[str],
        output_spec: pytree.TreeSpec,
        output_leaves: list[Any],
        graph_module: fx.GraphModule | None = None,
    ) -> None:
        super().__init__()
        self.__dict__["graph_module"] = graph_module
        self.model_bytes = model_bytes
        self.input_names = input_names
        self.output_spec = output_spec
        # _FROM_SESSION marks a leaf the session computes; anything else is a literal.
        self.output_leaves = output_leaves
        self._session: Any = None
        self._feeds: list[tuple[int, str]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_session"] = None  # a live InferenceSession does not pickle; bytes do
        state["_feeds"] = None
        return state

    def _session_and_feeds(self) -> tuple[Any, list[tuple[int, str]]]:
        if self._session is None:
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.log_severity_level = 3  # errors only
            session = onnxruntime.InferenceSession(
                self.model_bytes, sess_options=options, providers=["CPUExecutionProvider"]
            )
            position = {name: i for i, name in enumerate(self.input_names)}
            # The exporter may drop an input the graph never reads: feed by name.
            self._feeds = [(position[i.name], i.name) for i in session.get_inputs()]
            self._session = session
        return self._session, self._feeds  # type: ignore[return-value]

    def forward(self, *inputs: torch.Tensor):
        if len(inputs) != len(self.input_names):
            raise TypeError(f"onnxruntime block takes {len(self.input_names)} tensors, got {len(inputs)}")
        refuse_gradient_inputs("onnxruntime", getattr(self, "input_labels", self.input_names), inputs)
        session, feeds = self._session_and_feeds()
        results = session.run(None, {name: _to_numpy(inputs[i], i) for i, name in feeds})
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        produced = iter(torch.from_numpy(np.asarray(r)).to(device) for r in results)
        leaves = [next(produced) if leaf is _FROM_SESSION else leaf for leaf in self.output_leaves]
        return pytree.tree_unflatten(leaves, self.output_spec)

    def as_pytorch(self) -> fx.GraphModule:
        """The ATen graph the ONNX model was exported from (traceable by torch.export)."""
        graph = self.__dict__.get("graph_module")
        if graph is None:  # a block pickled before blocks kept their graph
            raise NotImplementedError(
                "this OnnxRuntimeBlock was saved without the graph it was built from; compile the "
                "model again to save it as an exported program"
            )
        return graph


class _FromSession:
    """Pickle-stable marker (a module-level singleton) for a session-computed output leaf."""

    def __reduce__(self) -> str:
        return "_FROM_SESSION"

    def __repr__(self) -> str:
        return "<from session>"


_FROM_SESSION = _FromSession()


def _output_structure(block: fx.GraphModule) -> tuple[pytree.TreeSpec, list[Any]]:
    returned = block.graph.output_node().args[0]
    leaves, spec = pytree.tree_flatten(returned)
    for leaf in leaves:
        if isinstance(leaf, fx.Node) and not isinstance(leaf.meta.get("val", torch.empty(())), torch.Tensor):
            raise TypeError(
                f"onnxruntime engine: block output {leaf.name} is {type(leaf.meta['val']).__name__}, "
                f"not a tensor; engine blocks return tensors"
            )
    return spec, [_FROM_SESSION if isinstance(leaf, fx.Node) else leaf for leaf in leaves]


class OnnxRuntimeEngine(Engine):
    """torch.onnx (dynamo) export + onnxruntime CPUExecutionProvider; no complex dtypes."""

    name = "onnxruntime"
    complex_dtypes = False

    def supports_op(self, node: fx.Node) -> bool:
        return node.target is operator.getitem or onnx_translatable(node.target)

    def build_block(
        self, block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None
    ) -> torch.nn.Module:
        spec, leaves = _output_structure(block)
        model_bytes = EXPORTED.get_or_build(
            exported_block_key(block, example_inputs, dynamic_dims),
            lambda: export_block_to_onnx(block, example_inputs, dynamic_dims),
        )
        names = [f"input_{i}" for i in range(len(example_inputs))]
        built = OnnxRuntimeBlock(model_bytes, names, spec, leaves, standalone_block(block))
        n_outputs = len(built._session_and_feeds()[0].get_outputs())
        expected = sum(leaf is _FROM_SESSION for leaf in leaves)
        if n_outputs != expected:
            raise RuntimeError(
                f"onnxruntime engine: the exported model has {n_outputs} outputs but the block returns "
                f"{expected} tensors; refusing to guess which is which"
            )
        return built
