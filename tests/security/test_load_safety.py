"""``tetrt_support.load`` never runs code from a file it was not told to trust.

Each attack writes a marker file when its code runs; the marker must stay absent. The
exported-program attacks edit one piece of a real archive: with torch 2.14,
``torch.export.load`` runs the pickled ones and the shape expression while loading, the
guard and the parameter path at the first call of ``.module()``; the input-structure key
is pasted into generated code too (torch's keyword check happens to stop that one). The
pickle attacks are torch.save files. Damaged files of every kind give
:class:`SerializationError`.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tetrt_support
from tests.compiler.test_serialization import Model, _inputs
from tetrt_support.compiler.serialization import (
    FORMAT,
    SerializationError,
    UntrustedNativeCode,
    UntrustedPickle,
    load,
    save,
)


class Small(torch.nn.Module):
    """A weight, a buffer, a keyword input and a dynamic batch: every piece an archive has."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(4, 3)
        self.register_buffer("offset", torch.arange(3.0))

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.w(x) * scale + self.offset
        return {"h": h, "total": h.sum(-1)}


def _small_inputs(batch: int = 2) -> tuple[tuple[torch.Tensor], dict[str, torch.Tensor]]:
    return (torch.randn(batch, 4),), {"scale": torch.tensor(1.5)}


class Evil:
    """Unpickling it runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def _evil_code(marker: Path) -> str:
    return f"__import__('os').system('touch {marker}')"


def _torch_save(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def program_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ep") / "small.pt2"
    args, kwargs = _small_inputs()
    save(Small(), path, arg_inputs=args, kwarg_inputs=kwargs, dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}, "scale": None})
    return path


@pytest.fixture(scope="module")
def pickle_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pickle") / "model.pt"
    save(torch.export.export(Model(), *_inputs()).module(), path, output_format="pickle")
    return path


def _edit(src: Path, dst: Path, edits: dict[str, Callable[[bytes], bytes]], added: dict[str, bytes] | None = None) -> Path:
    """A copy of the archive ``src`` with the records ending in each key of ``edits`` rewritten."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w") as new:
        root = old.namelist()[0].split("/", 1)[0]
        for name in old.namelist():
            data = old.read(name)
            for suffix, edit in edits.items():
                if name.endswith(suffix):
                    data = edit(data)
            new.writestr(name, data)
        for name, data in (added or {}).items():
            new.writestr(f"{root}/{name}", data)
    return dst


def _edit_program(edit: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        program = json.loads(data)
        edit(program)
        return json.dumps(program).encode()

    return apply


def _first_symbol(program: dict, code: str) -> None:
    text = json.dumps(program)
    symbol = "Symbol('s77', positive=True, integer=True)"
    assert symbol in text, "the fixture has no dynamic dimension any more"
    program.clear()
    program.update(json.loads(text.replace(symbol, f"{code} and {symbol}", 1)))


def _spec_key(program: dict, code: str) -> None:
    signature = program["graph_module"]["module_call_graph"][0]["signature"]
    spec = json.loads(signature["in_spec"])
    spec[1]["children_spec"][1]["context"] = json.dumps([f"scale':{code},'scale"])
    signature["in_spec"] = json.dumps(spec)


def _evil_fqn(marker: Path) -> str:
    """A parameter path that FX's code for ``self.<path>`` turns into a call of os.system."""
    return f'w") and getattr(__import__("os"), "system")("touch {marker}") or getattr(self, "w.weight'


def _parameter_name(program: dict, marker: Path) -> None:
    for spec in program["graph_module"]["signature"]["input_specs"]:
        if spec.get("parameter", {}).get("parameter_name") == "w.weight":
            spec["parameter"]["parameter_name"] = _evil_fqn(marker)


def _weight_renamed(marker: Path) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        config = json.loads(data)
        config["config"][_evil_fqn(marker)] = config["config"].pop("w.weight")
        return json.dumps(config).encode()

    return apply


def _weight_pickled(data: bytes) -> bytes:
    config = json.loads(data)
    next(iter(config["config"].values()))["use_pickle"] = True
    return json.dumps(config).encode()


def _opaque_constant(data: bytes) -> bytes:
    return json.dumps({"config": {"evil": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}}}).encode()


