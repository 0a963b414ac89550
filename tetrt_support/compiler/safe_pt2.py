"""Read a ``torch.export.save`` archive without running code from the file.

``torch.export.load`` unpickles tensor artifacts with ``weights_only=False`` when the
safe load fails, unpickles object constants, ``eval``s the symbolic-shape strings (via
``sympy.sympify``) and pastes names, specs and guard strings into generated Python. Here
every piece is read by us: tensors raw or with ``weights_only=True`` (refusing anything
else, never falling back), and every string that torch would evaluate or paste into code
is checked first; then torch's own deserializer builds the program from those pieces.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import io
import json
import re
import threading
import zipfile
from typing import Any

import torch
import torch.fx as fx
from torch._export.serde import schema
from torch._export.serde import serialize as serde
from torch.export.pt2_archive import constants as pt2

__all__ = ["MARKER_FILE", "SerializationError", "read_exported_program"]

MARKER_FILE = "tetrt_support_format"  # in the archive's extra/ folder; holds the format version
_MODEL = "model"
_LOCK = threading.Lock()  # torch's deserializer keeps its state in a module global


class SerializationError(ValueError):
    """A file :func:`tetrt_support.load` refuses: not ours, corrupt, or unsafe to load."""


# ---------------------------------------------------------------------------- strings
_IDENT = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*)?\Z")  # empty: the name of a positional argument of a higher-order op
_TARGET = re.compile(r"[A-Za-z0-9_.:#]+\Z")
_PATH_NAME = re.compile(r"[A-Za-z0-9_.]+\Z")
_SYMPY_STRING = re.compile(r"[A-Za-z0-9_.+\-]*\Z")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # \t and \n are fine in comments
_QUOTE_OR_CONTROL = re.compile(r"[\"'\\\x00-\x1f\x7f]")
_DOUBLE_QUOTE_OR_CONTROL = re.compile(r"[\"\\\x00-\x1f\x7f]")

# Field names of torch._export.serde.schema, by what torch later does with their strings.
_IDENT_FIELDS = {"name", "as_name", "user_input_name", "forward_arg_names", "field_names"}
_IDENT_KEYED = {"tensor_values", "sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values", "range_constraints"}
_FQN_FIELDS = {"parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name", "fqn", "class_fqn"}
_TARGET_FIELDS = {"target", "as_operator"}
_FREE_FIELDS = {"as_string", "as_strings"}  # graph constants: FX writes them with repr()
_FREE_KEYED = {"as_string_to_argument"}
_SPEC_FIELDS = {"in_spec", "out_spec"}  # treespec JSON; dict keys end up inside generated code


def _refuse(where: str, what: str) -> SerializationError:
    return SerializationError(f"{where}: unsafe or corrupt exported program, refused: {what}")


def _check_with(pattern: re.Pattern[str], text: Any, where: str, what: str, *, match: bool) -> None:
    ok = isinstance(text, str) and (bool(pattern.match(text)) if match else not pattern.search(text))
    if not ok:
        raise _refuse(where, f"{what} {str(text)[:80]!r} is not allowed there")


def _check_string(field: str, text: Any, where: str) -> None:
    if field in _IDENT_FIELDS:
        _check_with(_IDENT, text, where, f"name ({field})", match=True)
    elif field in _TARGET_FIELDS:
        _check_with(_TARGET, text, where, "operator name", match=True)
    elif field in _FQN_FIELDS:
        _check_with(_DOUBLE_QUOTE_OR_CONTROL, text, where, f"attribute path ({field})", match=False)
    elif field in _FREE_FIELDS:
        return
    elif field == "expr_str":
        _check_sympy(text, where)
    elif field == "guards_code":
        _check_guard(text, where)
    elif field in _SPEC_FIELDS:
        _check_spec(text, where)
    else:
        _check_with(_DOUBLE_QUOTE_OR_CONTROL, text, where, f"string ({field})", match=False)


def _check_metadata(key: str, value: Any, where: str) -> None:
    _check_with(_IDENT, key, where, "metadata key", match=True)
    if key in ("nn_module_stack", "source_fn_stack"):  # module paths: unflatten writes them into code
        _check_with(_DOUBLE_QUOTE_OR_CONTROL, value, where, f"{key} entry", match=False)
    else:  # stack_trace and the rest: at most a comment line of generated code
        _check_with(_CONTROL_BUT_LINES, value, where, f"{key} entry", match=False)


def _walk(value: Any, field: str, where: str) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for key, item in vars(value).items():
            if not key.startswith("_") and item is not None:
                _walk(item, key, where)
    elif isinstance(value, list):
        for item in value:
            _walk(item, field, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            if field == "metadata":
                _check_metadata(key, item, where)
                continue
            if field in _IDENT_KEYED:
                _check_with(_IDENT, key, where, f"name ({field})", match=True)
            elif field not in _FREE_KEYED:
                _check_string(field, key, where)
            _walk(item, field, where)
    elif isinstance(value, str):
        _check_string(field, value, where)
    elif value is not None and not isinstance(value, (int, float, bool)):
        raise _refuse(where, f"a {type(value).__name__} in field {field!r}")


# ---------------------------------------------------------------------------- expressions
# What torch writes: sympy.srepr of shape expressions, e.g. "Mul(Integer(2), Symbol('s0', integer=True))".
_SYMPY_CALLS = frozenset(
    "Symbol Dummy Integer Rational Float Add Mul Pow Mod Max Min Abs floor ceiling sqrt Eq Ne Lt Le Gt Ge "
    "StrictLessThan StrictGreaterThan LessThan GreaterThan Equality Unequality And Or Not Xor Piecewise "
    "ExprCondPair Tuple IntInfinity NegativeIntInfinity Infinity NegativeInfinity BooleanTrue BooleanFalse "
    "FloorDiv ModularIndexing Where PythonMod CleanDiv CeilToInt FloorToInt CeilDiv LShift RShift PowByNatural "
    "FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator TruncToFloat TruncToInt RoundToInt "
    "RoundDecimal ToFloat Identity".split()
)
_OPERATORS = (ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.expr_context)
_SYMPY_NODES = (ast.Expression, ast.Call, ast.Name, ast.Constant, ast.keyword, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Tuple, *_OPERATORS)
_MAX_EXPR = 20_000


def _parse(text: Any, where: str, what: str) -> ast.Expression:
    if not isinstance(text, str) or len(text) > _MAX_EXPR:
        raise _refuse(where, f"{what} is not a short string")
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise _refuse(where, f"{what} {text[:80]!r} does not parse ({type(error).__name__})") from None


def _check_sympy(text: Any, where: str) -> None:
    """sympify() evals its string: only sympy constructors, names, numbers and operators."""
    for node in ast.walk(_parse(text, where, "shape expression")):
        if not isinstance(node, _SYMPY_NODES):
            bad = type(node).__name__
        elif isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_CALLS):
            bad = f"call of {ast.unparse(node.func)[:40]}"
        elif isinstance(node, ast.keyword) and node.arg is None:
            bad = "**keywords"
        elif isinstance(node, ast.Name) and node.id.startswith("_"):
            bad = f"name {node.id}"
        elif isinstance(node, ast.Constant) and not (
            type(node.value) in (int, float, bool, type(None)) or (isinstance(node.value, str) and _SYMPY_STRING.match(node.value))
        ):
            bad = f"constant {node.value!r:.40}"
        else:
            continue
        raise _refuse(where, f"shape expression {text[:80]!r} contains {bad}")


# What torch writes: "L['x'].size()[0] == 2*L['y'].size()[0]", "(L['x'].size()[0] % 2) == 0"; ep.module()
# pastes each into a function it exec()s and calls on every forward.
_GUARD_FUNCS = frozenset({"IsNonOverlappingAndDenseIndicator", "cast_symbool_to_symint_guardless", "max", "min", "abs", "int", "float", "round", "bool"})
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_GUARD_TORCH = frozenset({"sym_float", "sym_int", "sym_max", "sym_min", "sym_sqrt", "sym_not", "sym_ite", "sym_sum"})
_GUARD_NODES = (*_SYMPY_NODES, ast.Attribute, ast.Subscript, ast.Slice, ast.IfExp, ast.List)


def _guard_callee_ok(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in _GUARD_FUNCS
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("math", "torch"):
        return func.attr in _GUARD_TORCH if func.value.id == "torch" else not func.attr.startswith("_")
    return isinstance(func, ast.Attribute) and func.attr in _GUARD_METHODS


def _check_guard(text: Any, where: str) -> None:
    _check_with(_DOUBLE_QUOTE_OR_CONTROL, text, where, "guard", match=False)  # it is also pasted into "..."
    tree = _parse(text, where, "guard")
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if not isinstance(node, _GUARD_NODES):
            bad = type(node).__name__
        elif isinstance(node, ast.Call) and not _guard_callee_ok(node.func):
            bad = f"call of {ast.unparse(node.func)[:40]}"
        elif isinstance(node, ast.Attribute) and id(node) not in callees and not (
            isinstance(node.value, ast.Name) and node.value.id == "math" and not node.attr.startswith("_")
        ):
            bad = f"attribute {node.attr}"
        elif isinstance(node, ast.keyword) and node.arg is None:
            bad = "**keywords"
        elif isinstance(node, ast.Name) and node.id.startswith("_"):
            bad = f"name {node.id}"
        elif isinstance(node, ast.Constant) and type(node.value) not in (int, float, bool, str, type(None)):
            bad = f"constant {node.value!r:.40}"
        else:
            continue
        raise _refuse(where, f"guard {text[:80]!r} contains {bad}")


def _check_spec(text: Any, where: str) -> None:
    """A treespec (JSON, its contexts JSON again): no quotes or backslashes in any string."""

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                if key == "context" and isinstance(item, str):
                    try:
                        item = json.loads(item)
                    except ValueError:
                        pass
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str):
            _check_with(_QUOTE_OR_CONTROL, value, where, "input/output structure key", match=False)

    try:
        decoded = json.loads(text)
    except (TypeError, ValueError, RecursionError) as error:
        raise _refuse(where, f"input/output structure is not JSON ({type(error).__name__})") from None
    walk(decoded)


# ---------------------------------------------------------------------------- graph targets
@functools.cache
def _allowed_functions() -> frozenset[Any]:
    """The Python functions torch's export verifier lets a graph call (its _check_valid_op)."""
    from torch._export.verifier import Verifier
    from torch.fx.experimental.symbolic_shapes import cast_symbool_to_symint_guardless

    found = set(Verifier().allowed_builtin_ops()) | set(serde._SYM_OPS)
    found |= {
        torch.autograd.grad_mode.set_grad_enabled,
        torch._C._set_grad_enabled,
        torch.amp.autocast_mode._enter_autocast,
        torch.amp.autocast_mode._exit_autocast,
        cast_symbool_to_symint_guardless,
        *(getattr(torch, name) for name in ("sym_int", "sym_float", "sym_ite", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_sum")),
    }
    return frozenset(found)


def _allowed_callable(obj: Any) -> bool:
    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator)):
        return True
    extensions = serde._registered_extension_types()
    if extensions and isinstance(obj, extensions):
        return True
    try:
        if obj in _allowed_functions():
            return True
    except TypeError:  # unhashable
        return False
    return getattr(obj, "__module__", None) == "torch._functorch.predispatch"  # vmap/jvp markers of pre-dispatch graphs


