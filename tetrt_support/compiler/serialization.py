"""Save and load compiled modules without losing their call signature.

:func:`save` writes ``output_format`` ``"exported_program"`` (default), ``"aot_inductor"`` or
``"pickle"`` (``"torchscript"`` is refused); :func:`load` reads them back and runs code from
a file only with ``trusted=True``. The pickle format stores each ``fx.GraphModule`` as its
graph and codegen, so keyword inputs and structured outputs survive. Why not plain
``torch.save``, and what is not kept: ``docs/architecture.md`` ("Module notes", Saving).
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import pickletools
import sys
import types
import warnings
import zipfile
from collections import OrderedDict, defaultdict, deque
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.export.pt2_archive import constants as _pt2_constants

from tetrt_support.compiler.safe_pt2 import MARKER_FILE, SerializationError, read_exported_program
from tetrt_support.complex.detect import GUARDS_FN, is_guards_call

__all__ = [
    "FORMAT",
    "OUTPUT_FORMATS",
    "MissingSignatureType",
    "SerializationError",
    "UnsupportedOutputFormat",
    "UntrustedNativeCode",
    "UntrustedPickle",
    "load",
    "save",
]

FORMAT = "tetrt_support.serialization/1"

# Rebuilt on load from the graph and codegen; never pickled.
_REGENERATED = ("_graph", "_code", "_lineno_map", "_prologue_start", "_in_spec", "_out_spec")
# Tracer state left on make_fx results; does not pickle and nothing reads it after tracing.
_TRACER_STATE = ("shape_env",)
_BUILTIN_CONTAINERS = (tuple, list, dict, OrderedDict, defaultdict, deque, type(None))


class MissingSignatureType(ImportError):
    """A type named in a saved module's call signature cannot be found or is not registered."""


class UntrustedPickle(SerializationError):
    """A pickle-format file loaded without ``trusted=True``: unpickling it could run its code."""


class UntrustedNativeCode(SerializationError):
    """An AOTInductor package loaded without ``trusted=True``: loading runs its shared library."""


class UnsupportedOutputFormat(ValueError):
    """An ``output_format`` Torch-TensorRT names that this package cannot write, and why."""


# ---------------------------------------------------------------------------- targets
class _OpRef:
    """An ATen/custom op by name: OpOverload objects themselves do not pickle."""

    def __init__(self, namespace: str, name: str, overload: str | None) -> None:
        self.namespace, self.name, self.overload = namespace, name, overload

    def resolve(self) -> Any:
        try:
            op = getattr(getattr(torch.ops, self.namespace), self.name)
            return op if self.overload is None else getattr(op, self.overload)
        except AttributeError as error:
            raise RuntimeError(
                f"saved graph calls torch.ops.{self.namespace}.{self.name}"
                f"{'' if self.overload is None else '.' + self.overload}, which this process does not "
                f"define (load the library that registers it first)"
            ) from error


def _encode_target(target: Any) -> Any:
    if isinstance(target, torch._ops.OpOverload):
        return _OpRef(target.namespace, target._opname, target._overloadname)
    if isinstance(target, torch._ops.OpOverloadPacket):
        namespace, name = target._qualified_op_name.split("::")
        return _OpRef(namespace, name, None)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return _OpRef("higher_order", target.name(), None)
    return target  # a string (call_module/get_attr/placeholder) or an importable function


class _NodeRef:
    def __init__(self, name: str) -> None:
        self.name = name


# ---------------------------------------------------------------------------- signature types
def _spec_types(spec: pytree.TreeSpec) -> list[type]:
    """User classes a spec names: a node type (dataclass, ModelOutput), or the class kept as
    the context of a namedtuple / structseq node (whose node type is a shared sentinel)."""
    found = [
        t
        for t in (spec.type, spec.context)
        if isinstance(t, type) and t not in _BUILTIN_CONTAINERS and t.__module__ != "builtins"
    ]
    children = spec.children() if callable(getattr(spec, "children", None)) else spec.children_specs
    for child in children:
        found += _spec_types(child)
    return found


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _codegen_types(codegen: Any) -> list[type]:
    info = getattr(codegen, "pytree_info", None)
    if info is None:
        return []
    found: list[type] = []
    for spec in (info.in_spec, info.out_spec):
        if spec is not None:
            found += [t for t in _spec_types(spec) if t not in found]
    return found


