"""The compiled module's first step: every user input checked, by name, before any block runs.

Engine blocks are built for the exported dtypes, ranks and dim ranges; a wrong input
would otherwise fail inside an engine (``input_0 ... Got: 15 Expected: 16``), be taken
silently, or leave a mark on the engine (a Dynamo recompile). :func:`check_inputs` follows
torch.export's own input check (``_check_input_constraints_for_graph``: static dims,
equal dims, ``range_constraints``, specialised scalars) and adds what the engines need
(tensor, dtype, device).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx

from tetrt_support.compiler.io_adapters import input_placeholders

__all__ = [
    "InputValueError",
    "InputTypeError",
    "InvalidInputError",
    "add_input_check",
    "check_complex_inputs",
    "check_inputs",
    "input_names",
    "input_specs",
]


class InvalidInputError(Exception):
    """An input of a compiled module that does not match the exported program's."""


class InputTypeError(InvalidInputError, TypeError):
    """Not a tensor where a tensor belongs, or the wrong dtype, complexness or device."""


class InputValueError(InvalidInputError, ValueError):
    """The wrong rank, a static dim of another size, a dynamic dim out of its range, or
    another value for a scalar the program was specialised to."""


# An input spec is a plain tuple (the fx code prints it, the pickle format keeps it):
#   ("tensor", name, dtype, device type, dims, shape text, ranges text)
#   ("value", name, value)     an int/float/str/bool input the program specialised to
#   ("symint", name, dim)
#   ("any", name)
# A dim is an int (static) or (text, symbol, symbol's name, a, b, lo, hi, declared range):
# the size is a * symbol + b; lo/hi are the bounds checked (None: unchecked), as torch's.


# --------------------------------------------------------------------------- describing
def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        kind = "complex" if value.is_complex() else "real"
        return f"a {kind} tensor of dtype {value.dtype}"
    return _describe_object(value)


def _describe_object(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (bool, int, float, complex, str)):
        kind = type(value).__name__
        return f"{'an' if kind == 'int' else 'a'} {kind} ({value!r})"
    cls = type(value)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    hint = "; pass torch.from_numpy(...) instead" if cls.__module__.split(".")[0] == "numpy" else ""
    return f"a {name}{hint}"


def _paren(*parts: str | None) -> str:
    text = "; ".join(p for p in parts if p)
    return f" ({text})" if text else ""


def _shape(value: torch.Tensor) -> str:
    return str(list(value.shape))


def _expected_tensor(spec: tuple[Any, ...]) -> str:
    _, _, dtype, _, _, shape_text, ranges_text = spec
    return f"a {dtype} tensor of shape {shape_text}{f' with {ranges_text}' if ranges_text else ''}"


# --------------------------------------------------------------------------- checking
def _check_dim(
    dim: Any, size: Any, where: str, name: str, context: str, seen: dict[str, tuple[int, str]]
) -> None:
    if not isinstance(size, int) or isinstance(size, bool):
        return  # a symbolic size (a fake input under tracing): as torch, checks nothing
    if isinstance(dim, int):
        if size != dim:
            raise InputValueError(
                f"input {name!r}: expected {where} to be equal to {dim}, but got {size}{_paren(context)}. "
                f"If this dim should be dynamic, export again with dynamic_shapes (e.g. Dim.DYNAMIC)"
            )
        return
    text, symbol, root_name, a, b, lo, hi, declared = dim
    if symbol is None:
        return  # not a plain function of one dim: left to the engines, as torch does
    if symbol in seen:
        root, first = seen[symbol]
        if size != a * root + b:
            what = f"{text}, which {first} set to {root}" if text == root_name else f"{text}, where {first} set {root_name} to {root}"
            raise InputValueError(
                f"input {name!r}: expected {where} to be equal to {a * root + b}, but got {size}{_paren(what, context)}"
            )
    else:
        root, rest = divmod(size - b, a)
        if rest:
            raise InputValueError(
                f"input {name!r}: expected {where} = {size} to be of the form {text}, where {root_name} "
                f"is an integer{_paren(context)}"
            )
        seen[symbol] = (root, where)
    if lo is not None and size < lo:
        raise InputValueError(f"input {name!r}: expected {where} to be >= {lo}, but got {size}{_paren(declared, context)}")
    if hi is not None and size > hi:
        raise InputValueError(f"input {name!r}: expected {where} to be <= {hi}, but got {size}{_paren(declared, context)}")


