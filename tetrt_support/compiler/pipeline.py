"""``compile``: an exported program into engine blocks, keeping its call signature.

The compiler is the ordered list :data:`PASSES` of
:class:`~tetrt_support.compiler.context.Pass` functions, ``(gm, ctx) -> gm``; read top to
bottom it is the whole pipeline, as Torch-TensorRT's lowering pass lists are. Each pass's
docstring says why it is there (``docs/architecture.md``, "The compile pipeline", tabulates
them); :mod:`tetrt_support.history` re-enacts older behaviours with other pass lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.fx._pytree import tree_flatten_spec
from torch.fx.graph import _PyTreeCodeGen

from tetrt_support.compiler import constant_folding
from tetrt_support.compiler.configured_engine import (
    ConfiguredEngine,
    check_full_compilation,
    run_failed_builds_in_pytorch,
    warn_unmatched_executed_ops,
)
from tetrt_support.compiler.context import CompileContext, Pass
from tetrt_support.compiler.engines import ENGINE_NAMES, get_engine
from tetrt_support.compiler.engines.base import linear_in_one_symbol
from tetrt_support.compiler.frontend import as_exported_program
from tetrt_support.compiler.functionalize import functionalize_view_writes
from tetrt_support.compiler.verify import check_engine_blocks, check_whole_program, keep_reference_blocks
from tetrt_support.compiler.input_check import add_input_check
from tetrt_support.compiler.serialization import DYNAMIC, EXAMPLE_INPUTS_KEY
from tetrt_support.compiler.io_adapters import (
    add_input_adapters,
    add_output_adapters,
    pass_complex_outputs_through,
)
from tetrt_support.compiler.partition import (
    BLOCK_OPS_KEY,
    Block,
    block_kind,
    block_ops,
    blocks_of,
    blocks_summary,
    partition,
)
from tetrt_support.compiler.refit import BLOCK_WEIGHTS_KEY, WEIGHTS_KEY, record_refit_weights
from tetrt_support.compiler.settings import DEFAULT_ENGINE, MIN_BLOCK_SIZE, CompilationSettings
from tetrt_support.complex import lower
from tetrt_support.complex.codegen import restore_signature
from tetrt_support.complex.detect import GUARDS_FN, is_guards_call
from tetrt_support.complex.lower import COMPLEX_IO_KEY, STRATEGIES
from tetrt_support.complex.shape_env import use_private_shape_env

__all__ = [
    "BACKENDS",
    "PASSES",
    "STRATEGIES",
    "CompiledModule",
    "compile",
    "compile_program",
    "flat_example_inputs",
    "run_passes",
]

#: the values ``compile(backend=...)`` accepts: engine names, not torch.compile backends
#: (this compiler's own torch.compile backend is ``"tetrt"``: :mod:`.backend`)
BACKENDS: tuple[str, ...] = ENGINE_NAMES
#: ``meta`` key of a compiled module: the engine its engine blocks were built by
ENGINE_NAME_KEY = "tetrt_backend"
#: ``meta`` key of a compiled module: the complex lowering strategy
STRATEGY_KEY = "tetrt_strategy"


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
        return self.meta.get(COMPLEX_IO_KEY, {"inputs": [], "outputs": []})


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


# --------------------------------------------------------------------------- the passes
def drop_guards_fn(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """``ep.module()`` without its guard-function call.

    The guard function checks the export's shape guards on the ORIGINAL inputs; once
    complex inputs are packed it would see ``[..., 2]`` tensors, and the lowering would
    have to treat an opaque Python call as a complex op. The compiled module checks its
    inputs itself, on the original inputs and against the same ``range_constraints``
    (:func:`check_inputs_first`).
    """
    for node in list(gm.graph.nodes):
        if is_guards_call(node):
            gm.graph.erase_node(node)
    if hasattr(gm, GUARDS_FN):
        delattr(gm, GUARDS_FN)
    gm.recompile()
    return gm


def lower_complex(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """Complex arithmetic to real pairs; an op without a rule becomes a complex island."""
    gm = lower(gm, strategy=ctx.strategy, unsupported="fallback")
    io = gm.meta.pop(COMPLEX_IO_KEY)
    ctx.complex_inputs, ctx.complex_outputs = list(io["inputs"]), list(io["outputs"])
    return gm


def fold_constants(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """:func:`~tetrt_support.compiler.constant_folding.fold_constants`, as Torch-TensorRT's
    post-lowering ``constant_fold``; after the complex lowering, so that what it stores is
    real and compact (RoPE's frequency planes), and after the view-write pass, so that no
    buffer the program writes is taken for a constant. A refit computes the folded values
    again from the new weights (``ctx.folded`` says how)."""
    gm = constant_folding.fold_constants(gm)
    ctx.folded = gm.meta.pop(constant_folding.FOLDED_KEY, None)
    return gm


def return_complex_results_directly(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """:func:`~tetrt_support.compiler.io_adapters.pass_complex_outputs_through`."""
    pass_complex_outputs_through(gm, ctx.complex_outputs)
    return gm


def partition_into_blocks(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """``engine_i`` blocks for what the engine takes, ``fallback_j`` blocks for the rest;
    an engine block under ``min_block_size`` compute ops goes to PyTorch (ignored, as in
    Torch-TensorRT, when ``require_full_compilation`` asks for everything in engines).
    A ``torch_executed_ops`` entry that matches no op of the graph is named in a warning."""
    settings = ctx.settings
    gm = partition(gm, ctx.engine, min_block_size=1 if settings.require_full_compilation else settings.min_block_size)
    warn_unmatched_executed_ops(gm, settings)
    return gm


def _has_dynamic_shapes(gm: fx.GraphModule) -> bool:
    for ph in (n for n in gm.graph.nodes if n.op == "placeholder"):
        val = ph.meta.get("val")
        if isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
            return True
    return False


def _dynamic_dims(block: fx.GraphModule) -> list[dict[int, str]]:
    """Per block input: the dims whose recorded size is a free symbol, named after it.

    One name per symbol, so dims that export proved equal stay equal in the engine. A dim
    whose size is ``a*s + b`` in one symbol (a wave of ``4 * frames`` samples) is named by
    that expression, so the engine keeps it tied to ``s``
    (:func:`~tetrt_support.compiler.engines.base.dynamic_shapes_for_export`); any other
    expression of symbols (``b * s`` after a flatten) gets a name of its own: it stays
    dynamic in the engine instead of being fixed to its example size.
    """
    dims = []
    for index, ph in enumerate(n for n in block.graph.nodes if n.op == "placeholder"):
        val = ph.meta.get("val")
        entry: dict[int, str] = {}
        if isinstance(val, torch.Tensor):
            for i, size in enumerate(val.shape):
                if not isinstance(size, torch.SymInt) or not size.node.expr.free_symbols:
                    continue
                expr = size.node.expr
                if expr.is_Symbol or linear_in_one_symbol(expr) is not None:
                    entry[i] = str(expr)
                else:
                    entry[i] = f"derived_{index}_{i}"
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


def build_engine_blocks(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """Replace each engine block by what the engine builds from it, on the inputs the
    block receives when the program runs on its example inputs; dims that are symbolic
    in the program stay dynamic in the engine."""
    dynamic = _has_dynamic_shapes(gm)
    recorder = _BlockInputRecorder(gm)
    with torch.no_grad():
        recorder.run(*ctx.packed_example_inputs(), enable_io_processing=False)
    for name, inputs in recorder.seen.items():
        block = gm.get_submodule(name)
        ctx.block_ops[name] = block_ops(block)
        dims = _dynamic_dims(block) if dynamic else None
        built = ctx.engine.build(block, inputs, dims if dims and any(dims) else None)
        _label_block_inputs(gm, name, built)
        setattr(gm, name, built)
    return gm


def _label_block_inputs(gm: fx.GraphModule, name: str, built: torch.nn.Module) -> None:
    """Tell an engine block without a backward which of its inputs are the caller's own (by
    their names), so that it refuses by name an input that requires grad. A value computed in
    PyTorch before the block (from weights, say) is not checked: like the engine's weights,
    it is a constant to the engine, as in Torch-TensorRT."""
    target = getattr(built, "engine_block", built)  # through WeightsAsInputs
    if getattr(target, "has_backward", True):
        return
    call = next(n for n in gm.graph.nodes if n.op == "call_module" and str(n.target) == name)
    target.input_labels = [arg.name if isinstance(arg, fx.Node) and arg.op == "placeholder" else None
                           for arg in call.args]


def unpack_complex_outputs(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """``view_as_complex`` before each complex output that is packed real here."""
    add_output_adapters(gm, ctx.complex_outputs)
    return gm


def pack_complex_inputs(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """Complex placeholders (same names), ``view_as_real`` right after them."""
    add_input_adapters(gm, ctx.complex_inputs)
    return gm


def keep_exported_signature(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """The exported program's pytree codegen and placeholder names, if a pass lost them.

    Both lowering strategies keep them already (the retrace through
    :func:`~tetrt_support.complex.codegen.retrace_preserving_signature`); this pass makes
    the signature a property of the pipeline, not of every pass before it.
    """
    if not isinstance(gm.graph._codegen, _PyTreeCodeGen):
        restore_signature(ctx.exported_program.module(), gm)
    return gm


def check_inputs_first(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """:func:`~tetrt_support.compiler.input_check.add_input_check`, ahead of everything: each
    input's kind, dtype, device, rank and dims (the program's ``range_constraints``), by name,
    so that no engine ever sees an input it was not built for."""
    add_input_check(gm, ctx.complex_inputs, ctx.exported_program)
    return gm


def as_compiled_module(gm: fx.GraphModule, ctx: CompileContext) -> CompiledModule:
    """The compiled graph as a :class:`CompiledModule`, and its record: what ``ctx`` found
    that is read after the compile (``blocks()``, ``complex_io()``, ``save`` and
    ``refit_module_weights``), written to its ``meta`` here and only here."""
    gm.graph.lint()
    compiled = CompiledModule(gm, gm.graph, class_name="CompiledModule")
    compiled.meta[BLOCK_OPS_KEY] = dict(ctx.block_ops)
    compiled.meta[COMPLEX_IO_KEY] = {"inputs": list(ctx.complex_inputs), "outputs": list(ctx.complex_outputs)}
    example = ctx.exported_program.example_inputs
    if example is not None:  # what save() re-exports with when given no inputs
        compiled.meta[EXAMPLE_INPUTS_KEY] = DYNAMIC if ctx.exported_program.range_constraints else example
    compiled.meta[ENGINE_NAME_KEY] = ctx.engine_name
    compiled.meta[STRATEGY_KEY] = ctx.strategy
    refit_record = {WEIGHTS_KEY: ctx.refit_weights, BLOCK_WEIGHTS_KEY: ctx.block_weights,
                    constant_folding.FOLDED_KEY: ctx.folded}
    compiled.meta.update((key, value) for key, value in refit_record.items() if value is not None)
    return compiled


#: The compiler, in order (the ``ctx`` field a pass writes, where it writes one).
PASSES: tuple[Pass, ...] = (
    # lowering
    drop_guards_fn,
    lower_complex,  # ctx.complex_inputs, ctx.complex_outputs
    functionalize_view_writes,
    fold_constants,  # ctx.folded
    return_complex_results_directly,
    # blocks
    partition_into_blocks,
    record_refit_weights,  # ctx.refit_weights, ctx.block_weights
    keep_reference_blocks,  # ctx.reference_blocks
    build_engine_blocks,  # ctx.block_ops
    run_failed_builds_in_pytorch,
    check_engine_blocks,
    check_full_compilation,
    # the edges: complex I/O, signature, input check
    unpack_complex_outputs,
    pack_complex_inputs,
    keep_exported_signature,
    check_inputs_first,
    # the whole
    check_whole_program,
    as_compiled_module,  # compiled.meta: the record
)


# --------------------------------------------------------------------------- running them
def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(choices)}")


def run_passes(
    exported_program: torch.export.ExportedProgram,
    engine_name: str,
    strategy: str,
    passes: Sequence[Pass],
    settings: CompilationSettings | None = None,
) -> Any:
    """Run ``passes`` in order on ``exported_program.module()``; returns what the last returns.

    ``engine_name`` is what ``compile(backend=...)`` names: the engine of the engine blocks.
    Without ``settings``, every engine-capable op goes to an engine (``min_block_size=1``)
    and nothing else is set: the pipeline as the history pass lists knew it.
    """
    if not isinstance(exported_program, torch.export.ExportedProgram):
        raise TypeError(
            f"compile() takes a torch.export.ExportedProgram (export the model first: "
            f"torch.export.export(model, args, kwargs)), got {type(exported_program).__name__}"
        )
    _check_choice("backend", engine_name, ENGINE_NAMES)  # the keyword that names it
    _check_choice("strategy", strategy, STRATEGIES)
    if settings is None:
        settings = CompilationSettings(backend=engine_name, strategy=strategy, min_block_size=1)
    ctx = CompileContext(
        exported_program,
        engine_name,
        strategy,
        ConfiguredEngine(get_engine(engine_name), settings),
        flat_example_inputs(exported_program),
        settings,
    )
    gm = use_private_shape_env(exported_program.module())  # guards the passes record stay ours
    for compile_pass in passes:
        gm = compile_pass(gm, ctx)
    return gm


def compile_program(exported_program: torch.export.ExportedProgram, settings: CompilationSettings) -> CompiledModule:
    """:data:`PASSES` over ``exported_program`` with ``settings`` (checked already)."""
    return run_passes(exported_program, settings.backend, settings.strategy, PASSES, settings)


#: Torch-TensorRT's ``ir`` values this compile path is (its ``torch_compile`` is the backend)
IRS = ("default", "dynamo")


def _check_ir(ir: str) -> None:
    if ir in IRS:
        return
    if ir == "torch_compile":
        raise ValueError("compile(ir='torch_compile'): this path is torch.compile's backend here: "
                         "torch.compile(model, backend='tetrt', options={...})")
    raise ValueError(f"compile(): unknown ir {ir!r}; this compiler is Torch-TensorRT's dynamo path: "
                     f"ir={' or '.join(repr(i) for i in IRS)} (ir='torch_compile' is torch.compile(backend='tetrt'))")


def compile(  # noqa: A001 - the public name mirrors torch.compile / torch_tensorrt.compile
    model: torch.nn.Module | torch.export.ExportedProgram,
    *,
    arg_inputs: Sequence[Any] | torch.Tensor | None = None,
    kwarg_inputs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    inputs: Sequence[Any] | None = None,
    backend: str = DEFAULT_ENGINE,
    strategy: str = "rewrite",
    min_block_size: int = MIN_BLOCK_SIZE,
    torch_executed_ops: Any = None,
    require_full_compilation: bool = False,
    pass_through_build_failures: bool = False,
    truncate_double: bool = False,
    ir: str = "default",
    **unknown_options: Any,
) -> CompiledModule:
    """Compile ``model`` into engine blocks; call the result like the model.

    ``model``: an ``nn.Module``, exported here with ``arg_inputs`` / ``kwarg_inputs``
    (``inputs`` is an alias of ``arg_inputs``) and ``dynamic_shapes``, or an
    ``ExportedProgram``; both give the same blocks. The options carry Torch-TensorRT's
    names and defaults (:class:`~tetrt_support.compiler.settings.CompilationSettings`
    says what each does): ``min_block_size``, ``torch_executed_ops``,
    ``require_full_compilation``, ``pass_through_build_failures``, ``truncate_double``;
    ``backend`` names the engine that builds the engine blocks (``"onnxruntime"``, the CPU
    stand-in for TensorRT, by default; ``"eager"``, ``"inductor"``, or ``"tensorrt"`` on GPU
    machines), not a torch.compile backend (this compiler's is ``"tetrt"``), and
    ``strategy`` the complex lowering (``"rewrite"`` or ``"retrace"``). Ops with no
    complex rule run in PyTorch fallback blocks; dynamic dims stay dynamic in the
    engines. An unknown option, or a value outside an option's choices, raises naming it.
    The passes are :data:`PASSES`.
    """
    from tetrt_support.compiler.settings import settings_from_options

    _check_ir(ir)
    settings = settings_from_options(
        unknown_options,
        backend=backend,
        strategy=strategy,
        min_block_size=min_block_size,
        torch_executed_ops=torch_executed_ops,
        require_full_compilation=require_full_compilation,
        pass_through_build_failures=pass_through_build_failures,
        truncate_double=truncate_double,
    )
    # Exporting and checking run the model: the caller's random generators are left as they were.
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []):
        program = as_exported_program(model, arg_inputs, kwarg_inputs, dynamic_shapes, inputs)
        return compile_program(program, settings)
