"""Compile an exported program into engine blocks, keeping its call signature.

``tetrt_support.compile(ep, backend=..., strategy=...)`` is the whole pipeline a
Torch-TensorRT-style compiler runs on a model with complex numbers:

1. lower complex arithmetic to real ``[..., 2]`` arithmetic
   (:func:`tetrt_support.complex.lower`, ops without a complex rule kept as complex
   islands for PyTorch);
2. cut the graph into engine blocks and fallback blocks (:mod:`.partition`) and build
   each engine block with the chosen engine (:mod:`.engines`);
3. put complex I/O adapters at the edge (:mod:`.io_adapters`) and keep the exported
   program's pytree codegen (:mod:`.signature`), so the result is called exactly like
   ``ep.module()``: same parameter names, by position, keyword or both, the same output
   structure, complex tensors in and out.

The result is a :class:`CompiledModule`, an ``fx.GraphModule`` whose submodules are the
blocks (``engine_0``, ``fallback_0``, ...).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.fx._pytree import tree_flatten_spec
from torch.fx.graph import _PyTreeCodeGen

from tetrt_support.complex.io_adapters import (
    add_input_adapters,
    add_output_adapters,
    pass_complex_outputs_through,
)
from tetrt_support.complex.partition import (
    BLOCK_OPS_KEY,
    Block,
    block_ops,
    block_kind,
    blocks_of,
    blocks_summary,
    partition,
)
from tetrt_support.complex.signature import (
    FINAL,
    SignaturePolicy,
    add_input_check,
    rebuild_codegen_from_placeholders,
    restore_codegen,
)

__all__ = ["BACKENDS", "STRATEGIES", "CompiledModule", "compile", "compile_with_policy"]

BACKENDS = ("eager", "inductor", "onnxruntime", "tensorrt")
STRATEGIES = ("rewrite", "retrace")


class CompiledModule(fx.GraphModule):
    """An exported program compiled into blocks; call it like ``ep.module()``.

    ``blocks()`` lists the blocks in call order; ``blocks_summary()`` says how many ran
    where, e.g. ``"1 engine block, 0 fallback blocks"``.
    """

    def blocks(self) -> list[Block]:
        return blocks_of(self)

    def blocks_summary(self) -> str:
        return blocks_summary(self)

    def complex_io(self) -> dict[str, list[torch.dtype | None]]:
        """Which flat inputs and outputs are complex (None for real)."""
        return self.meta.get("tetrt_complex_io", {"inputs": [], "outputs": []})


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")


def flat_example_inputs(ep: torch.export.ExportedProgram) -> list[Any]:
    """The user inputs ``ep`` was exported with, flattened in placeholder order."""
    example = getattr(ep, "example_inputs", None)
    if example is None:
        raise ValueError(
            "the exported program carries no example inputs (ep.example_inputs is None); "
            "engines need one example to build from: export it again with torch.export.export"
        )
    args, kwargs = example
    return list(tree_flatten_spec((args, kwargs), ep.call_spec.in_spec))


def _without_guards_fn(gm: fx.GraphModule) -> fx.GraphModule:
    """``ep.module()`` without its ``_guards_fn`` call.

    The guard function checks the export's shape guards on the ORIGINAL inputs; once
    complex inputs are packed it would see ``[..., 2]`` tensors, and the lowering would
    have to treat an opaque Python call as a complex op. The compiled module checks its
    inputs itself (:func:`~tetrt_support.complex.signature.check_complex_inputs`), and the
    engines check shapes.
    """
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    if hasattr(gm, "_guards_fn"):
        delattr(gm, "_guards_fn")
    gm.recompile()
    return gm


def _packed(values: list[Any], complex_inputs: list[torch.dtype | None]) -> list[Any]:
    return [torch.view_as_real(v) if dt is not None else v for v, dt in zip(values, complex_inputs)]


def _dynamic_dims(block: fx.GraphModule) -> list[dict[int, str]]:
    """Per block input: the dims whose recorded size is a free symbol, named after it.

    One name per symbol, so dims that export proved equal stay equal in the engine.
    """
    dims = []
    for ph in (n for n in block.graph.nodes if n.op == "placeholder"):
        val = ph.meta.get("val")
        entry: dict[int, str] = {}
        if isinstance(val, torch.Tensor):
            for i, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    entry[i] = str(size.node.expr)
        dims.append(entry)
    return dims


class _BlockInputRecorder(fx.Interpreter):
    """Runs the partitioned graph eagerly and keeps what each engine block receives."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.seen: dict[str, list[Any]] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        if block_kind(str(target)) == "engine":
            self.seen.setdefault(str(target), list(args))
        return super().call_module(target, args, kwargs)


