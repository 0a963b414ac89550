"""Torch-TensorRT's other ``save`` spellings: ``output_format="aot_inductor"``
(a ``.pt2`` package of AOTInductor's shared library, loaded only when trusted),
``output_format="torchscript"`` (refused, saying why) and ``extra_files`` on save and load."""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path

import pytest
import torch

import tetrt_support
from tetrt_support.compiler.safe_pt2 import MARKER_FILE
from tetrt_support.compiler.serialization import (
    SerializationError,
    UnsupportedOutputFormat,
    UntrustedNativeCode,
)


class SmallMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x))) * 2


def _compiled(backend: str = "eager") -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model, x = SmallMLP().eval(), torch.randn(3, 4)
    compiled = tetrt_support.compile(model, arg_inputs=(x,), backend=backend, min_block_size=1)
    return model, compiled, x


def test_aot_inductor_package_loads_with_aoti_load_package_and_only_when_trusted(
    tmp_path: Path,
) -> None:
    """One AOTInductor compile (C++ on the CPU; about 10-25 s on two shared cores), of a
    module whose engine block runs in ONNX Runtime: the package holds its PyTorch twin."""
    model, compiled, x = _compiled("onnxruntime")
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    path = tmp_path / "m.pt2"
    started = time.perf_counter()
    tetrt_support.save(compiled, path, output_format="aot_inductor", extra_files={"note.txt": "v1"})
    print(f"aot_inductor save: {time.perf_counter() - started:.1f} s")
    names = zipfile.ZipFile(path).namelist()
    assert any("/data/aotinductor/model/" in n and n.endswith(".so") for n in names)
    # torch alone reads it
    other = torch.randn(3, 4)
    by_torch = torch._inductor.aoti_load_package(str(path))
    torch.testing.assert_close(by_torch(other), model(other), atol=1e-5, rtol=1e-5)
    # load() runs no native code unless told the file is trusted
    refused = (r"is an AOTInductor package \(output_format='aot_inductor'\): "
               r"loading it runs the shared library inside.*Pass trusted=True")
    with pytest.raises(UntrustedNativeCode, match=refused):
        tetrt_support.load(path)
    extra = {"note.txt": ""}
    loaded = tetrt_support.load(path, trusted=True, extra_files=extra)
    assert extra == {"note.txt": "v1"}
    torch.testing.assert_close(loaded(other), compiled(other), atol=1e-5, rtol=1e-5)


def test_aot_inductor_refuses_a_path_without_pt2_and_inductor_configs_elsewhere(
    tmp_path: Path,
) -> None:
    _, compiled, _ = _compiled()
    wrong_path = r"save\(output_format='aot_inductor'\): the path must end in \.pt2"
    with pytest.raises(ValueError, match=wrong_path):
        tetrt_support.save(compiled, tmp_path / "m.bin", output_format="aot_inductor")
    elsewhere = "inductor_configs is for output_format='aot_inductor', not 'exported_program'"
    with pytest.raises(TypeError, match=elsewhere):
        tetrt_support.save(compiled, tmp_path / "m.pt2", inductor_configs={"max_autotune": True})


def test_torchscript_is_refused_naming_why_and_the_formats_that_exist(tmp_path: Path) -> None:
    _, compiled, _ = _compiled()
    why = (r"save\(output_format='torchscript'\) is not supported: a TorchScript trace .* "
           r"silently specialised to the example shapes.*"
           r"Formats save\(\) writes: 'exported_program', 'aot_inductor', 'pickle'")
    with pytest.raises(UnsupportedOutputFormat, match=why):
        tetrt_support.save(compiled, tmp_path / "m.ts", output_format="torchscript")
    assert not (tmp_path / "m.ts").exists()


def test_extra_files_round_trip_in_the_exported_program_format(tmp_path: Path) -> None:
    _, compiled, x = _compiled()
    path = tmp_path / "m.pt2"
    tetrt_support.save(compiled, path, extra_files={"config.json": '{"a": 1}', "notes.txt": "ü"})
    extra: dict = {}
    program = tetrt_support.load(path, extra_files=extra)
    # filled in place; the marker is not a user file
    assert extra == {"config.json": '{"a": 1}', "notes.txt": "ü"}
    torch.testing.assert_close(program.module()(x), compiled(x))
    asked = {"notes.txt": ""}
    torch.export.load(path, extra_files=asked)  # torch's own reader sees the same files
    assert asked["notes.txt"] == "ü" and asked["config.json"] == '{"a": 1}'


def test_extra_files_round_trip_in_the_pickle_format() -> None:
    _, compiled, x = _compiled()
    buffer = io.BytesIO()
    tetrt_support.save(compiled, buffer, output_format="pickle", extra_files={"notes.txt": "kept"})
    buffer.seek(0)
    extra = {"notes.txt": None}
    module = tetrt_support.load(buffer, trusted=True, extra_files=extra)
    assert extra == {"notes.txt": "kept"}
    torch.testing.assert_close(module(x), compiled(x))


def test_the_marker_file_name_is_reserved(tmp_path: Path) -> None:
    _, compiled, _ = _compiled()
    for output_format in ("exported_program", "pickle", "aot_inductor"):
        reserved = f"extra_files name '{MARKER_FILE}' is reserved: tetrt_support stores"
        with pytest.raises(ValueError, match=reserved):
            tetrt_support.save(compiled, tmp_path / "m.pt2", output_format=output_format,
                               extra_files={MARKER_FILE: "x"})
    assert not (tmp_path / "m.pt2").exists()


def test_extra_files_must_be_plain_names_and_text(tmp_path: Path) -> None:
    _, compiled, _ = _compiled()
    with pytest.raises(ValueError, match=r"extra_files name '\.\./x' must be a plain file name"):
        tetrt_support.save(compiled, tmp_path / "m.pt2", extra_files={"../x": "y"})
    with pytest.raises(TypeError, match=r"extra_files\['b'\] must be a str, got bytes"):
        tetrt_support.save(compiled, tmp_path / "m.pt2", extra_files={"b": b"y"})
    with pytest.raises(TypeError, match="extra_files must be a dict of name -> str, got list"):
        tetrt_support.save(compiled, tmp_path / "m.pt2", extra_files=["a"])


def test_load_names_an_extra_file_the_archive_does_not_hold(tmp_path: Path) -> None:
    _, compiled, _ = _compiled()
    tetrt_support.save(compiled, tmp_path / "m.pt2", extra_files={"a.txt": "1"})
    extra = {"b.txt": "", "a.txt": ""}
    missing = r"has no extra file 'b.txt' \(extra_files\); it holds: 'a.txt'"
    with pytest.raises(SerializationError, match=missing):
        tetrt_support.load(tmp_path / "m.pt2", extra_files=extra)
    assert extra == {"b.txt": "", "a.txt": ""}  # nothing filled when one is missing