def _check_graphs(program: torch.export.ExportedProgram, where: str) -> None:
    """Every call in every graph is an operator, never an arbitrary Python function."""
    for module in program.graph_module.modules():
        if not isinstance(module, fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op in ("call_module", "call_method") or (node.op == "call_function" and not _allowed_callable(node.target)):
                raise _refuse(where, f"graph node {node.name} calls {node.target!r}, not an operator")

            def check_arg(arg: Any, node: fx.Node = node) -> Any:
                if callable(arg) and not isinstance(arg, (fx.Node, torch.nn.Module)) and not _allowed_callable(arg):
                    raise _refuse(where, f"graph node {node.name} takes {arg!r} as an argument")
                return arg

            fx.node.map_aggregate((node.args, node.kwargs), check_arg)


# ---------------------------------------------------------------------------- tensors
def _safe_torch_load(data: bytes, where: str, what: str) -> Any:
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as error:  # noqa: BLE001 - refused whatever the reason; never retried unsafely
        text = str(error)
        lines = [line for line in text.splitlines() if line.strip()]
        found = [line for line in lines if "unsupported" in line.lower()]  # "...unsupported GLOBAL posix.system..."
        reason = (found or lines or [""])[0][:160]
        raise SerializationError(
            f"{where}: unsafe or corrupt exported program, refused: {what} cannot be read with "
            f"torch.load(weights_only=True) ({type(error).__name__}: {reason}), and anything else would unpickle "
            f"code from the file"
        ) from None


class _Archive:
    def __init__(self, archive: zipfile.ZipFile, root: str, where: str) -> None:
        self.archive, self.root, self.where = archive, root, where
        self.names = {name[len(root):] for name in archive.namelist()}

    def has(self, name: str) -> bool:
        return name in self.names

    def read(self, name: str) -> bytes:
        if name not in self.names:
            raise SerializationError(f"{self.where}: truncated or corrupt archive, {name} is missing")
        return self.archive.read(self.root + name)  # checks the CRC

    def text(self, name: str) -> str:
        try:
            return self.read(name).decode("utf-8")
        except UnicodeDecodeError:
            raise SerializationError(f"{self.where}: truncated or corrupt archive, {name} is not text") from None

    def payload_config(self, name: str) -> schema.PayloadConfig:
        config = serde._dict_to_dataclass(schema.PayloadConfig, json.loads(self.text(name)))
        for fqn, meta in config.config.items():
            _check_with(_DOUBLE_QUOTE_OR_CONTROL, fqn, self.where, "state name", match=False)
            _check_with(_PATH_NAME, meta.path_name, self.where, "payload file name", match=True)
            if meta.tensor_meta is not None:
                _walk(meta.tensor_meta, "tensor_meta", self.where)
        return config


def _raw_tensor(archive: _Archive, base_dir: str, meta: schema.PayloadMeta) -> torch.Tensor:
    tensor_meta = meta.tensor_meta
    if tensor_meta is None:
        raise SerializationError(f"{archive.where}: truncated or corrupt archive, {meta.path_name} has no tensor_meta")
    dtype = serde.deserialize_scalar_type(tensor_meta.dtype)
    device = serde.deserialize_device(tensor_meta.device)
    data = archive.read(base_dir + meta.path_name)
    if not data:
        tensor = torch.zeros(serde.deserialize_size(tensor_meta.sizes), dtype=dtype)
    else:
        element = torch._utils._element_size(dtype)
        if len(data) % element:
            raise SerializationError(f"{archive.where}: truncated or corrupt archive, {meta.path_name} has a partial element")
        tensor = torch.frombuffer(bytearray(data), dtype=dtype)
    if tensor_meta.requires_grad:
        tensor.requires_grad_(True)
    return tensor if device == torch.device("cpu") else tensor.to(device)


def _tensors(archive: _Archive, config_name: str, base_dir: str, legacy: str, what: str) -> dict[str, Any]:
    """torch's _load_state_dict / _load_constants, with no pickle but weights_only."""
    if archive.has(legacy):
        loaded = _safe_torch_load(archive.read(legacy), archive.where, what)
        if not isinstance(loaded, dict):
            raise SerializationError(f"{archive.where}: truncated or corrupt archive, {legacy} is not a dict")
        return loaded
    config = archive.payload_config(config_name)
    bases: dict[str, torch.Tensor] = {}  # one storage per file: aliasing tensors stay aliased
    out: dict[str, Any] = {}
    for fqn, meta in config.config.items():
        path = meta.path_name
        if path.startswith((pt2.CUSTOM_OBJ_FILENAME_PREFIX, pt2.OPAQUE_OBJ_FILENAME_PREFIX)):
            raise _refuse(
                archive.where,
                f"constant {fqn!r} is a TorchBind/opaque object, which only unpickling (running code from the file) "
                f"can rebuild; use torch.export.load only on such a file you trust",
            )
        if base_dir == pt2.CONSTANTS_DIR and not path.startswith(pt2.TENSOR_CONSTANT_FILENAME_PREFIX):
            raise SerializationError(f"{archive.where}: truncated or corrupt archive, unknown constant file {path!r}")
        if meta.use_pickle:
            value = _safe_torch_load(archive.read(base_dir + path), archive.where, f"{what} {fqn!r}")
            if not isinstance(value, torch.Tensor):
                raise _refuse(archive.where, f"{what} {fqn!r} is a {type(value).__name__}, not a tensor")
            out[fqn] = value
            continue
        if path not in bases:
            bases[path] = _raw_tensor(archive, base_dir, meta)
        tensor_meta = meta.tensor_meta
        tensor = torch.as_strided(
            bases[path],
            size=serde.deserialize_size(tensor_meta.sizes),
            stride=serde.deserialize_stride(tensor_meta.strides),
            storage_offset=serde.deserialize_storage_offset(tensor_meta.storage_offset),
        )
        out[fqn] = torch.nn.Parameter(tensor, requires_grad=tensor_meta.requires_grad) if meta.is_param else tensor
    return out


def _sample_inputs(archive: _Archive) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    name = pt2.SAMPLE_INPUTS_FILENAME_FORMAT.format(_MODEL)
    data = archive.read(name) if archive.has(name) else b""
    if not data:
        return None
    inputs = _safe_torch_load(data, archive.where, "the sample inputs")
    if not (isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], tuple) and isinstance(inputs[1], dict)):
        raise _refuse(archive.where, f"sample inputs are a {type(inputs).__name__}, not (args, kwargs)")
    return inputs


