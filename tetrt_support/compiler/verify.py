"""Check every engine block against PyTorch on the example inputs, when it is built.

:func:`keep_reference_blocks` keeps a PyTorch copy of each engine block before the build;
:func:`check_engine_blocks` compares each built block with it (``on_engine_mismatch``:
``"raise"`` an :class:`EngineMismatchError` or ``"fallback"`` to PyTorch with a warning);
:func:`check_whole_program` compares the compiled module with ``ep.module()``. Tolerances
and the exception for sort indices: ``docs/architecture.md`` ("Module notes").
"""

from __future__ import annotations

import copy
import operator
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from tetrt_support.compiler.partition import block_kind, run_block_in_pytorch

if TYPE_CHECKING:
    from tetrt_support.compiler.context import CompileContext

__all__ = [
    "ATOL",
    "LOW_PRECISION_ULPS",
    "RTOL",
    "EngineMismatchError",
    "check_engine_blocks",
    "check_whole_program",
    "compare_outputs",
    "keep_reference_blocks",
    "reference_copy",
    "relative_tolerance",
]

RTOL = 1e-4
ATOL = 1e-6
LOW_PRECISION_ULPS = 8


def relative_tolerance(dtype: torch.dtype) -> float:
    """The relative bound of :func:`compare_outputs` for outputs of ``dtype``."""
    if dtype in (torch.bfloat16, torch.float16, torch.complex32):
        real = torch.float16 if dtype == torch.complex32 else dtype
        return max(RTOL, LOW_PRECISION_ULPS * torch.finfo(real).eps)
    return RTOL


class EngineMismatchError(RuntimeError):
    """An engine block computed something else than its PyTorch graph on the example inputs."""