def _build_engine_blocks(gm: fx.GraphModule, engine: Any, packed_inputs: list[Any], dynamic: bool) -> None:
    recorder = _BlockInputRecorder(gm)
    with torch.no_grad():
        recorder.run(*packed_inputs, enable_io_processing=False)
    for name, inputs in recorder.seen.items():
        block = gm.get_submodule(name)
        gm.meta.setdefault(BLOCK_OPS_KEY, {})[name] = block_ops(block)
        dims = _dynamic_dims(block) if dynamic else None
        built = engine.build(block, inputs, dims if dims and any(dims) else None)
        setattr(gm, name, built)


def _has_dynamic_shapes(gm: fx.GraphModule) -> bool:
    for ph in (n for n in gm.graph.nodes if n.op == "placeholder"):
        val = ph.meta.get("val")
        if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
            return True
    return False


def compile_with_policy(
    ep: torch.export.ExportedProgram,
    backend: str = "eager",
    strategy: str = "rewrite",
    policy: SignaturePolicy = FINAL,
) -> CompiledModule:
    """:func:`compile`, with the signature handling chosen by ``policy``.

    Only :data:`~tetrt_support.complex.signature.FINAL` is correct; the other policies
    reproduce earlier Torch-TensorRT behaviour for the notebook and its tests.
    """
    from tetrt_support.complex import lower
    from tetrt_support.complex.engines import get_engine

    if not isinstance(ep, torch.export.ExportedProgram):
        raise TypeError(
            f"compile() takes a torch.export.ExportedProgram (export the model first: "
            f"torch.export.export(model, args, kwargs)), got {type(ep).__name__}"
        )
    _check_choice("backend", backend, BACKENDS)
    _check_choice("strategy", strategy, STRATEGIES)
    engine = get_engine(backend)
    example = flat_example_inputs(ep)

    gm = lower(_without_guards_fn(ep.module()), strategy=strategy, unsupported="fallback")
    io = gm.meta["tetrt_complex_io"]
    packed = _packed(example, io["inputs"])
    if strategy == "retrace":
        gm = policy.retrace(gm, packed)
    dynamic = _has_dynamic_shapes(gm)
    pytree_codegen = gm.graph._codegen if isinstance(gm.graph._codegen, _PyTreeCodeGen) else None

    pass_complex_outputs_through(gm, io["outputs"])
    partition(gm, engine)
    _build_engine_blocks(gm, engine, packed, dynamic)
    add_output_adapters(gm, io["outputs"], policy.output_rule)
    complex_inputs = add_input_adapters(gm, io["inputs"], rename=policy.input_rename)

    if complex_inputs and policy.rebuild_codegen_after_io_adapters:
        rebuild_codegen_from_placeholders(gm)
    elif pytree_codegen is None and policy.restore_lost_codegen:
        restore_codegen(gm, ep)
    add_input_check(gm, io["inputs"])
    gm.graph.lint()

    compiled = CompiledModule(gm, gm.graph, class_name="CompiledModule")
    compiled.meta[BLOCK_OPS_KEY] = dict(gm.meta.get(BLOCK_OPS_KEY, {}))
    compiled.meta["tetrt_complex_io"] = {"inputs": list(io["inputs"]), "outputs": list(io["outputs"])}
    compiled.meta["tetrt_backend"] = backend
    compiled.meta["tetrt_strategy"] = strategy
    return compiled


def compile(  # noqa: A001 - the public name mirrors torch.compile / torch_tensorrt.compile
    exported_program: torch.export.ExportedProgram,
    backend: str = "eager",
    strategy: str = "rewrite",
) -> CompiledModule:
    """Compile ``exported_program`` into engine blocks; call the result like ``ep.module()``.

    ``backend``: the engine for the real-only blocks (``"eager"``, ``"inductor"``,
    ``"onnxruntime"`` - the CPU stand-in for TensorRT - or ``"tensorrt"``, GPU only and not
    run on the CPU machines this was built on). ``strategy``: how complex arithmetic is
    lowered, ``"rewrite"`` (in-place FX rewrite) or ``"retrace"`` (make_fx retrace).
    Ops with no complex rule run in PyTorch fallback blocks. Dynamic batch and sequence
    dims of the program stay dynamic in the engines.
    """
    return compile_with_policy(exported_program, backend, strategy, FINAL)