# ---------------------------------------------------------------------------- entry point
def read_exported_program(archive: zipfile.ZipFile, root: str, where: str, expected_format: str) -> torch.export.ExportedProgram:
    """The ``"model"`` program of a torch.export.save archive whose records live under ``root``."""
    files = _Archive(archive, root, where)
    if files.text(pt2.ARCHIVE_FORMAT_PATH).strip() != pt2.ARCHIVE_FORMAT_VALUE:
        raise SerializationError(f"{where}: not a tetrt_support file (an archive, but not of torch.export.save's format)")
    version = files.text(pt2.ARCHIVE_VERSION_PATH).strip()
    if version != pt2.ARCHIVE_VERSION_VALUE:
        raise SerializationError(
            f"{where}: torch.export archive version {version[:20]!r}; this torch reads {pt2.ARCHIVE_VERSION_VALUE!r}"
        )
    marker = pt2.EXTRA_DIR + MARKER_FILE
    if files.has(marker) and files.text(marker).strip() != expected_format:
        raise SerializationError(
            f"{where}: written in format {files.text(marker).strip()[:60]!r}; this tetrt_support reads {expected_format!r}"
        )
    model = pt2.MODELS_FILENAME_FORMAT.format(_MODEL)
    if not files.has(model):
        raise SerializationError(f"{where}: not a tetrt_support file (a torch.export archive without a {_MODEL!r} program)")
    serialized = serde._dict_to_dataclass(schema.ExportedProgram, json.loads(files.text(model)))
    if not isinstance(serialized, schema.ExportedProgram):
        raise SerializationError(f"{where}: truncated or corrupt archive, {model} is not a program")
    major = serialized.schema_version.major
    if major != schema.SCHEMA_VERSION[0] and not (major == 0 and serialized.schema_version.minor == 0):
        raise SerializationError(
            f"{where}: exported-program schema {major}.{serialized.schema_version.minor}; this torch reads "
            f"{schema.SCHEMA_VERSION[0]}.x"
        )
    _walk(serialized, "program", where)
    state_dict = _tensors(
        files, pt2.WEIGHTS_CONFIG_FILENAME_FORMAT.format(_MODEL), pt2.WEIGHTS_DIR, f"{pt2.WEIGHTS_DIR}{_MODEL}.pt", "weight"
    )
    constants = _tensors(
        files, pt2.CONSTANTS_CONFIG_FILENAME_FORMAT.format(_MODEL), pt2.CONSTANTS_DIR, f"{pt2.CONSTANTS_DIR}{_MODEL}.pt", "constant"
    )
    inputs = _sample_inputs(files)
    with _LOCK:
        program = serde.ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, inputs)
    if not isinstance(program, torch.export.ExportedProgram):
        raise SerializationError(f"{where}: truncated or corrupt archive, it did not give an ExportedProgram")
    _check_graphs(program, where)
    return program