def _engine_blocks(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_module" and block_kind(str(n.target)) == "engine"]


_ORDER_OPS = tuple(
    op for op in (torch.ops.aten.sort.default, torch.ops.aten.sort.stable, torch.ops.aten.topk.default) if op is not None
)


def _is_order_index(node: fx.Node) -> bool:
    """Indices of a sort/argsort/topk, or the values of an unsorted topk (their order is free)."""
    if node.op != "call_function":
        return False
    if node.target is torch.ops.aten.argsort.default:
        return True
    if node.target is not operator.getitem or getattr(node.args[0], "target", None) not in _ORDER_OPS:
        return False
    source = node.args[0]
    unsorted_topk = source.target is torch.ops.aten.topk.default and not (
        source.args[4] if len(source.args) > 4 else source.kwargs.get("sorted", True)
    )
    return node.args[1] == 1 or unsorted_topk


def tie_dependent_outputs(block: fx.GraphModule) -> frozenset[int]:
    """Flat output positions of ``block`` computed from the indices of a sort/argsort/topk
    (the indices themselves, and what they gather, scatter or permute)."""
    tainted: set[fx.Node] = set()
    for node in block.graph.nodes:
        if _is_order_index(node) or any(a in tainted for a in node.all_input_nodes):
            tainted.add(node)
    outputs = pytree.tree_leaves(block.graph.output_node().args[0])
    return frozenset(i for i, out in enumerate(outputs) if isinstance(out, fx.Node) and out in tainted)


def reference_copy(block: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``block`` that an engine build cannot change, for the check.

    ``copy.deepcopy`` refuses a tensor that is not a graph leaf (a weight-normed weight
    computed with grad on, a constant folded from it): such a tensor is copied detached
    (same values, same ``requires_grad``), everything else as deepcopy copies it.
    """
    memo: dict[int, Any] = {}
    for module in block.modules():
        tensors = (*module._parameters.values(), *module._buffers.values(), *vars(module).values())
        for value in tensors:
            if isinstance(value, torch.Tensor) and not value.is_leaf and id(value) not in memo:
                memo[id(value)] = value.detach().clone().requires_grad_(value.requires_grad)
    return copy.deepcopy(block, memo)


def keep_reference_blocks(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """A PyTorch copy of each engine block, for :func:`check_engine_blocks` (a pass; writes
    ``ctx.reference_blocks``).

    A block that cannot be copied is not checked, with a warning naming it and why: the
    check guards a compile and must never be what breaks it (the whole-program check still
    runs).
    """
    if not ctx.settings.check_engine_blocks:
        return gm
    references = {}
    for name in _engine_blocks(gm):
        try:
            references[name] = reference_copy(gm.get_submodule(name))
        except Exception as error:  # noqa: BLE001 - any failure to copy only skips the check
            warnings.warn(
                f"engine block {name} is not checked against PyTorch block by block: its graph "
                f"could not be copied ({type(error).__name__}: {error})",
                stacklevel=2,
            )
    ctx.reference_blocks = references
    return gm


def compare_outputs(expected: Any, actual: Any, skip: frozenset[int] = frozenset()) -> str | None:
    """None if ``actual`` matches ``expected`` (a block's outputs, those at ``skip`` aside),
    else what differs first."""
    want, got = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    if len(want) != len(got):
        return f"{len(got)} outputs where PyTorch gives {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        if i in skip:
            continue
        if not isinstance(w, torch.Tensor):
            if w != g:
                return f"output {i} is {g!r} where PyTorch gives {w!r}"
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape or g.dtype != w.dtype:
            what = f"{tuple(g.shape)} {g.dtype}" if isinstance(g, torch.Tensor) else type(g).__name__
            return f"output {i} is {what} where PyTorch gives {tuple(w.shape)} {w.dtype}"
        if w.dtype == torch.bool or not (w.is_floating_point() or w.is_complex()):
            if not torch.equal(g, w):
                return f"output {i} differs in {int((g != w).sum())} of {w.numel()} elements"
            continue
        w64, g64 = w.detach().to(torch.complex128 if w.is_complex() else torch.float64), g.detach().to(
            torch.complex128 if w.is_complex() else torch.float64
        )
        nan_w, nan_g = torch.isnan(w64), torch.isnan(g64)
        if not torch.equal(nan_w, nan_g):
            return f"output {i} has NaN in {int((nan_w ^ nan_g).sum())} elements where PyTorch does not (or the reverse)"
        finite = torch.isfinite(w64) & torch.isfinite(g64)
        if not torch.equal(w64[~finite & ~nan_w], g64[~finite & ~nan_w]):
            return f"output {i} has different infinities"
        if finite.any():
            err = (w64[finite] - g64[finite]).abs().max().item()
            scale = w64[finite].abs().max().item()
            if err > max(relative_tolerance(w.dtype) * scale, ATOL):
                return f"output {i} (shape {tuple(w.shape)}) differs by up to {err:.3g} (largest |value| {scale:.3g})"
    return None


class _Checker(fx.Interpreter):
    """Runs the compiled graph; each engine block's result is checked against its copy."""

    def __init__(self, gm: fx.GraphModule, references: dict[str, torch.nn.Module]) -> None:
        super().__init__(gm)
        self.references = references
        self.mismatches: dict[str, str] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        name = str(target)
        reference = self.references.get(name)
        if reference is None:
            return super().call_module(target, args, kwargs)
        expected = reference(*args, **kwargs)
        skip = tie_dependent_outputs(reference) if isinstance(reference, fx.GraphModule) else frozenset()
        difference = compare_outputs(expected, super().call_module(target, args, kwargs), skip)
        if difference is not None:
            self.mismatches[name] = difference
        return expected  # later blocks get the right inputs, so each mismatch is its own


def check_engine_blocks(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """Compare each engine block with its PyTorch copy on the example inputs (a pass; the
    copies in ``ctx.reference_blocks`` are dropped after it)."""
    references, ctx.reference_blocks = ctx.reference_blocks, {}
    settings = ctx.settings
    if not settings.check_engine_blocks or not references:
        return gm
    live = {name: ref for name, ref in references.items() if name in set(_engine_blocks(gm))}
    checker = _Checker(gm, live)
    with torch.no_grad():
        checker.run(*ctx.packed_example_inputs(), enable_io_processing=False)
    for name, difference in checker.mismatches.items():
        ops = ctx.block_ops.get(name, ())
        what = f"engine block {name} ({len(ops)} ops)" if ops else f"engine block {name}"
        message = f"the {ctx.engine_name} engine's {what} does not match PyTorch on the example inputs: {difference}"
        if settings.on_engine_mismatch == "raise":
            raise EngineMismatchError(
                message + " (check_engine_blocks=False skips this check; on_engine_mismatch='fallback' runs the block in PyTorch)"
            )
        new = run_block_in_pytorch(gm, ctx, name, live[name])
        warnings.warn(f"{message}; it runs in PyTorch as {new}", stacklevel=2)
    return gm


_CHECK_SEED = 0  # the generator seed of both runs of the whole-program check


def check_whole_program(gm: fx.GraphModule, ctx: CompileContext) -> fx.GraphModule:
    """The compiled graph against ``ep.module()`` on the example inputs (a pass)."""
    if not ctx.settings.check_engine_blocks:
        return gm
    args, kwargs = ctx.exported_program.example_inputs
    devices = sorted({x.device.index or 0 for x in pytree.tree_leaves((args, kwargs))
                      if isinstance(x, torch.Tensor) and x.device.type == "cuda"})
    # Both runs draw the same random numbers (random ops run in PyTorch, partition.py);
    # the caller's generator state is left as it was.
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        torch.manual_seed(_CHECK_SEED)
        expected = ctx.exported_program.module()(*args, **kwargs)
        torch.manual_seed(_CHECK_SEED)
        actual = gm(*args, **kwargs)
    paths = [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(expected)[0]]
    difference = compare_outputs(expected, actual)
    if difference is not None:
        index = int(difference.split()[1]) if difference.startswith("output ") else None
        where = f" (the model's output{paths[index]})" if index is not None and index < len(paths) else ""
        raise EngineMismatchError(
            f"the compiled module does not match the exported program on the example inputs{where}: {difference} "
            f"(check_engine_blocks=False skips this check)"
        )
    return gm
