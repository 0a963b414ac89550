"""The Hugging Face complex-number sweep: every family, every engine, both strategies.

:func:`sweep_cases` lists what to run: the families that :mod:`.discover` finds in the
installed transformers, each with its :mod:`.hf` recipe (a family found without a recipe is
a row saying so, not a silent gap), static and with dynamic batch/sequence. :func:`run_case`
measures one: export, count complex nodes, ``tetrt_support.compile`` with the default
settings, call the result like the model (``compiled(**inputs)``), and compare with the
eager model (the same ``ModelOutput`` class and keys, the largest relative error), on the
example inputs and, for a dynamic export, on inputs of other sizes.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["SweepCase", "SweepRow", "TOLERANCE", "family_summary_table", "rows_table", "run_case", "sweep_cases"]

#: largest relative error (against the output's largest magnitude) that counts as a pass
TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class SweepCase:
    family: str  # a recipe of tetrt_support.zoo.hf, or the transformers module without one
    module: str
    engine: str
    strategy: str
    dynamic: bool
    has_recipe: bool = True


@dataclasses.dataclass
class SweepRow:
    family: str
    module: str
    engine: str
    strategy: str
    dynamic: bool
    complex_nodes: int | None = None
    engine_blocks: int | None = None
    fallback_blocks: int | None = None
    output_class: str | None = None
    same_class_and_keys: bool | None = None
    max_rel_error: float | None = None
    other_size_rel_error: float | None = None
    stage: str = ""  # where it stopped: "export", "compile", "call", or "" when it ran through
    error: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        errors = [e for e in (self.max_rel_error, self.other_size_rel_error) if e is not None]
        return (
            not self.error
            and self.engine_blocks == 1
            and self.fallback_blocks == 0
            and bool(self.same_class_and_keys)
            and bool(errors)
            and max(errors) <= TOLERANCE
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


def sweep_cases(engines: tuple[str, ...] = ("eager", "onnxruntime"), strategies: tuple[str, ...] = ("rewrite", "retrace"), families: tuple[str, ...] | None = None) -> list[SweepCase]:
    """Every (family, dynamic, engine, strategy) to run, families found by reading transformers."""
    from tetrt_support.zoo.discover import complex_modeling_files
    from tetrt_support.zoo import hf_families

    found = sorted({source.family for source in complex_modeling_files()})
    cases = []
    for module in found:
        recipes = [f for f in hf_families().values() if f.module == module]
        if not recipes:
            cases.append(SweepCase(module, module, "-", "-", False, has_recipe=False))
            continue
        for family in recipes:
            if families and family.name not in families:
                continue
            for dynamic in (False, True):
                for engine in engines:
                    for strategy in strategies:
                        cases.append(SweepCase(family.name, module, engine, strategy, dynamic))
    return cases


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _count_complex(program: torch.export.ExportedProgram) -> int:
    from tetrt_support.complex import complex_nodes

    return sum(1 for n in complex_nodes(program.graph_module) if n.op == "call_function")


def max_relative_error(expected: Any, actual: Any) -> float:
    """Largest ``|actual - expected|`` over the largest ``|expected|``, across float leaves."""
    worst = 0.0
    for w, g in zip(pytree.tree_leaves(expected), pytree.tree_leaves(actual)):
        if isinstance(w, torch.Tensor) and w.is_floating_point():
            scale = w.abs().max().item() or 1.0
            worst = max(worst, (g.to(w.dtype) - w).abs().max().item() / scale)
    return worst


def _same_output(expected: Any, actual: Any) -> bool:
    keys = getattr(expected, "keys", None)
    return type(actual) is type(expected) and (keys is None or list(actual.keys()) == list(expected.keys()))


def run_case(case: SweepCase) -> SweepRow:
    """Measure one case; an exception ends the row with the stage it stopped at and why."""
    import tetrt_support
    from tetrt_support.compiler.partition import blocks_of
    from tetrt_support import zoo

    row = SweepRow(case.family, case.module, case.engine, case.strategy, case.dynamic)
    if not case.has_recipe:
        row.stage, row.error = "recipe", "found complex numbers in its modeling code, but tetrt_support.zoo.hf has no recipe"
        return row
    start = time.perf_counter()
    try:
        row.stage = "export"
        model = zoo.build_model(case.family)
        program, _, inputs = zoo.export_model(case.family, model=model, dynamic=case.dynamic)
        row.complex_nodes = _count_complex(program)
        row.stage = "compile"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = tetrt_support.compile(program, backend=case.engine, strategy=case.strategy)
        kinds = [b.kind for b in blocks_of(compiled)]
        row.engine_blocks, row.fallback_blocks = kinds.count("engine"), kinds.count("fallback")
        row.stage = "call"
        with torch.no_grad():
            expected, actual = model(**inputs), compiled(**inputs)
            row.output_class = type(actual).__name__
            row.same_class_and_keys = _same_output(expected, actual)
            row.max_rel_error = max_relative_error(expected, actual)
            if case.dynamic:
                family = zoo.ZOO[case.family]
                seq = family.seq + 3 if "seq" in repr(family.dynamic_shapes(_Dim("batch"), _Dim("seq"))) else None
                other = zoo.example_inputs(case.family, model, batch=3, seq=seq, seed=1)[1]
                row.other_size_rel_error = max_relative_error(model(**other), compiled(**other))
        row.stage = ""
    except Exception as error:  # noqa: BLE001 - a sweep records every failure and goes on
        row.error = _first_line(error)
    row.seconds = round(time.perf_counter() - start, 2)
    return row


class _Dim:
    """Stands for a ``torch.export.Dim`` to read which inputs a family marks dynamic."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def __rmul__(self, factor: int) -> _Dim:  # a derived dim: a codec's wave, hop * frames
        return _Dim(f"{factor}*{self.name}")

    __mul__ = __rmul__