def _check_tensor(spec: tuple[Any, ...], value: Any, seen: dict[str, tuple[int, str]]) -> None:
    _, name, dtype, device, dims, shape_text, _ = spec
    if not isinstance(value, torch.Tensor):
        raise InputTypeError(f"input {name!r} must be {_expected_tensor(spec)}, but got {_describe_object(value)}")
    if dtype.is_complex != value.is_complex():
        want = "complex" if dtype.is_complex else "real"
        raise InputTypeError(f"input {name!r} must be a {want} tensor (exported as {dtype}), but got {_describe(value)}")
    if value.dtype != dtype:
        raise InputTypeError(
            f"input {name!r} must be {_expected_tensor(spec)}, but got a {value.dtype} tensor of shape "
            f"{_shape(value)}; the engines were built for {dtype}: cast it with .to({dtype})"
        )
    if device is not None and value.device.type != device:
        raise InputTypeError(
            f"input {name!r} must be on the {device} device, where the module was compiled, but got a "
            f"tensor on {value.device}"
        )
    context = f"exported shape {shape_text}, got {_shape(value)}"
    if value.dim() != len(dims):
        raise InputValueError(
            f"input {name!r} must have {len(dims)} dimensions (exported shape {shape_text}), but got "
            f"{value.dim()}: shape {_shape(value)}"
        )
    for i, (dim, size) in enumerate(zip(dims, value.shape)):
        _check_dim(dim, size, f"{name}.shape[{i}]", name, context, seen)


def check_inputs(specs: tuple[tuple[Any, ...], ...], *values: Any) -> None:
    """Raise :class:`InputTypeError` or :class:`InputValueError` naming the first input
    that does not match its spec (:func:`input_specs`), what was expected and what was given."""
    if any(isinstance(v, fx.Proxy) for v in values):
        return  # symbolic tracing (GraphModule.__reduce__ retraces the code): nothing to check
    if len(values) != len(specs):
        raise InputTypeError(f"the compiled module takes {len(specs)} inputs, got {len(values)}")
    seen: dict[str, tuple[int, str]] = {}
    for spec, value in zip(specs, values):
        kind, name = spec[0], spec[1]
        if kind == "tensor":
            _check_tensor(spec, value, seen)
        elif kind == "value":
            expected = spec[2]
            if type(value) is not type(expected):
                raise InputTypeError(
                    f"input {name!r} must be {_describe_object(expected)} (the program was exported "
                    f"specialised to that value), but got {_describe_object(value)}"
                )
            if not (value == expected or (isinstance(value, float) and math.isnan(value) and math.isnan(expected))):
                raise InputValueError(
                    f"input {name!r}: expected {name} to be equal to {expected!r} (the program was "
                    f"exported specialised to that value), but got {value!r}"
                )
        elif kind == "symint":
            if isinstance(value, torch.SymInt):
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise InputTypeError(f"input {name!r} must be an int, but got {_describe_object(value)}")
            _check_dim(spec[2], value, name, name, "", seen)


def check_complex_inputs(names: tuple[str, ...], exported: tuple[Any, ...], *values: Any) -> None:
    """The complexness-only check of modules compiled (and pickled) before :func:`check_inputs`."""
    for name, dtype, value in zip(names, exported, values):
        if not isinstance(dtype, torch.dtype) or not isinstance(value, torch.Tensor):
            continue
        if dtype.is_complex != value.is_complex():
            want = "complex" if dtype.is_complex else "real"
            raise InputTypeError(f"input {name!r} must be a {want} tensor (exported as {dtype}), but got {_describe(value)}")


if hasattr(fx.node, "has_side_effect"):  # keeps the checks through dead-code elimination
    fx.node.has_side_effect(check_inputs)
    fx.node.has_side_effect(check_complex_inputs)


# --------------------------------------------------------------------------- the specs
def input_names(gm: fx.GraphModule, count: int) -> list[str]:
    """Each flat input as the caller names it (``x``, ``position_ids``, ``inputs['a']``),
    from the pytree signature; the placeholder names where there is none."""
    placeholders = [p.name for p in input_placeholders(gm)]
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is None or info.in_spec is None or info.in_spec.num_leaves != count:
        return placeholders
    leaves = pytree.tree_unflatten(list(range(count)), info.in_spec)
    names = []
    for path, _ in pytree.tree_flatten_with_path(leaves)[0]:
        if len(path) < 2 or not isinstance(path[0], pytree.SequenceKey):
            return placeholders
        top, rest = path[1], pytree.keystr(path[2:])
        if path[0].idx == 0 and isinstance(top, pytree.SequenceKey):
            args = list(info.orig_args)
            names.append((args[top.idx] if top.idx < len(args) else f"args[{top.idx}]") + rest)
        elif isinstance(top, pytree.MappingKey):
            names.append(f"{top.key}{rest}")
        else:
            return placeholders
    return names


def _source_name(source: Any) -> str:
    name = source.name
    return name() if callable(name) else name


def _symbol_names(values: list[Any]) -> dict[Any, str]:
    """{sympy symbol: the user's name for it (``Dim("b")``)} where the shape env knows it."""
    shape_env = None
    for value in values:
        sizes = value.shape if isinstance(value, torch.Tensor) else [value]
        shape_env = next((s.node.shape_env for s in sizes if isinstance(s, torch.SymInt)), None)
        if shape_env is not None:
            break
    debug = getattr(shape_env, "source_name_to_debug_name", None) or {}
    names: dict[Any, str] = {}
    for symbol, sources in (getattr(shape_env, "var_to_sources", None) or {}).items():
        for source in sources:
            try:
                name = debug.get(_source_name(source))
            except Exception:  # noqa: BLE001 - a source without a name: keep the symbol's
                name = None
            if name and name.isidentifier():
                names[symbol] = name
                break
    return names