def _check_savable_type(cls: type) -> None:
    if "<locals>" in cls.__qualname__:
        raise TypeError(
            f"cannot save: the call signature uses {_type_name(cls)}, a class defined inside a function; "
            f"load could never import it again. Define it at module level"
        )


def _find_type(module: str, qualname: str) -> type:
    name = f"{module}.{qualname}"
    try:
        obj: Any = sys.modules.get(module) or importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as error:
        raise MissingSignatureType(
            f"cannot load: the saved call signature uses {name}, which cannot be imported here "
            f"({type(error).__name__}: {error}). Import or define it (same module, same name) before load()"
        ) from error
    return obj


def _check_registered(cls: type) -> None:
    if cls in pytree.SUPPORTED_NODES or pytree.is_namedtuple_class(cls):
        return
    raise MissingSignatureType(
        f"cannot load: the saved call signature uses {_type_name(cls)}, which is not registered with "
        f"torch.utils._pytree in this process; register it (e.g. torch.utils._pytree.register_dataclass) "
        f"before load()"
    )


# ---------------------------------------------------------------------------- hooks and methods
def _is_inert_export_hook(hook: Any) -> bool:
    """torch.export's enter/exit hooks for nn.Module graph inputs, when there are none.

    ``_create_stateful_graph_module`` wraps them in lambdas (unpicklable) closing over the
    set of nn.Module input types; with an empty set they do nothing.
    """
    if "_create_stateful_graph_module.<locals>" not in getattr(hook, "__qualname__", ""):
        return False
    cells = [c.cell_contents for c in (getattr(hook, "__closure__", None) or ())]
    return all(isinstance(c, (set, frozenset, list, tuple, dict)) and not c for c in cells)


def _train_unsupported(self: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
    raise NotImplementedError("Calling train() is not supported yet.")


def _eval_unsupported(self: torch.nn.Module) -> torch.nn.Module:
    raise NotImplementedError("Calling eval() is not supported yet.")


def _is_export_train_eval(value: Any) -> bool:
    """``ep.module()`` replaces train/eval by local functions that raise; we recreate them."""
    func = getattr(value, "__func__", None)
    return "ExportedProgram.module.<locals>" in getattr(func, "__qualname__", "")


def _picklable_hooks(gm: fx.GraphModule, state: dict[str, Any]) -> None:
    for hooks_key, companions in (
        ("_forward_pre_hooks", ("_forward_pre_hooks_with_kwargs",)),
        ("_forward_hooks", ("_forward_hooks_with_kwargs", "_forward_hooks_always_called")),
    ):
        kept = OrderedDict()
        for handle, hook in state.get(hooks_key, {}).items():
            if _is_inert_export_hook(hook):
                continue
            try:
                pickle.dumps(hook)
            except Exception as error:  # noqa: BLE001 - any pickling failure: say which hook
                raise TypeError(
                    f"cannot save: {type(gm).__name__} has a {hooks_key[1:]} entry "
                    f"{getattr(hook, '__qualname__', hook)!r} that cannot be pickled ({error})"
                ) from error
            kept[handle] = hook
        state[hooks_key] = kept
        for key in companions:
            state[key] = OrderedDict((h, v) for h, v in state.get(key, {}).items() if h in kept)


# ---------------------------------------------------------------------------- graph modules
def _user_class(gm: fx.GraphModule) -> type:
    """The class a user named (GraphModule.__new__ makes one private subclass per instance)."""
    for cls in type(gm).__mro__:
        if cls.__qualname__.split(".")[-1] != "GraphModuleImpl":
            return cls
    return fx.GraphModule


def _pack_graph_module(gm: fx.GraphModule) -> tuple[Any, ...]:
    graph = gm.graph
    types_ = _codegen_types(graph._codegen)
    for cls in types_:
        _check_savable_type(cls)
    nodes = []
    for node in graph.nodes:
        if is_guards_call(node):
            continue  # returns None, read by nobody; see the module docstring
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: _NodeRef(n.name))
        meta = {"stack_trace": node.meta["stack_trace"]} if node.meta.get("stack_trace") else {}
        nodes.append((node.op, node.name, _encode_target(node.target), args, kwargs, meta))

    state = {k: v for k, v in gm.__dict__.items() if k not in _REGENERATED + _TRACER_STATE}
    state["_modules"] = {k: v for k, v in state["_modules"].items() if k != GUARDS_FN}
    recreate = sorted(k for k in ("train", "eval") if _is_export_train_eval(state.get(k)))
    for k in recreate:
        del state[k]
    _picklable_hooks(gm, state)
    codegen = pickle.dumps(graph._codegen)  # its spec types are checked before this is loaded
    signature = [(cls.__module__, cls.__qualname__) for cls in types_]
    return (_user_class(gm), state, nodes, codegen, signature, recreate)


