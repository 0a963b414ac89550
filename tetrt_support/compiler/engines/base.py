"""What an engine is, and the block facts every engine needs.

An *engine block* is an ``fx.GraphModule`` of ATen ops cut out of an exported graph by
the partitioner. An engine decides which nodes it can take (``supports``) and turns a
block into a runnable, picklable ``nn.Module`` (``build``). The partitioner never needs
to know how: eager runs the graph, inductor compiles it, ONNX Runtime exports and runs
it, TensorRT (on GPU machines only) builds an engine.
"""

from __future__ import annotations

import abc
import copy
from typing import Any

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from tetrt_support.complex.detect import touches_complex

try:  # torch >= 2.4: the integer infinity of symbolic shapes
    from torch.utils._sympy.numbers import int_oo as _INT_OO
except ImportError:  # pragma: no cover
    _INT_OO = None

__all__ = [
    "COMPLEX_OPS",
    "DynamicDims",
    "Engine",
    "NoBackwardError",
    "refuse_gradient_inputs",
    "check_block_inputs",
    "check_dynamic_dims",
    "dynamic_shapes_for_export",
    "is_int_input",
    "is_complex_work",
    "linear_in_one_symbol",
    "keep_scalars_0d",
    "scalar_outputs",
    "standalone_block",
    "attribute_at",
]

# dynamic_dims[i] maps a dim index of input i to a symbol name; one name = one symbol.
# A name of the form "a*s + b" (integers a, b; one symbol s) is a dim derived from s.
DynamicDims = list[dict[int, str]]


def linear_in_one_symbol(expr: Any) -> tuple[sympy.Symbol, int, int] | None:
    """``(s, a, b)`` if ``expr`` is ``a*s + b`` with integers ``a >= 1`` and ``b``, else None."""
    if not isinstance(expr, sympy.Expr) or len(expr.free_symbols) != 1:
        return None
    (symbol,) = expr.free_symbols
    a, b = expr.coeff(symbol, 1), expr.coeff(symbol, 0)
    if not (a.is_Integer and b.is_Integer and a >= 1) or sympy.expand(a * symbol + b - expr) != 0:
        return None
    return symbol, int(a), int(b)


def _derived(name: str) -> tuple[str, int, int] | None:
    """``(root name, a, b)`` for a dim named ``"a*s + b"``; None for a plain name."""
    if name.isidentifier():
        return None
    try:
        found = linear_in_one_symbol(sympy.sympify(name))
    except (sympy.SympifyError, TypeError, SyntaxError):
        return None
    return None if found is None else (str(found[0]), found[1], found[2])

_aten = torch.ops.aten
# Ops whose whole point is a complex value: no engine without complex dtypes takes them,
# whatever dtypes the metadata says (a block may have been traced without metadata).
COMPLEX_OPS: frozenset[Any] = frozenset(
    op
    for op in (
        _aten.view_as_complex.default,
        _aten.view_as_real.default,
        _aten.polar.default,
        _aten.complex.default,
        _aten._conj.default,
        _aten.conj.default,
        _aten.conj_physical.default,
        _aten.real.default,
        _aten.imag.default,
        getattr(_aten, "view_as_complex_copy", None) and _aten.view_as_complex_copy.default,
        getattr(_aten, "view_as_real_copy", None) and _aten.view_as_real_copy.default,
    )
    if op
)


def is_complex_work(node: fx.Node) -> bool:
    """Whether an engine without complex dtypes must refuse ``node``: a complex op by its
    target (judged even without metadata: a block may have been traced without it), or a
    node that touches a complex value (:func:`tetrt_support.complex.detect.touches_complex`)."""
    return node.target in COMPLEX_OPS or touches_complex(node)


def _finite_int(value: Any) -> int | None:
    """``value`` as an int, or None for an infinite bound (sympy's oo or torch's int_oo)."""
    if _INT_OO is not None and value in (_INT_OO, -_INT_OO):
        return None
    return int(value) if isinstance(value, (int, sympy.Integer)) else None


def _recorded_bounds(
    block: fx.GraphModule | None, index: int, dim: int, root: bool = False
) -> tuple[int | None, int | None]:
    """The (min, max) the block's trace proved for input ``index``'s ``dim``, if it recorded one
    (``root=True``: for the symbol the dim's size is derived from).

    A block cut from an exported program inherits its ranges (e.g. ``seq <= 256`` because a
    rotary table has 256 rows); exporting the block without them fails with a constraint
    violation, and torch.onnx.export would silently retry with another capture strategy.
    """
    if block is None:
        return None, None
    placeholders = [n for n in block.graph.nodes if n.op == "placeholder"]
    val = placeholders[index].meta.get("val") if index < len(placeholders) else None
    size = val.shape[dim] if isinstance(val, torch.Tensor) and -val.dim() <= dim < val.dim() else None
    if not isinstance(size, torch.SymInt):
        return None, None
    expr = size.node.expr
    if root:
        found = linear_in_one_symbol(expr)
        if found is None:
            return None, None
        expr = found[0]
    bounds = size.node.shape_env.bound_sympy(expr)
    return _finite_int(bounds.lower), _finite_int(bounds.upper)