def _bounds(expr: Any, range_constraints: dict[Any, Any]) -> tuple[int | None, int | None, str | None]:
    if expr not in range_constraints:
        return None, None, None
    from torch._export.passes.add_runtime_assertions_for_constraints_pass import _convert_range_to_int

    lo, hi = _convert_range_to_int(range_constraints[expr])
    declared = f"[{lo}, {'inf' if hi == math.inf else hi}]"
    # as torch.export: sizes 0 and 1 pass a lower bound of 2 or less (they specialise)
    return (int(lo) if lo > 2 else None), (None if hi == math.inf else int(hi)), declared


def _dim(size: Any, names: dict[Any, str], range_constraints: dict[Any, Any]) -> Any:
    if not isinstance(size, torch.SymInt):
        return int(size)
    expr = size.node.expr
    if expr.is_number:
        return int(expr)
    import sympy

    text = str(expr.xreplace({s: sympy.Symbol(names[s]) for s in expr.free_symbols if s in names}))
    lo, hi, declared = _bounds(expr, range_constraints)
    declared = f"{text} in {declared}" if declared else None
    if len(expr.free_symbols) != 1:
        return (text, None, None, 0, 0, None, None, declared)
    symbol = next(iter(expr.free_symbols))
    a, b = expr.coeff(symbol), expr.subs(symbol, 0)
    if not (a.is_Integer and b.is_Integer and a != 0 and sympy.expand(a * symbol + b - expr) == 0):
        return (text, None, None, 0, 0, None, None, declared)
    root = names.get(symbol, str(symbol))
    if declared is None and symbol in range_constraints:
        declared = f"{root} in {_bounds(symbol, range_constraints)[2]}"
    return (text, str(symbol), root, int(a), int(b), lo, hi, declared)


def input_specs(
    names: list[str], values: list[Any], range_constraints: dict[Any, Any] | None = None
) -> tuple[tuple[Any, ...], ...]:
    """The spec :func:`check_inputs` checks, per flat input: its name and exported value
    (a fake tensor, a SymInt, a constant) with the program's ``range_constraints``."""
    range_constraints = range_constraints or {}
    symbols = _symbol_names(values)
    specs: list[tuple[Any, ...]] = []
    for name, value in zip(names, values):
        if isinstance(value, torch.Tensor):
            dims = tuple(_dim(s, symbols, range_constraints) for s in value.shape)
            shape_text = "[" + ", ".join(str(d) if isinstance(d, int) else d[0] for d in dims) + "]"
            declared = [d[7] for d in dims if not isinstance(d, int) and d[7]]
            ranges_text = ", ".join(dict.fromkeys(declared))
            specs.append(("tensor", name, value.dtype, value.device.type, dims, shape_text, ranges_text))
        elif isinstance(value, torch.SymInt):
            specs.append(("symint", name, _dim(value, symbols, range_constraints)))
        elif isinstance(value, (bool, int, float, str)):
            specs.append(("value", name, value))
        else:
            specs.append(("any", name))
    return tuple(specs)


def _exported_values(ep: torch.export.ExportedProgram, count: int) -> list[Any] | None:
    """The recorded value of each user input of ``ep``, in order (None if they do not line up)."""
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user_inputs = [by_name.get(name) for name in ep.graph_signature.user_inputs]
    if len(user_inputs) != count or any(n is None or "val" not in n.meta for n in user_inputs):
        return None
    return [n.meta["val"] for n in user_inputs]


def add_input_check(
    gm: fx.GraphModule,
    complex_inputs: list[torch.dtype | None],
    exported_program: torch.export.ExportedProgram | None = None,
) -> fx.Node:
    """Insert a :func:`check_inputs` call ahead of everything but the placeholders.

    With ``exported_program`` the specs are its user inputs and ``range_constraints``;
    without, the placeholders' own recorded values (no declared ranges). ``complex_inputs``
    is kept for callers of the complexness-only check: the recorded dtypes say it now.
    """
    placeholders = input_placeholders(gm)
    values = _exported_values(exported_program, len(placeholders)) if exported_program is not None else None
    ranges = dict(exported_program.range_constraints) if values is not None else {}
    if values is None:
        values = [ph.meta.get("val") for ph in placeholders]  # complex again after the input adapters
    specs = input_specs(input_names(gm, len(placeholders)), values, ranges)
    # after the LAST placeholder: a torch.no_grad() region makes ep.module() start with
    # get_attr nodes, so "the first non-placeholder" can come before the inputs
    with gm.graph.inserting_after(placeholders[-1]) if placeholders else gm.graph.inserting_before(next(iter(gm.graph.nodes))):
        node = gm.graph.call_function(check_inputs, (specs, *placeholders))
    gm.recompile()
    return node