def _rebuild_graph_module(
    cls: type,
    state: dict[str, Any],
    nodes: list[tuple[Any, ...]],
    codegen: bytes,
    signature: list[tuple[str, str]],
    recreate: list[str],
) -> fx.GraphModule:
    for cls_ref in (_find_type(module, qualname) for module, qualname in signature):
        _check_registered(cls_ref)
    graph = fx.Graph()
    with warnings.catch_warnings():
        # torch 2.11 warns while unpickling its own LeafSpec: not something a user can act on.
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        graph._codegen = pickle.loads(codegen)
    by_name: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs, meta in nodes:
        if isinstance(target, _OpRef):
            target = target.resolve()
        args, kwargs = _map_refs((args, kwargs), by_name)
        node = graph.create_node(op, target, args, kwargs, name=name)
        if node.name != name:
            raise RuntimeError(f"saved graph has two nodes named {name!r}")
        node.meta.update(meta)
        by_name[name] = node
    gm = cls.__new__(cls)
    gm.__dict__.update(state)
    gm.graph = graph  # recompiles: forward, _in_spec and _out_spec come back from the codegen
    methods = {"train": _train_unsupported, "eval": _eval_unsupported}
    for name in recreate:
        setattr(gm, name, types.MethodType(methods[name], gm))
    return gm


def _map_refs(value: Any, by_name: dict[str, fx.Node]) -> Any:
    if isinstance(value, _NodeRef):
        return by_name[value.name]
    if isinstance(value, tuple):
        mapped = [_map_refs(v, by_name) for v in value]
        return type(value)(*mapped) if hasattr(value, "_fields") else tuple(mapped)
    if isinstance(value, list):
        return [_map_refs(v, by_name) for v in value]
    if isinstance(value, dict):
        return type(value)((k, _map_refs(v, by_name)) for k, v in value.items())
    if isinstance(value, slice):
        return slice(*(_map_refs(v, by_name) for v in (value.start, value.stop, value.step)))
    return value