ATTACKS = {
    # a pickled tensor artifact: torch.export.load retries it with weights_only=False
    "sample_inputs": lambda m: ({"sample_inputs/model.pt": lambda _: _torch_save(((Evil(m),), {}))}, None),
    "pickled_weight": lambda m: ({"model_weights_config.json": _weight_pickled, "weights/weight_0": lambda _: _torch_save(Evil(m))}, None),
    "legacy_weights_file": lambda m: ({}, {"data/weights/model.pt": _torch_save({"w": Evil(m)})}),
    # an object constant: torch unpickles it with pickle.loads
    "opaque_constant": lambda m: ({"model_constants_config.json": _opaque_constant}, {"data/constants/opaque_obj_0": pickle.dumps(Evil(m))}),
    # strings torch evaluates (sympify) or pastes into the code it generates
    "shape_expression": lambda m: ({"models/model.json": _edit_program(lambda p: _first_symbol(p, _evil_code(m)))}, None),
    "guard": lambda m: ({"models/model.json": _edit_program(lambda p: p.update(guards_code=[f"{_evil_code(m)} == 0"]))}, None),
    "input_structure_key": lambda m: ({"models/model.json": _edit_program(lambda p: _spec_key(p, _evil_code(m)))}, None),
    "parameter_name": lambda m: (
        {"models/model.json": _edit_program(lambda p: _parameter_name(p, m)), "model_weights_config.json": _weight_renamed(m)},
        None,
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_exported_program_attack_does_not_run(program_file: Path, tmp_path: Path, attack: str) -> None:
    marker = tmp_path / "pwned"
    edits, added = ATTACKS[attack](marker)
    path = _edit(program_file, tmp_path / "evil.pt2", edits, added)
    with pytest.raises(SerializationError, match="unsafe or corrupt exported program, refused"):
        program = load(path)
        program.module()(*_small_inputs()[0], **_small_inputs()[1])  # only reached if load let it through
    with pytest.raises(SerializationError):
        load(path, trusted=True)  # trust only concerns the pickle format
    assert not marker.exists()


@pytest.mark.parametrize("payload", ["plain", "with_our_format_tag"])
def test_pickle_payload_does_not_run_without_trust(tmp_path: Path, payload: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save(Evil(marker) if payload == "plain" else {"format": FORMAT, "module": Evil(marker)}, path)
    expected = UntrustedPickle if payload == "with_our_format_tag" else SerializationError
    message = "runs code chosen by whoever wrote the file. Pass trusted=True only" if payload != "plain" else "not a tetrt_support file"
    for kwargs in ({}, {"trusted": False}, {"weights_only": True}):
        with pytest.raises(expected, match=message):
            load(path, **kwargs)
    with pytest.raises(expected):
        load(io.BytesIO(path.read_bytes()))
    with pytest.raises(SerializationError, match="not a zip archive"):  # a bare pickle, not torch's zip
        path.write_bytes(pickle.dumps(Evil(marker)))
        load(path, trusted=True)
    assert not marker.exists()


def test_untrusted_message_says_why_and_how(pickle_file: Path) -> None:
    with pytest.raises(UntrustedPickle) as error:
        load(pickle_file)
    text = str(error.value)
    assert "unpickles arbitrary objects" in text and "trusted=True" in text and "output_format='exported_program'" in text
    assert isinstance(error.value, ValueError)


def test_a_shared_library_in_an_archive_is_not_loaded_without_trust(
    program_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AOTInductor package (output_format='aot_inductor') is native code: loading it runs
    it. Any archive holding one is refused without ``trusted=True``, even one that is also
    an exported program, before torch's package loader is reached."""
    loader_calls: list = []
    stand_in = lambda *args, **kwargs: loader_calls.append(args)  # noqa: E731
    monkeypatch.setattr(torch._inductor, "aoti_load_package", stand_in)
    library = {"data/aotinductor/model/x.wrapper.so": b"\x7fELF"}
    planted = _edit(program_file, tmp_path / "planted.pt2", {}, added=library)
    for source in (planted, io.BytesIO(planted.read_bytes())):
        with pytest.raises(UntrustedNativeCode, match="AOTInductor package .* runs the shared"):
            load(source)
    assert not loader_calls
    load(planted, trusted=True)  # trusted: handed to torch's loader (here a stand-in)
    assert len(loader_calls) == 1


def test_trusted_pickle_loads(pickle_file: Path) -> None:
    args, kwargs = _inputs(batch=3)
    expected = Model()  # the fixture's weights are not this one's: compare with a fresh save below
    for loaded in (load(pickle_file, trusted=True), load(pickle_file, weights_only=False), load(io.BytesIO(pickle_file.read_bytes()), trusted=True)):
        assert isinstance(loaded, torch.fx.GraphModule)
        assert set(loaded(*args, **kwargs)) == set(expected(*args, **kwargs))
    with pytest.raises(TypeError, match="contradict"):
        load(pickle_file, trusted=True, weights_only=True)


def test_exported_program_loads_safely_and_runs(program_file: Path) -> None:
    program = tetrt_support.load(program_file)
    assert isinstance(program, torch.export.ExportedProgram)
    args, kwargs = _small_inputs(batch=5)
    out = program.module()(*args, **kwargs)
    reference = torch.export.load(program_file).module()(*args, **kwargs)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    assert program.example_inputs is not None  # saved as plain tensors: weights_only reads them
    with zipfile.ZipFile(program_file) as archive:
        assert any(name.endswith("extra/tetrt_support_format") for name in archive.namelist())


def test_format_and_payload_type_are_checked(tmp_path: Path, program_file: Path) -> None:
    module = torch.nn.Linear(2, 2)
    torch.save({"format": "tetrt_support.serialization/999", "module": module}, tmp_path / "newer.pt")
    for trusted in (False, True):
        with pytest.raises(SerializationError, match="written in format 'tetrt_support.serialization/999'"):
            load(tmp_path / "newer.pt", trusted=trusted)
    torch.save({"format": FORMAT, "module": 3}, tmp_path / "int.pt")
    with pytest.raises(SerializationError, match="holds a int, not a module"):
        load(tmp_path / "int.pt", trusted=True)
    torch.save(3, tmp_path / "bare_int.pt")
    with pytest.raises(SerializationError, match="not a tetrt_support file"):
        load(tmp_path / "bare_int.pt", trusted=True)
    newer = _edit(program_file, tmp_path / "newer.pt2", {"extra/tetrt_support_format": lambda _: b"tetrt_support.serialization/999"})
    with pytest.raises(SerializationError, match="written in format 'tetrt_support.serialization/999'"):
        load(newer)
    with pytest.raises(SerializationError, match="archive version"):
        load(_edit(program_file, tmp_path / "v.pt2", {"archive_version": lambda _: b"7"}))


def _random_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("notes.txt", "hello")
    return buffer.getvalue()


def _torch_zip_not_ours() -> bytes:
    return _torch_save({"weights": torch.ones(2)})


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty: not a tetrt_support file"),
        (os.urandom(64), "not a tetrt_support file"),
        (b"PK\x03\x04" + bytes(60), "truncated or corrupt"),
        (_random_zip(), "not a tetrt_support file"),
        (_torch_zip_not_ours(), "not a tetrt_support file"),
    ],
    ids=["empty", "random", "zip_header_only", "zip_not_ours", "torch_save_not_ours"],
)
@pytest.mark.parametrize("trusted", [False, True])
def test_corrupt_files_give_one_error(tmp_path: Path, content: bytes, message: str, trusted: bool) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(SerializationError, match=message):
        load(path, trusted=trusted)
    with pytest.raises(SerializationError, match=message):
        load(io.BytesIO(content), trusted=trusted)


def test_directory_gives_the_named_error(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="is a directory, not a tetrt_support file"):
        load(tmp_path)
    with pytest.raises(FileNotFoundError):  # a missing file is not a corrupt one
        load(tmp_path / "missing.pt2")


@pytest.mark.parametrize("kind", ["program", "pickle"])
def test_truncated_files_give_one_error(program_file: Path, pickle_file: Path, kind: str) -> None:
    data = (program_file if kind == "program" else pickle_file).read_bytes()
    for end in (1, 3, 100, len(data) // 2, len(data) - 22, len(data) - 1):
        for trusted in (False, True):
            with pytest.raises(SerializationError, match="not a tetrt_support file|truncated or corrupt"):
                load(io.BytesIO(data[:end]), trusted=trusted)


def _flip(data: bytes, position: int, mask: int) -> bytes:
    position %= len(data)
    return data[:position] + bytes([data[position] ^ mask]) + data[position + 1 :]


def _load_or_named_error(data: bytes, trusted: bool) -> None:
    try:
        loaded = load(io.BytesIO(data), trusted=trusted)
    except SerializationError:
        return
    assert isinstance(loaded, (torch.export.ExportedProgram, torch.nn.Module))  # a flip in padding changes nothing


@settings(max_examples=20)
@given(position=st.integers(0, 2**31), mask=st.integers(1, 255), trusted=st.booleans())
def test_byte_flips_in_a_program_give_the_named_error(program_file: Path, position: int, mask: int, trusted: bool) -> None:
    _load_or_named_error(_flip(program_file.read_bytes(), position, mask), trusted)


@settings(max_examples=20)
@given(position=st.integers(0, 2**31), mask=st.integers(1, 255), trusted=st.booleans())
def test_byte_flips_in_a_pickle_file_give_the_named_error(pickle_file: Path, position: int, mask: int, trusted: bool) -> None:
    _load_or_named_error(_flip(pickle_file.read_bytes(), position, mask), trusted)


@settings(max_examples=20)
@given(fraction=st.floats(0, 1, exclude_max=True), kind=st.sampled_from(["program", "pickle"]), trusted=st.booleans())
def test_truncations_give_the_named_error(program_file: Path, pickle_file: Path, fraction: float, kind: str, trusted: bool) -> None:
    data = (program_file if kind == "program" else pickle_file).read_bytes()
    with pytest.raises(SerializationError):
        load(io.BytesIO(data[: int(len(data) * fraction)]), trusted=trusted)