def dynamic_shapes_for_export(
    example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None, block: fx.GraphModule | None = None
) -> tuple[dict[int, Any] | None, ...] | None:
    """``dynamic_dims`` as torch.export ``dynamic_shapes``: one ``Dim`` object per name.

    Reusing one ``Dim`` for one name tells export the dims are equal; its bounds are the
    ones ``block``'s metadata recorded for that symbol, if any. torch.export specializes
    sizes 0 and 1, so an example input must be at least 2 along a dynamic dim. A name
    ``"a*s + b"`` becomes ``Dim(s) * a + b`` (a derived dim, tied to every other use of
    ``s``: a wave of ``hop * frames`` samples beside its ``frames`` features). An int
    input (a size the block receives) is always ``Dim.DYNAMIC``.
    """
    ints = [is_int_input(x) for x in example_inputs]
    if not dynamic_dims and not any(ints):
        return None
    check_dynamic_dims(example_inputs, dynamic_dims)
    dynamic_dims = dynamic_dims or [{} for _ in example_inputs]
    symbols: dict[str, Any] = {}
    shapes: list[Any] = []
    for i, (x, dims) in enumerate(zip(example_inputs, dynamic_dims)):
        if ints[i]:  # a SymInt block input: export must not bake its example value in
            shapes.append(torch.export.Dim.DYNAMIC)
            continue
        if not dims:
            shapes.append(None)
            continue
        entry = {}
        for dim, name in dims.items():
            if not isinstance(x, torch.Tensor) or not -x.dim() <= dim < x.dim():
                raise ValueError(f"dynamic_dims[{i}] names dim {dim}, but input {i} is {_describe(x)}")
            if x.shape[dim] < 2:
                raise ValueError(
                    f"dynamic_dims[{i}] makes dim {dim} ({name!r}) dynamic, but the example input has "
                    f"size {x.shape[dim]} there; torch.export specializes sizes 0 and 1: use an "
                    f"example of size >= 2"
                )
            derived = _derived(name)
            if derived is not None:  # a*s + b: export relates it to s (and to other uses of s)
                root, a, b = derived
                if root not in symbols:
                    low, high = _recorded_bounds(block, i, dim, root=True)
                    bounds = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
                    symbols[root] = torch.export.Dim(root, **bounds)
                entry[dim % x.dim()] = symbols[root] * a + b if a != 1 else symbols[root] + b
                continue
            if name not in symbols:
                low, high = _recorded_bounds(block, i, dim)
                bounds = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
                symbols[name] = torch.export.Dim(name, **bounds)
            entry[dim % x.dim()] = symbols[name]
        shapes.append(entry)
    return tuple(shapes)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"a {type(x).__name__}"


