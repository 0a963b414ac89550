"""``compile`` and ``lower`` leave the caller's ExportedProgram as it was: graph code,
constants, state dict and ShapeEnv (replacements and value ranges), and its dims dynamic."""

from __future__ import annotations

import pytest
import torch
from torch._guards import detect_fake_mode
from torch.export import Dim

import tetrt_support
from tetrt_support.complex import lower
from tetrt_support.zoo.reproductions import SizeInPython


class NoGradRoPE(torch.nn.Module):
    """A rotary embedding under ``torch.no_grad()``, with a complex buffer (a get_attr)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("freqs", torch.polar(torch.ones(4), torch.arange(4.0)), persistent=False)
        self.scale = torch.nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            rot = torch.view_as_complex(x.reshape(*x.shape[:-1], 4, 2)) * self.freqs
        return torch.view_as_real(rot).flatten(-2) * self.scale


def _snapshot(program: torch.export.ExportedProgram) -> dict:
    shape_env = detect_fake_mode([n.meta.get("val") for n in program.graph.nodes]).shape_env
    return {
        "code": program.graph_module.code,
        "constants": {k: v.clone() for k, v in program.constants.items() if isinstance(v, torch.Tensor)},
        "state": {k: v.clone() for k, v in program.state_dict.items()},
        "replacements": dict(shape_env.replacements),
        "ranges": dict(shape_env.var_to_range),
        "placeholder_shapes": [str(n.meta["val"].shape) for n in program.graph.nodes if n.op == "placeholder"],
    }


def _assert_same(before: dict, after: dict) -> None:
    assert after["code"] == before["code"]
    assert after["replacements"] == before["replacements"]
    assert after["ranges"] == before["ranges"]
    assert after["placeholder_shapes"] == before["placeholder_shapes"]
    for key in ("constants", "state"):
        assert set(after[key]) == set(before[key])
        for name, value in before[key].items():
            assert torch.equal(after[key][name], value), (key, name)


MODELS = {
    "no_grad_rope": (NoGradRoPE, lambda: (torch.randn(2, 3, 8),), lambda: ({0: Dim("b", min=1, max=8), 1: Dim("s", min=2, max=16)},)),
    "size_in_python": (SizeInPython, lambda: (torch.randn(2, 3, 4),), lambda: ({0: Dim("b", min=1, max=8), 1: Dim("s", min=2, max=16)},)),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("strategy", ("rewrite", "retrace"))
def test_compile_and_lower_leave_the_callers_program_alone(name: str, strategy: str) -> None:
    cls, make_args, make_shapes = MODELS[name]
    model, args = cls(), make_args()
    program = torch.export.export(model, args, dynamic_shapes=make_shapes(), strict=False)
    before = _snapshot(program)
    lower(program, strategy=strategy)
    _assert_same(before, _snapshot(program))
    first = tetrt_support.compile(program, backend="onnxruntime", strategy=strategy, min_block_size=1)
    _assert_same(before, _snapshot(program))
    second = tetrt_support.compile(program, backend="onnxruntime", strategy=strategy, min_block_size=1)  # a second compile works
    _assert_same(before, _snapshot(program))
    other = make_args()[0][:1, :2].repeat(3, 3, 1)  # another batch and sequence: still dynamic
    with torch.no_grad():
        want = model(other)
    torch.testing.assert_close(first(other), want)
    torch.testing.assert_close(second(other), want)


def test_retrace_lowering_leaves_the_shape_env_of_a_dynamic_codec_alone() -> None:
    """Retracing WavTokenizer's decoder runs CPU convolution meta kernels, whose backend
    choice guards ``batch < 16``; on the caller's ShapeEnv that narrowed batch to [2, 15].
    The passes work on a private copy, so the program is unchanged and batch 16 still runs."""
    from tetrt_support import zoo

    model = zoo.build_model("wavtokenizer")
    program, _, _ = zoo.export_model("wavtokenizer", model=model, dynamic=True)
    before = _snapshot(program)
    lower(program, strategy="retrace")
    _assert_same(before, _snapshot(program))
    compiled = tetrt_support.compile(program, backend="onnxruntime", strategy="retrace")
    _assert_same(before, _snapshot(program))
    assert compiled.blocks_summary().startswith("1 engine block")
    inputs = zoo.example_inputs("wavtokenizer", model, batch=16, seed=1)[1]  # the bound the guard excluded
    with torch.no_grad():
        want = model(**inputs)
    torch.testing.assert_close(compiled(**inputs).audio_values, want.audio_values, rtol=1e-4, atol=1e-5)
