"""``tetrt_support.save`` in its formats: each file is read back in a FRESH process and the
loaded module, called by keyword, gives the compiled module's numbers, output structure
and complex outputs. ``"exported_program"`` files are read by plain ``torch.export.load``.
The ``"aot_inductor"`` package, the refused ``"torchscript"`` and ``extra_files`` are in
tests/compiler/test_output_formats.py."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tetrt_support
from tests.assertions import assert_same_outputs
from tetrt_support import zoo
from tetrt_support.compiler.pytorch_twin import as_pytorch

ROOT = Path(__file__).resolve().parents[2]


class ComplexDict(torch.nn.Module):
    """Complex input, complex and real outputs in a dict, keyword-only ``scale``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, z: torch.Tensor, *, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        rotated = z * torch.polar(torch.ones_like(scale), scale)
        h = torch.tanh(self.w(x)) + torch.view_as_real(rotated).flatten(1)
        return {"h": h, "rotated": rotated, "energy": rotated.abs().sum(-1)}


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(3, 8, generator=g),
        "z": torch.randn(3, 4, generator=g, dtype=torch.complex64),
        "scale": torch.randn(4, generator=g),
    }


@functools.cache
def _compiled(backend: str):
    model = ComplexDict().eval()
    return model, tetrt_support.compile(model, kwarg_inputs=_inputs(), backend=backend, min_block_size=1)


def _load_in_fresh_process(path: Path, inputs_path: Path, out_path: Path, importing: str) -> None:
    script = "\n".join(
        [
            "import torch",
            importing,
            f"inputs = torch.load({str(inputs_path)!r})",
            "out = module(**inputs)",
            f"torch.save({{'out': out, 'classes': [c.__name__ for c in type(module).__mro__]}}, {str(out_path)!r})",
        ]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_exported_program_format_loads_with_torch_export_in_a_fresh_process(tmp_path: Path) -> None:
    model, compiled = _compiled("onnxruntime")
    assert "OnnxRuntimeBlock" in {b.runner for b in compiled.blocks()}  # a real ONNX Runtime block was saved
    tetrt_support.save(compiled, tmp_path / "m.pt2", kwarg_inputs=_inputs())
    other = _inputs(seed=1)
    torch.save(other, tmp_path / "inputs.pt")
    # torch alone: no tetrt_support import in the loading process
    _load_in_fresh_process(
        tmp_path / "m.pt2", tmp_path / "inputs.pt", tmp_path / "out.pt",
        f"module = torch.export.load({str(tmp_path / 'm.pt2')!r}).module()",
    )
    loaded = torch.load(tmp_path / "out.pt")
    assert_same_outputs(compiled(**other), loaded["out"])
    assert_same_outputs(model(**other), loaded["out"])
    assert loaded["out"]["rotated"].dtype == torch.complex64


def test_exported_program_keeps_engine_blocks_as_their_real_graphs(tmp_path: Path) -> None:
    _, compiled = _compiled("onnxruntime")
    tetrt_support.save(compiled, tmp_path / "m.pt2", kwarg_inputs=_inputs())
    program = tetrt_support.load(tmp_path / "m.pt2")
    assert isinstance(program, torch.export.ExportedProgram)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "aten.linear.default" in targets and "aten.tanh.default" in targets  # the block's ops, in ATen
    assert not any(t.startswith("tetrt") for t in targets)  # no custom op: loads anywhere
    weights = {k for k in program.state_dict if k.endswith("w.weight")}
    assert weights == {"engine_0.weights.w.weight"}  # the engine block's weights, under their names
    # the twin used for export leaves the compiled module as it was
    assert type(compiled.get_submodule("engine_0")).__name__ == "WeightsAsInputs"
    assert type(as_pytorch(compiled).get_submodule("engine_0")).__name__ == "_GraphWithWeights"


def test_pickle_format_loads_in_a_fresh_process_with_its_engines(tmp_path: Path) -> None:
    model, compiled = _compiled("onnxruntime")
    tetrt_support.save(compiled, tmp_path / "m.pkl", output_format="pickle")
    other = _inputs(seed=2)
    torch.save(other, tmp_path / "inputs.pt")
    _load_in_fresh_process(
        tmp_path / "m.pkl", tmp_path / "inputs.pt", tmp_path / "out.pt",
        f"import tetrt_support\nmodule = tetrt_support.load({str(tmp_path / 'm.pkl')!r}, trusted=True)\n"
        f"assert type(module.get_submodule('engine_0')).__name__ == 'WeightsAsInputs'",
    )
    loaded = torch.load(tmp_path / "out.pt")
    assert "CompiledModule" in loaded["classes"]
    assert_same_outputs(compiled(**other), loaded["out"], atol=0, rtol=0)
    assert_same_outputs(model(**other), loaded["out"])


def test_llama4_saved_as_exported_program_is_called_by_keyword_at_other_sizes(tmp_path: Path) -> None:
    model = zoo.tiny_llama4().eval()
    ids = zoo.llama4_example_inputs(model, batch=2, seq=8)
    shapes = {"input_ids": {0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", max=32)}}
    compiled = tetrt_support.compile(model, kwarg_inputs=ids, dynamic_shapes=shapes)
    tetrt_support.save(compiled, tmp_path / "llama.pt2", kwarg_inputs=ids, dynamic_shapes=shapes)
    loaded = torch.export.load(tmp_path / "llama.pt2").module()
    other = zoo.llama4_example_inputs(model, batch=3, seq=5, seed=3)
    out, ref = loaded(**other), model(**other)
    assert type(out) is type(ref) and list(out.keys()) == list(ref.keys())
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-4)


def test_save_refuses_unknown_formats_and_missing_inputs(tmp_path: Path) -> None:
    _, compiled = _compiled("eager")
    valid = "exported_program, aot_inductor, pickle"
    with pytest.raises(ValueError, match=f"unknown output_format 'tflite'; valid: {valid}"):
        tetrt_support.save(compiled, tmp_path / "m", output_format="tflite")
    # a module that was not compiled here records no example inputs to re-export with
    with pytest.raises(TypeError, match=r"re-exports the module with torch.export: pass arg_inputs=\(\.\.\.\)"):
        tetrt_support.save(torch.nn.Linear(2, 2), tmp_path / "m")
    with pytest.raises(TypeError, match="output_format='pickle' saves the module as it is; kwarg_inputs would be unused"):
        tetrt_support.save(compiled, tmp_path / "m", output_format="pickle", kwarg_inputs=_inputs())


@pytest.mark.filterwarnings("error")  # every block builds in its engine
@pytest.mark.parametrize("options", [{"backend": "eager"}, {"backend": "inductor"}, {"truncate_double": True}, {}])
def test_every_engine_block_kind_saves_as_its_graph(tmp_path: Path, options: dict) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double().eval()
    x = torch.randn(3, 4, dtype=torch.float64)
    compiled = tetrt_support.compile(model, arg_inputs=(x,), min_block_size=1, **options)
    tetrt_support.save(compiled, tmp_path / "m.pt2", arg_inputs=(x,))
    loaded = torch.export.load(tmp_path / "m.pt2").module()
    other = torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(Exception):  # saved static, as exported: another batch size is refused
        loaded(other)
    y = torch.randn(3, 4, dtype=torch.float64)
    assert_same_outputs(compiled(y), loaded(y), atol=1e-7, rtol=1e-6)