class _GraphAsNodesPickler(pickle.Pickler):
    """Pickles every fx.GraphModule as node records instead of code to retrace."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, fx.GraphModule):
            return _rebuild_graph_module, _pack_graph_module(obj)
        return NotImplemented


class _PickleModule:
    """What ``torch.save(pickle_module=...)`` needs: our Pickler, the standard rest."""

    Pickler = _GraphAsNodesPickler
    Unpickler = pickle.Unpickler
    load = staticmethod(pickle.load)
    dump = staticmethod(pickle.dump)
    __name__ = "tetrt_support.compiler.serialization"


# ---------------------------------------------------------------------------- public API
OUTPUT_FORMATS = ("exported_program", "aot_inductor", "pickle")
_FORMAT_FAMILY = FORMAT.rsplit("/", 1)[0] + "/"
# Torch-TensorRT's other formats, and why each is not written here.
_REFUSED_FORMATS = {
    "torchscript": (
        "a TorchScript trace of the compiled module's PyTorch graph records every size the graph "
        "computes (its aten.sym_size calls run in Python) as a constant, so the saved module would "
        "be silently specialised to the example shapes; and torch.jit is deprecated in this torch"
    ),
    "executorch": "this package has no ExecuTorch lowering (and executorch is not a dependency)",
}


def _format_list() -> str:
    return ", ".join(repr(f) for f in OUTPUT_FORMATS)


def _check_output_format(output_format: str) -> None:
    if output_format in OUTPUT_FORMATS:
        return
    if output_format in _REFUSED_FORMATS:
        raise UnsupportedOutputFormat(
            f"save(output_format={output_format!r}) is not supported: "
            f"{_REFUSED_FORMATS[output_format]}. Formats save() writes: {_format_list()} "
            f"(output_format='exported_program', the default, is read by torch.export.load "
            f"anywhere)"
        )
    raise ValueError(f"unknown output_format {output_format!r}; valid: {', '.join(OUTPUT_FORMATS)}")


def _check_extra_files(extra_files: Any) -> dict[str, str]:
    """``extra_files`` as a plain dict of text files, the package's own marker name refused."""
    if extra_files is None:
        return {}
    if not isinstance(extra_files, dict):
        raise TypeError(
            f"save(): extra_files must be a dict of name -> str, got {type(extra_files).__name__}"
        )
    for name, content in extra_files.items():
        plain = isinstance(name, str) and name not in ("", ".", "..") and not set("/\\") & set(name)
        if not plain:
            raise ValueError(
                f"save(): extra_files name {name!r} must be a plain file name (no folders)"
            )
        if name == MARKER_FILE:
            raise ValueError(
                f"save(): extra_files name {MARKER_FILE!r} is reserved: tetrt_support stores its "
                f"format version there; choose another name"
            )
        if not isinstance(content, str):
            raise TypeError(
                f"save(): extra_files[{name!r}] must be a str, got {type(content).__name__}"
            )
    return dict(extra_files)


def _save_pickle(
    module: torch.nn.Module,
    path: str | os.PathLike[str] | io.BufferedIOBase,
    extra_files: dict[str, str],
) -> None:
    payload: dict[str, Any] = {"format": FORMAT, "module": module}
    if extra_files:
        payload["extra_files"] = extra_files
    torch.save(payload, path, pickle_module=_PickleModule)