# ------------------------------------------------------------------------------ tables
def _blocks(row: dict[str, Any]) -> str:
    return f"{row['engine_blocks']}/{row['fallback_blocks']}"


def _worst(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{max(known):.1e}" if known else "-"


def family_summary_table(rows: list[dict[str, Any]]) -> Any:
    """One line per family of a sweep's rows (``as_dict`` form): complex nodes, how many rows
    pass, the engine/fallback block counts seen, the worst relative errors."""
    from tetrt_support.report import Table

    families: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        families.setdefault(row["family"], []).append(row)
    lines = []
    for family, group in families.items():
        engines = sorted({r["engine"] for r in group})
        lines.append((
            family,
            group[0]["complex_nodes"],
            ", ".join(engines),
            " ".join(sorted({_blocks(r) for r in group})),
            _worst([r["max_rel_error"] for r in group]),
            _worst([r["other_size_rel_error"] for r in group]),
            f"{sum(r['passed'] for r in group)}/{len(group)}",
        ))  # fmt: skip
    headers = ("family", "complex nodes", "engines", "engine/fallback", "max rel err", "other size", "pass")
    return Table(lines, headers, title="per family (static and dynamic, both strategies)")


def rows_table(rows: list[dict[str, Any]]) -> Any:
    """Every row of a sweep: family, shapes, engine, strategy, blocks, errors, result."""
    from tetrt_support.report import Table

    def result(r: dict[str, Any]) -> str:
        return "pass" if r["passed"] else ("FAIL " + r["error"][:60] if r["error"] else "FAIL")

    lines = [
        (r["family"], "dynamic" if r["dynamic"] else "static", r["engine"], r["strategy"], _blocks(r),
         _worst([r["max_rel_error"]]), _worst([r["other_size_rel_error"]]), result(r))
        for r in rows
    ]  # fmt: skip
    headers = ("family", "shapes", "engine", "strategy", "engine/fallback", "rel err", "other size", "result")
    return Table(lines, headers, key_columns=2)