def attribute_at(module: torch.nn.Module, target: str) -> Any:
    """What a ``get_attr`` node with ``target`` (a dotted path) reads from ``module``."""
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def standalone_block(block: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``block`` holding only what its graph uses, so it pickles.

    make_fx leaves tracer state on the module it returns (``shape_env``, which does not
    pickle); a fresh GraphModule over a copy of the graph keeps the submodules, parameters
    and constants the graph reads, shares their tensors, and leaves the caller's block alone.
    """
    graph = fx.Graph()
    graph._codegen = copy.deepcopy(block.graph._codegen)
    graph.output(graph.graph_copy(block.graph, {}))
    return fx.GraphModule(block, graph, class_name=type(block).__name__)


def scalar_outputs(block: fx.GraphModule) -> list[bool]:
    """Per flat output of ``block``: whether its recorded value is a 0-d tensor."""
    leaves = pytree.tree_leaves(block.graph.output_node().args[0])
    return [
        isinstance(leaf, fx.Node) and isinstance(leaf.meta.get("val"), torch.Tensor) and leaf.meta["val"].dim() == 0
        for leaf in leaves
    ]


def keep_scalars_0d(outputs: Any, scalars: list[bool]) -> Any:
    """``outputs`` with each one-element tensor that should be 0-d (``scalars``) made 0-d
    again: an engine that widens a scalar to shape ``(1,)`` must not change the block's shapes."""
    leaves, spec = pytree.tree_flatten(outputs)
    if len(leaves) != len(scalars):
        return outputs
    fixed = [
        leaf.reshape(()) if zero_d and isinstance(leaf, torch.Tensor) and leaf.dim() == 1 and leaf.numel() == 1 else leaf
        for leaf, zero_d in zip(leaves, scalars)
    ]
    return pytree.tree_unflatten(fixed, spec)


class NoBackwardError(RuntimeError):
    """An engine block without autograd reached by an input that needs a gradient."""


def refuse_gradient_inputs(engine: str, names: list[str | None], inputs: tuple[Any, ...]) -> None:
    """Refuse, naming the input, a call that would return outputs silently cut off from
    autograd: grad mode on and an input that requires grad, into an engine with no
    backward (ONNX Runtime, TensorRT). Inputs named None are constants to the engine (its
    weights, values computed from weights), as in Torch-TensorRT, and are not checked."""
    if not torch.is_grad_enabled():
        return
    for name, x in zip(names, inputs):
        if name is not None and isinstance(x, torch.Tensor) and x.requires_grad:
            raise NoBackwardError(
                f"{engine} block input {name!r} requires grad, but the {engine} engine has no backward: its "
                "outputs would carry no gradient. Call the compiled module under torch.no_grad() (or pass "
                "tensors that do not require grad), or compile with an engine that has autograd "
                "(backend='eager' or 'inductor')"
            )


def check_dynamic_dims(example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None) -> None:
    """One dict of dynamic dims (possibly empty) per block input, or none at all."""
    if dynamic_dims is not None and len(dynamic_dims) != len(example_inputs):
        raise ValueError(
            f"dynamic_dims has {len(dynamic_dims)} entries but the block has "
            f"{len(example_inputs)} inputs; give one dict (possibly empty) per input"
        )


def is_int_input(x: Any) -> bool:
    """A Python int block input: what a SymInt crossing a block boundary is at run time."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_block_inputs(engine: str, example_inputs: list[Any]) -> None:
    """Blocks take flat tensors and ints (sizes made outside the block, e.g. by ``.item()``
    in a fallback block); each engine takes an int its own way (ONNX Runtime: a 0-d int64)."""
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor) and not is_int_input(x):
            raise TypeError(
                f"{engine} engine: block input {i} is {_describe(x)}; engine blocks take tensors and "
                f"ints (sizes) only"
            )


def check_ints_stayed_symbolic(engine: str, exported: torch.export.ExportedProgram, example_inputs: list[Any]) -> None:
    """Raise if export specialised an int block input to its example value (it does for 0
    and 1): the engine would return that size's result for every size."""
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder" and n.meta.get("val") is not None]
    user_inputs = placeholders[-len(example_inputs):] if example_inputs else []
    for i, (x, node) in enumerate(zip(example_inputs, user_inputs)):
        val = node.meta["val"]
        symbolic = isinstance(val, torch.SymInt) and bool(val.node.expr.free_symbols)
        if is_int_input(x) and not symbolic:
            raise ValueError(
                f"{engine} engine: block input {i} (an int, {x} in the example) was specialised by "
                f"torch.export to its example value; the block would be wrong for other sizes"
            )


class Engine(abc.ABC):
    """An engine: which ATen nodes it takes, and how it turns a block into a module.

    ``supports`` judges one node of an ATen graph: only ``call_function`` nodes, never
    complex work for an engine without complex dtypes (``complex_dtypes = False``), and
    then the engine's own op-level answer, :meth:`supports_op` (the partitioner checks
    dtypes separately). ``build`` checks the block inputs the same way for every engine,
    then calls :meth:`build_block`, which returns a picklable module whose
    ``forward(*flat_tensors)`` returns what the block returns, with the same structure
    and shapes (a 0-d tensor stays 0-d), and whose ``as_pytorch()`` returns the ATen graph
    it was built from (what a saved program runs in its place).
    """

    name: str
    #: False for engines without complex arithmetic (TensorRT, ONNX Runtime)
    complex_dtypes: bool = True

    def supports(self, node: fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if not self.complex_dtypes and is_complex_work(node):
            return False
        return self.supports_op(node)

    def supports_op(self, node: fx.Node) -> bool:
        """Whether the engine implements ``node``'s op (a real-valued ``call_function``)."""
        return True

    def build(
        self,
        block: fx.GraphModule,
        example_inputs: list[torch.Tensor],
        dynamic_dims: DynamicDims | None = None,
    ) -> torch.nn.Module:
        """A runnable module for ``block``; ``dynamic_dims[i]`` names input ``i``'s dynamic dims."""
        check_block_inputs(self.name, example_inputs)
        check_dynamic_dims(example_inputs, dynamic_dims)
        built = self.build_block(block, example_inputs, dynamic_dims)
        if not callable(getattr(built, "as_pytorch", None)):
            raise TypeError(
                f"{self.name} engine: build_block returned a {type(built).__name__} without as_pytorch(); "
                f"every engine block keeps the graph it was built from"
            )
        return built

    @abc.abstractmethod
    def build_block(
        self, block: fx.GraphModule, example_inputs: list[torch.Tensor], dynamic_dims: DynamicDims | None
    ) -> torch.nn.Module:
        """The engine's own build step, on inputs :meth:`build` has checked."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