def _loadable_example_inputs(program: torch.export.ExportedProgram) -> None:
    """Keep the program's example inputs only if ``torch.load(weights_only=True)`` reads them."""
    if program.example_inputs is None:
        return
    buffer = io.BytesIO()
    try:
        torch.save(program.example_inputs, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception as error:  # noqa: BLE001 - any failure: load() would refuse them
        warnings.warn(
            f"save(): the example inputs are not plain tensors that torch.load(weights_only=True) reads "
            f"({type(error).__name__}); saved without them (ep.module() then skips its input guards)",
            stacklevel=3,
        )
        program.example_inputs = None


def _export(
    module: torch.nn.Module,
    arg_inputs: Any,
    kwarg_inputs: Any,
    dynamic_shapes: Any,
    output_format: str,
) -> torch.export.ExportedProgram:
    """``module`` re-exported, engine blocks as the ATen graphs they were built from."""
    from tetrt_support.compiler.pytorch_twin import as_pytorch

    if arg_inputs is None and kwarg_inputs is None:
        raise TypeError(
            f"save(output_format={output_format!r}) re-exports the module with torch.export: pass "
            "arg_inputs=(...) and/or kwarg_inputs={...}, called as the model is called "
            "(or use output_format='pickle')"
        )
    args = (arg_inputs,) if isinstance(arg_inputs, torch.Tensor) else tuple(arg_inputs or ())
    twin = as_pytorch(module) if isinstance(module, fx.GraphModule) else module
    kwargs = dict(kwarg_inputs or {})
    with torch.no_grad():
        return torch.export.export(twin, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)


def _save_exported_program(
    program: torch.export.ExportedProgram,
    path: str | os.PathLike[str] | io.BufferedIOBase,
    extra_files: dict[str, str],
) -> None:
    _loadable_example_inputs(program)
    torch.export.save(program, path, extra_files={**extra_files, MARKER_FILE: FORMAT})


def _save_aot_inductor(
    program: torch.export.ExportedProgram,
    path: str | os.PathLike[str] | io.BufferedIOBase,
    extra_files: dict[str, str],
    inductor_configs: dict[str, Any] | None,
) -> None:
    """AOTInductor's package, rewritten with the marker and ``extra_files`` in ``extra/``
    (``aoti_compile_and_package`` takes no extra files; its loader ignores that folder)."""
    from torch.export.pt2_archive._package import PT2ArchiveReader, PT2ArchiveWriter

    package = io.BytesIO()
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(
            program, package_path=package, inductor_configs=dict(inductor_configs or {})
        )
    package.seek(0)
    reader = PT2ArchiveReader(package)
    target: Any = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    with PT2ArchiveWriter(target) as writer:
        for name in reader.get_file_names():
            if not writer.has_record(name):  # the writer adds its own version records
                writer.write_bytes(name, reader.read_bytes(name))
        for name, content in {**extra_files, MARKER_FILE: FORMAT}.items():
            writer.write_string(_pt2_constants.EXTRA_DIR + name, content)


def save(
    module: torch.nn.Module,
    path: str | os.PathLike[str] | io.BufferedIOBase,
    *,
    output_format: str = "exported_program",
    arg_inputs: Any = None,
    kwarg_inputs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    inputs: Any = None,
    extra_files: dict[str, str] | None = None,
    inductor_configs: dict[str, Any] | None = None,
) -> None:
    """Write ``module`` (a compiled module, ``ep.module()``, any nn.Module) to ``path``.

    ``inputs`` is Torch-TensorRT's other name for ``arg_inputs``. With neither nor
    ``kwarg_inputs``, a module compiled here without dynamic dims is re-exported with the
    example inputs it was compiled with (as Torch-TensorRT's ``retrace=False`` needs none);
    one compiled with dynamic dims needs them and ``dynamic_shapes`` given.

    ``output_format="exported_program"`` (Torch-TensorRT's default): the module is
    re-exported with ``arg_inputs`` / ``kwarg_inputs`` (and ``dynamic_shapes``), engine
    blocks as the ATen graphs they were built from
    (:mod:`~tetrt_support.compiler.pytorch_twin` says why), and written by
    ``torch.export.save``: ``torch.export.load(path).module()`` is then called like the
    model (the keyword/positional split given here, the same output structure, complex
    tensors in and out). ``output_format="aot_inductor"``: that program compiled by
    AOTInductor (``inductor_configs`` passed on, as Torch-TensorRT does) into a ``.pt2``
    package for ``torch._inductor.aoti_load_package``; a path must end in ``.pt2``.
    ``output_format="pickle"``: the module itself, engines included; every
    ``fx.GraphModule`` inside keeps its graph and codegen (see above).
    ``output_format="torchscript"`` raises :class:`UnsupportedOutputFormat`, saying why.

    ``extra_files``: ``{name: text}`` stored with the model, read back by
    ``load(path, extra_files=d)`` (and, for ``"exported_program"``, by
    ``torch.export.load(path, extra_files=d)``). The name ``"tetrt_support_format"`` is
    reserved.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"save() takes a torch.nn.Module, got {type(module).__name__}")
    if inputs is not None:
        if arg_inputs is not None:
            raise TypeError("save(): inputs is another name for arg_inputs; give one of them")
        arg_inputs = inputs
    _check_output_format(output_format)
    extras = _check_extra_files(extra_files)
    if inductor_configs is not None and output_format != "aot_inductor":
        raise TypeError(
            f"save(): inductor_configs is for output_format='aot_inductor', not {output_format!r}"
        )
    if output_format == "pickle":
        given = [n for n, v in (("arg_inputs", arg_inputs), ("kwarg_inputs", kwarg_inputs), ("dynamic_shapes", dynamic_shapes)) if v is not None]
        if given:
            raise TypeError(f"output_format='pickle' saves the module as it is; {', '.join(given)} would be unused")
        _save_pickle(module, path, extras)
        return
    is_path = isinstance(path, (str, os.PathLike))
    if output_format == "aot_inductor" and is_path and not os.fspath(path).endswith(".pt2"):
        raise ValueError(
            f"save(output_format='aot_inductor'): the path must end in .pt2, "
            f"got {os.fspath(path)!r}"
        )
    if arg_inputs is None and kwarg_inputs is None:
        arg_inputs, kwarg_inputs = _compiled_example_inputs(module, output_format)
    program = _export(module, arg_inputs, kwarg_inputs, dynamic_shapes, output_format)
    if output_format == "aot_inductor":
        _save_aot_inductor(program, path, extras, inductor_configs)
    else:
        _save_exported_program(program, path, extras)


#: ``meta`` key of a compiled module: ``(args, kwargs)`` it was compiled with, or
#: :data:`DYNAMIC` where its program has dynamic dims (then a save needs its own inputs)
EXAMPLE_INPUTS_KEY = "tetrt_example_inputs"
DYNAMIC = "dynamic"


def _compiled_example_inputs(module: torch.nn.Module, output_format: str) -> tuple[Any, Any]:
    recorded = getattr(module, "meta", {}).get(EXAMPLE_INPUTS_KEY) if isinstance(module, fx.GraphModule) else None
    if recorded == DYNAMIC:
        raise TypeError(
            f"save(output_format={output_format!r}): this module was compiled with dynamic dims; "
            f"pass "
            "arg_inputs/kwarg_inputs and dynamic_shapes so the saved program keeps them"
        )
    if recorded is None:
        return None, None  # _export names what to pass
    return recorded


# ---------------------------------------------------------------------------- load
_PICKLE_STRINGS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8", "BINSTRING", "SHORT_BINSTRING", "STRING"}


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:300] + "..."


def _describe(path: Any) -> str:
    return repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else f"<{type(path).__name__}>"


def _open_archive(path: Any, where: str) -> tuple[zipfile.ZipFile, str, Any]:
    """The file as a zip archive, the folder its records live in, and what to torch.load."""
    if isinstance(path, (str, os.PathLike)):
        source = os.fspath(path)
        if os.path.isdir(source):
            raise SerializationError(f"{where} is a directory, not a tetrt_support file")
        with open(source, "rb") as file:  # a missing file stays FileNotFoundError
            head = file.read(4)
    else:
        source = io.BytesIO(path.read())  # from where the caller's file is now
        head = source.getvalue()[:4]
    if not head:
        raise SerializationError(f"{where} is empty: not a tetrt_support file")
    if head[:2] != b"PK":
        raise SerializationError(
            f"{where}: not a tetrt_support file "
            f"(not a zip archive: none of its formats can be in it)"
        )
    try:
        archive = zipfile.ZipFile(source)
        names = archive.namelist()
    except Exception as error:  # noqa: BLE001 - BadZipFile, OSError, struct/Unicode errors: all corruption
        raise SerializationError(f"{where}: truncated or corrupt file ({type(error).__name__}: {_short(error)})") from None
    root = names[0].split("/", 1)[0] + "/" if names and "/" in names[0] else ""
    if not root or not all(name.startswith(root) for name in names):
        archive.close()
        raise SerializationError(f"{where}: not a tetrt_support file (a zip archive, but not one torch wrote)")
    return archive, root, source


def _pickle_format(archive: zipfile.ZipFile, root: str, where: str) -> str:
    """The format string a pickle-format file starts with, read from its opcodes: nothing is unpickled."""
    try:
        data = archive.read(root + "data.pkl")
        strings = []
        for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
            if opcode.name in _PICKLE_STRINGS:
                strings.append(arg)
            if len(strings) == 2 or opcode.name == "STOP":
                break
    except Exception as error:  # noqa: BLE001 - a bad CRC, a truncated or garbled pickle
        raise SerializationError(f"{where}: truncated or corrupt file ({type(error).__name__}: {_short(error)})") from None
    if len(strings) < 2 or strings[0] != "format" or not isinstance(strings[1], str):
        raise SerializationError(
            f"{where}: not a tetrt_support file: it was not written by tetrt_support.compiler.serialization.save "
            f"(a torch.save / pickle file of something else)"
        )
    return strings[1]


def _check_format(found: str, where: str) -> None:
    if found == FORMAT:
        return
    if found.startswith(_FORMAT_FAMILY):
        raise SerializationError(f"{where}: written in format {found[:60]!r}; this tetrt_support reads {FORMAT!r}")
    raise SerializationError(
        f"{where}: not a tetrt_support file: it was not written by tetrt_support.compiler.serialization.save "
        f"(found format {found[:60]!r})"
    )


def _load_trusted_pickle(
    archive: zipfile.ZipFile, source: Any, where: str
) -> tuple[torch.nn.Module, dict[str, str]]:
    try:
        bad = archive.testzip()  # every record's CRC, before anything is unpickled
    except Exception as error:  # noqa: BLE001 - a damaged header: corruption like a bad CRC
        raise SerializationError(f"{where}: truncated or corrupt file ({type(error).__name__}: {_short(error)})") from None
    if bad is not None:
        raise SerializationError(f"{where}: truncated or corrupt file (record {bad} fails its CRC check)")
    if not isinstance(source, str):
        source.seek(0)
    try:
        payload = torch.load(source, weights_only=False)
    except (MissingSignatureType, SerializationError):
        raise
    except Exception as error:  # noqa: BLE001 - whatever a damaged pickle raises: one error class
        raise SerializationError(
            f"{where}: truncated or corrupt file, or one this process cannot rebuild ({type(error).__name__}: {_short(error)})"
        ) from error
    if not isinstance(payload, dict) or not isinstance(payload.get("format"), str):
        raise SerializationError(f"{where}: not a tetrt_support file (its payload is a {type(payload).__name__})")
    _check_format(payload["format"], where)
    module = payload.get("module")
    if not isinstance(module, torch.nn.Module):
        raise SerializationError(f"{where}: truncated or corrupt file (it holds a {type(module).__name__}, not a module)")
    stored = payload.get("extra_files", {})
    if not isinstance(stored, dict):
        raise SerializationError(
            f"{where}: truncated or corrupt file (its extra files are a {type(stored).__name__})"
        )
    return module, stored


def _stored_extra_files(archive: zipfile.ZipFile, root: str, where: str) -> dict[str, str]:
    """The user's files in the archive's ``extra/`` folder (not the marker, not torch's own)."""
    folder = root + _pt2_constants.EXTRA_DIR
    reserved = {MARKER_FILE, _pt2_constants.MODULE_INFO_PATH[len(_pt2_constants.EXTRA_DIR):]}
    stored = {}
    for name in archive.namelist():
        short = name[len(folder):]
        if name.startswith(folder) and short and "/" not in short and short not in reserved:
            try:
                stored[short] = archive.read(name).decode("utf-8")
            except Exception as error:  # noqa: BLE001 - a bad CRC, bytes that are not text
                raise SerializationError(
                    f"{where}: extra file {short!r} is corrupt ({type(error).__name__})"
                ) from None
    return stored


def _fill_extra_files(
    extra_files: dict[str, Any] | None, stored: dict[str, str], where: str
) -> None:
    """``extra_files`` updated in place with every stored file, as ``torch.export.load`` does;
    a name asked for that the file does not hold is an error, not a value left as it was."""
    if extra_files is None:
        return
    if not isinstance(extra_files, dict):
        raise TypeError(
            f"load(): extra_files must be a dict to fill, got {type(extra_files).__name__}"
        )
    missing = sorted(name for name in extra_files if name not in stored)
    if missing:
        raise SerializationError(
            f"{where} has no extra file {', '.join(repr(m) for m in missing)} (extra_files); "
            f"it holds: {', '.join(repr(n) for n in sorted(stored)) or 'none'}"
        )
    extra_files.update(stored)


def _aoti_format(archive: zipfile.ZipFile, root: str, where: str) -> None:
    marker = root + _pt2_constants.EXTRA_DIR + MARKER_FILE
    if marker in archive.namelist():  # a package AOTInductor wrote elsewhere has none
        _check_format(archive.read(marker).decode("utf-8", "replace").strip(), where)


def _load_aot_inductor(source: Any, where: str) -> Any:
    if not isinstance(source, str):
        source.seek(0)
    try:
        return torch._inductor.aoti_load_package(source)
    except Exception as error:  # noqa: BLE001 - a package built for another machine or torch
        raise SerializationError(
            f"{where}: AOTInductor package that this process cannot load "
            f"({type(error).__name__}: {_short(error)})"
        ) from error


def load(
    path: str | os.PathLike[str] | io.BufferedIOBase,
    *,
    trusted: bool = False,
    weights_only: bool | None = None,
    extra_files: dict[str, Any] | None = None,
) -> Any:
    """Read what :func:`save` wrote: an ``ExportedProgram`` (call ``.module()``) for the
    ``"exported_program"`` format, the module itself for ``"pickle"``, and for
    ``"aot_inductor"`` the loaded package (``torch._inductor.aoti_load_package``), called
    like the model.

    The exported-program format (and any ``torch.export.save`` archive) is read without
    running code from the file (:mod:`~tetrt_support.compiler.safe_pt2`). The pickle format
    unpickles arbitrary objects, and an AOTInductor package is a shared library that
    loading runs, so both load only with ``trusted=True`` (alias: ``weights_only=False``,
    as in ``torch.load``): pass it only for files you made or trust. Anything else
    (another file, a damaged one, an unsafe archive) raises :class:`SerializationError`.

    ``extra_files``: a dict filled in place with the extra files :func:`save` stored
    (as ``torch.export.load`` does); a name in it that the file does not hold raises.
    """
    if weights_only is not None:
        if trusted and weights_only:
            raise TypeError("load(): trusted=True and weights_only=True contradict each other")
        trusted = not weights_only
    where = _describe(path)
    archive, root, source = _open_archive(path, where)
    with archive:
        names = set(archive.namelist())
        if any(name.startswith(root + _pt2_constants.AOTINDUCTOR_DIR) for name in names):
            _aoti_format(archive, root, where)
            if not trusted:
                raise UntrustedNativeCode(
                    f"{where} is an AOTInductor package (output_format='aot_inductor'): loading it "
                    f"runs the shared library inside, native code chosen by whoever wrote the "
                    f"file. Pass trusted=True only for a file you made yourself or trust; to share "
                    f"a model, save it with output_format='exported_program' (the default), which "
                    f"load() reads without running code from the file"
                )
            _fill_extra_files(extra_files, _stored_extra_files(archive, root, where), where)
            return _load_aot_inductor(source, where)
        if root + _pt2_constants.ARCHIVE_FORMAT_PATH in names:
            try:
                program = read_exported_program(archive, root, where, FORMAT)
            except SerializationError:
                raise
            except Exception as error:  # noqa: BLE001 - torch's deserializer on a damaged file: one error class
                raise SerializationError(
                    f"{where}: truncated or corrupt exported program ({type(error).__name__}: {_short(error)})"
                ) from error
            _fill_extra_files(extra_files, _stored_extra_files(archive, root, where), where)
            return program
        if root + "data.pkl" not in names:
            raise SerializationError(
                f"{where}: not a tetrt_support file (a zip archive, but in none of its formats)"
            )
        _check_format(_pickle_format(archive, root, where), where)
        if not trusted:
            raise UntrustedPickle(
                f"{where} is in tetrt_support's pickle format: loading it unpickles arbitrary objects, which runs "
                f"code chosen by whoever wrote the file. Pass trusted=True only for a file you made yourself or "
                f"trust; to share a model, save it with output_format='exported_program' (the default), which "
                f"load() reads without running code from the file"
            )
        module, stored = _load_trusted_pickle(archive, source, where)
        _fill_extra_files(extra_files, stored, where)
        return module
