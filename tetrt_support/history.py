"""The broken signature handling that came before the shipped compiler, re-enacted.

Each :class:`HistoricalPolicy` is :data:`tetrt_support.compiler.pipeline.PASSES` with some
passes swapped for old ones defined here (:data:`BEFORE_FIX`, :data:`RESTORE_ONLY`,
:data:`FLATTEN_FIX`, :data:`EVERY_COMPLEX_OUTPUT`, :data:`FINAL`; each documented where it
is defined). :func:`signature_matrix` compiles :data:`CASES` under each policy and calls them
by position and by keyword. A showcase module (imports transformers, the ``zoo`` extra).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.graph import CodeGen, _PyTreeCodeGen, _PyTreeInfo
from torch.utils import _pytree as pytree

# Imported before any export: transformers registers its ModelOutput classes as pytree
# nodes at import, and a registration first made inside a trace is not seen by it.
from transformers.modeling_outputs import BaseModelOutput

from tetrt_support.compiler.context import CompileContext, Pass
from tetrt_support.compiler.io_adapters import flat_outputs, input_placeholders, view_outputs_as_complex
from tetrt_support.compiler.partition import block_of
from tetrt_support.compiler.pipeline import PASSES, CompiledModule, pack_complex_inputs, run_passes
from tetrt_support.complex.codegen import retrace_preserving_signature

__all__ = [
    "BEFORE_FIX",
    "CASES",
    "DC",
    "EVERY_COMPLEX_OUTPUT",
    "FINAL",
    "FLATTEN_FIX",
    "NT",
    "POLICIES",
    "RESTORE_ONLY",
    "RETRACE_MODES",
    "Case",
    "CumsumBetween",
    "Eig",
    "Eigvals",
    "HistoricalPolicy",
    "OutputModel",
    "compile_as",
    "describe_outcome",
    "on_the_bare_engine",
    "output_mismatch",
    "rebuild_codegen_from_placeholders",
    "register_case_dataclass",
    "retrace",
    "signature_matrix",
    "substituted",
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
    ``"flatten"`` flattens the retraced output, then restores; ``"swap"`` is the fix the
    lowering ships (:func:`tetrt_support.complex.codegen.retrace_preserving_signature`),
    here for comparison: a plain ``CodeGen`` while retracing, then the codegen restored on
    the result AND on ``gm``, placeholders renamed back.
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


def _set_codegen(gm: fx.GraphModule, codegen: CodeGen) -> None:
    gm.graph._codegen = codegen
    gm.recompile()


def rebuild_codegen_from_placeholders(gm: fx.GraphModule) -> None:
    """What Torch-TensorRT's complex I/O adapter did: a codegen whose parameters are the
    graph's placeholder names (``arg0_1``, ``x_unpacked_complex``), so the module can only
    be called by position."""
    names = [p.name for p in input_placeholders(gm)]
    old = gm.graph._codegen
    out_spec = old.pytree_info.out_spec if isinstance(old, _PyTreeCodeGen) else None
    in_spec = pytree.tree_structure((tuple(range(len(names))), {}))
    _set_codegen(gm, _PyTreeCodeGen(_PyTreeInfo(names, in_spec, out_spec)))


# --------------------------------------------------------------------------- old passes


def retrace_again(mode: str) -> Pass:
    """A pass that retraces the lowered module with make_fx as ``mode`` says (the
    decomposition path's retrace, on the retrace strategy only)."""

    def retrace_through_codegen(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
        if ctx.strategy != "retrace":
            return gm
        return retrace(gm, ctx.packed_example_inputs(), mode)

    retrace_through_codegen.__name__ = f"retrace_through_codegen_{mode}"
    return retrace_through_codegen


def _old_boundary(name: str, unpacks: Callable[[fx.Node], bool]) -> Pass:
    def unpack_complex_outputs(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
        flat = flat_outputs(gm)
        if len(flat) == len(ctx.complex_outputs):
            chosen = [
                i
                for i, (value, dtype) in enumerate(zip(flat, ctx.complex_outputs))
                if dtype is not None and isinstance(value, fx.Node) and unpacks(value)
            ]
            view_outputs_as_complex(gm, ctx.complex_outputs, chosen)
        return gm

    unpack_complex_outputs.__name__ = name
    return unpack_complex_outputs


#: only a block call returned directly: a complex output of a multi-output block,
#: returned through getitem, comes back packed real
unpack_block_calls_only = _old_boundary(
    "unpack_block_calls_only", lambda value: value.op == "call_module" and block_of(value) is value
)
#: every output that was complex in the program, even if already complex here
unpack_every_complex_output = _old_boundary("unpack_every_complex_output", lambda value: True)


def pack_complex_inputs_renamed(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """The shipped input adapters, then each complex placeholder renamed
    ``<name>_unpacked_complex`` as Torch-TensorRT's rewriter did."""
    gm = pack_complex_inputs(gm, ctx)
    for ph in input_placeholders(gm):
        if "tetrt_complex_input" in ph.meta:
            ph._rename(f"{ph.name}_unpacked_complex")
            ph.target = ph.name
    gm.recompile()
    return gm


def codegen_from_placeholder_names(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """After complex input adapters, a codegen rebuilt from the placeholder names."""
    if any(dtype is not None for dtype in ctx.complex_inputs):
        rebuild_codegen_from_placeholders(gm)
    return gm


def on_the_bare_engine(shipped: Pass) -> Pass:
    """``shipped`` run with the bare engine, as before the configured one: no settings
    applied, in-place ops taken into engine blocks, a failed build raised."""

    def old(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
        # a copy of ctx whose engine is the bare one; its dicts are ctx's own, so what
        # the pass records in them stays recorded
        return shipped(gm, dataclasses.replace(ctx, engine=ctx.engine.inner))

    old.__name__ = f"{shipped.__name__}_on_the_bare_engine"
    return old


# --------------------------------------------------------------------------- policies

_SHIPPED: tuple[tuple[str, Pass], ...] = tuple((p.__name__, p) for p in PASSES)


#: The shipped pipeline's last check compares the finished module with ``ep.module()``,
#: called as the program was exported; the old pipelines had no such check, and with it
#: every re-enacted failure would be a compile error instead of the behaviour it shows.
_NOT_IN_THE_OLD_PIPELINES = frozenset({"check_whole_program"})


def substituted(
    replace: Mapping[str, Pass],
    insert_after: Mapping[str, Pass] | None = None,
    drop: Sequence[str] = (),
) -> tuple[Pass, ...]:
    """The shipped :data:`~tetrt_support.compiler.pipeline.PASSES` with the passes named in
    ``replace`` swapped, the passes of ``insert_after`` put after the one they name, those
    named in ``drop`` left out, and the whole-program check left out."""
    names = {name for name, _ in _SHIPPED}
    unknown = (set(replace) | set(insert_after or {}) | set(drop) | _NOT_IN_THE_OLD_PIPELINES) - names
    if unknown:
        raise ValueError(f"no shipped pass named {sorted(unknown)}; the passes are {[n for n, _ in _SHIPPED]}")
    passes: list[Pass] = []
    for name, shipped in _SHIPPED:
        if name in _NOT_IN_THE_OLD_PIPELINES or name in drop:
            continue
        passes.append(replace.get(name, shipped))
        if insert_after and name in insert_after:
            passes.append(insert_after[name])
    return tuple(passes)


@dataclasses.dataclass(frozen=True)
class HistoricalPolicy:
    """A named pass list for :func:`~tetrt_support.compiler.pipeline.run_passes`."""

    name: str
    passes: tuple[Pass, ...]

    def pass_names(self) -> list[str]:
        return [p.__name__ for p in self.passes]


def _before_the_fix(name: str, retrace_mode: str) -> HistoricalPolicy:
    return HistoricalPolicy(
        name,
        substituted(
            {
                "unpack_complex_outputs": unpack_block_calls_only,
                "pack_complex_inputs": pack_complex_inputs_renamed,
                "keep_exported_signature": codegen_from_placeholder_names,
            },
            insert_after={"lower_complex": retrace_again(retrace_mode)},
        ),
    )


# Torch-TensorRT's complex support lost the exported call signature in three places: a make_fx
# retrace that dropped or mis-restored the pytree codegen, a codegen rebuilt from placeholder
# names at the complex input adapter, and an output boundary that missed getitems of
# multi-output blocks; the first fixes had holes of their own.
# - BEFORE_FIX: a plain make_fx retrace (placeholders arg0_1, ...: keyword calls fail), complex
#   placeholders renamed x_unpacked_complex with the codegen rebuilt from those names
#   (position-only calls), and a boundary that unpacks only a block call returned directly
#   (a complex output returned through a getitem comes back packed real).
# - RESTORE_ONLY: the pytree codegen put back over a graph that traced THROUGH it: a dict comes
#   back as its keys, a (1, 4) tensor as its first row, a dataclass is "not iterable".
# - FLATTEN_FIX: the same, flattening the retraced output first (the first fix): make_fx records
#   a namedtuple or registered dataclass as ONE node, so the spec finds one leaf, not two.
# - EVERY_COMPLEX_OUTPUT: the getitem-following boundary without a dtype check: genuinely
#   complex outputs (eig in a fallback block) get wrapped a second time.
# - FINAL: the shipped pass list.
BEFORE_FIX = _before_the_fix("before the fix", "plain")
RESTORE_ONLY = _before_the_fix("restore only", "restore")
FLATTEN_FIX = _before_the_fix("flatten fix", "flatten")
EVERY_COMPLEX_OUTPUT = HistoricalPolicy(
    "every complex output", substituted({"unpack_complex_outputs": unpack_every_complex_output})
)
FINAL = HistoricalPolicy("final", PASSES)
POLICIES = {p.name: p for p in (BEFORE_FIX, RESTORE_ONLY, FLATTEN_FIX, EVERY_COMPLEX_OUTPUT, FINAL)}


def compile_as(
    policy: HistoricalPolicy,
    exported_program: torch.export.ExportedProgram,
    engine_name: str = "eager",
    strategy: str = "rewrite",
) -> CompiledModule:
    """``tetrt_support.compile(exported_program, backend=engine_name, strategy=strategy)``,
    with ``policy``'s pass list instead of the shipped one."""
    return run_passes(exported_program, engine_name, strategy, policy.passes)


# --------------------------------------------------------------------------- case models

NT = collections.namedtuple("NT", ["a", "b"])


@dataclasses.dataclass
class DC:
    a: torch.Tensor
    b: torch.Tensor


def register_case_dataclass() -> type:
    """Register :class:`DC` as a pytree node for torch.export, once; returns it.

    Not done at import: importing this module changes no global registry. Building a
    dataclass case (``OutputModel("dataclass")``) calls it."""
    if DC not in pytree.SUPPORTED_NODES:
        torch.export.register_dataclass(DC)
    return DC


class OutputModel(torch.nn.Module):
    """``x * y`` in complex arithmetic, returned in the structure ``kind`` names.

    Kinds: tensor, tensor_1x4, tuple, list, dict, namedtuple, dataclass, nested,
    model_output (an HF ``BaseModelOutput``).

    ``io`` says where complex values cross the model's edge: ``"real"`` (interior only),
    ``"complex_in"`` (x is complex), ``"complex_out"`` (the product is returned complex)
    or ``"both"``. ``a`` is the product, ``b`` its squared magnitude (always real).
    """

    def __init__(self, kind: str = "tensor", io: str = "real") -> None:
        super().__init__()
        self.kind, self.io = kind, io
        if kind == "dataclass":
            register_case_dataclass()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        xc = x if self.io in ("complex_in", "both") else torch.view_as_complex(x)
        z = xc * torch.view_as_complex(y) + 1
        a = z if self.io in ("complex_out", "both") else torch.view_as_real(z)
        b = torch.view_as_real(z).pow(2).sum(-1)
        kind = self.kind
        if kind == "tensor":
            return a
        if kind == "tensor_1x4":
            return b.reshape(1, -1)[:, :4]
        if kind == "tuple":
            return a, b
        if kind == "list":
            return [a, b]
        if kind == "dict":
            return {"prod": a, "energy": b}
        if kind == "namedtuple":
            return NT(a, b)
        if kind == "dataclass":
            return DC(a, b)
        if kind == "nested":
            return a, [b, {"k": b * 2}], NT(a, b)
        if kind == "model_output":
            return BaseModelOutput(last_hidden_state=a, hidden_states=(b,))
        raise ValueError(f"unknown output kind {kind!r}")

    @staticmethod
    def inputs(io: str = "real", batch: int = 2, seq: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, seq, 4, 2, generator=g)
        y = torch.randn(batch, seq, 4, 2, generator=g)
        return (torch.view_as_complex(x) if io in ("complex_in", "both") else x), y


class Eig(torch.nn.Module):
    """``torch.linalg.eig`` has no complex rule: it runs, complex, in a PyTorch block."""

    def forward(self, x: torch.Tensor) -> Any:
        return torch.linalg.eig(x + 1)


class Eigvals(torch.nn.Module):
    """The single-output sibling of :class:`Eig`: the block call itself is the output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigvals(x + 1)


class CumsumBetween(torch.nn.Module):
    """complex multiply (engine) -> complex cumsum (no rule: PyTorch) -> complex multiply (engine)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        z = torch.view_as_complex(x) * torch.view_as_complex(y)
        c = torch.cumsum(z, dim=1)
        return {"out": torch.view_as_real(c * torch.view_as_complex(y)), "norm": c.abs()}


# --------------------------------------------------------------------------- the matrix


@dataclasses.dataclass(frozen=True)
class Case:
    """One row of the matrix: a model, its inputs, and how to call it by keyword."""

    label: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int], dict[str, torch.Tensor]]  # seed -> keyword inputs, in order


def _xy(io: str) -> Callable[[int], dict[str, torch.Tensor]]:
    return lambda seed: dict(zip(("x", "y"), OutputModel.inputs(io, seed=seed)))


def _square(seed: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(4, 4, generator=torch.Generator().manual_seed(seed))}


CASES: tuple[Case, ...] = (
    Case("interior complex, tensor output", lambda: OutputModel("tensor", "real"), _xy("real")),
    Case("interior complex, namedtuple output", lambda: OutputModel("namedtuple", "real"), _xy("real")),
    Case("interior complex, dataclass output", lambda: OutputModel("dataclass", "real"), _xy("real")),
    Case("complex input", lambda: OutputModel("tensor", "complex_in"), _xy("complex_in")),
    Case("complex output", lambda: OutputModel("tensor", "complex_out"), _xy("complex_out")),
    Case("complex and real outputs of one block (dict)", lambda: OutputModel("dict", "complex_out"), _xy("complex_out")),
    Case("eig in a fallback block (2 complex outputs)", Eig, _square),
    Case("eigvals in a fallback block (1 complex output)", Eigvals, _square),
)


def output_mismatch(expected: Any, actual: Any, atol: float = 1e-4) -> str | None:
    """None if ``actual`` has ``expected``'s structure, dtypes, shapes and values; else why not."""
    exp_leaves, exp_spec = pytree.tree_flatten_with_path(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    if act_spec != pytree.tree_structure(expected):
        if isinstance(actual, dict) and all(isinstance(v, str) for v in actual.values()):
            return "returned the dict's keys"
        if type(actual) is not type(expected):
            return f"returned a {type(actual).__name__}, not a {type(expected).__name__}"
        return f"returned a {type(actual).__name__} of another structure"
    for (path, e), a in zip(exp_leaves, act_leaves):
        where = pytree.keystr(path) or "output"
        if not isinstance(a, torch.Tensor):
            return f"{where} returned a {type(a).__name__}"
        if a.is_complex() != e.is_complex():
            return f"{where} returned {'complex' if a.is_complex() else 'real'} {tuple(a.shape)}"
        if a.shape != e.shape:
            return f"{where} returned shape {tuple(a.shape)}"
        if not torch.allclose(a, e, atol=atol, rtol=1e-4):
            return f"{where} returned wrong values"
    return None


def _outcome(fn: Callable[[], Any], expected: Any) -> str:
    try:
        actual = fn()
    except Exception as e:  # noqa: BLE001 - the matrix reports every failure by its type
        return f"{type(e).__name__}"
    return output_mismatch(expected, actual) or "ok"


def describe_outcome(by_strategy: dict[str, dict[str, str]]) -> str:
    """Fold {strategy: {"position": outcome, "keyword": outcome}} into one short cell."""
    strategies = list(by_strategy)
    if all(o == "ok" for r in by_strategy.values() for o in r.values()):
        return "✓"
    position_ok = [s for s in strategies if by_strategy[s]["position"] == "ok"]
    keyword_bad = [s for s in strategies if by_strategy[s]["keyword"] != "ok"]
    if len(position_ok) == len(strategies) and keyword_bad:
        return "by position only" + ("" if len(keyword_bad) == len(strategies) else f" on the {keyword_bad[0]} path")
    wrong = []
    for s in strategies:
        o = by_strategy[s]["position"]
        if o != "ok" and o not in wrong:
            wrong.append(o if len(strategies) == 1 or all(by_strategy[t]["position"] == o for t in strategies) else f"{o} ({s})")
    return "✗ " + "; ".join(wrong)


def signature_matrix(
    policies: Sequence[HistoricalPolicy],
    cases: Sequence[Case] = CASES,
    strategies: Sequence[str] = ("rewrite", "retrace"),
    backend: str = "eager",
) -> list[tuple[str, ...]]:
    """One row per case, one cell per policy: what calling the compiled module did."""
    rows = []
    for case in cases:
        model = case.build()
        example = case.inputs(0)
        program = torch.export.export(model, tuple(example.values()), strict=False)
        fresh = case.inputs(1)
        expected = model(**fresh)
        cells = []
        for policy in policies:
            by_strategy = {}
            for strategy in strategies:
                module = compile_as(policy, program, backend, strategy)
                by_strategy[strategy] = {
                    "position": _outcome(lambda: module(*fresh.values()), expected),
                    "keyword": _outcome(lambda: module(**fresh), expected),
                }
            cells.append(describe_outcome(by_strategy))
        rows.append((case.label, *cells))
    return rows
