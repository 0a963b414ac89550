"""Three reported defects, each held by the tests below it:

- the default save (an exported program) failed for an engine block without weights: every
  engine block, on every engine, keeps the graph it was built from;
- a 0-d input came back from ONNX Runtime as shape ``(1,)``: 0-d stays 0-d in and out of
  every engine;
- ``torch_executed_ops`` in core-ATen spelling (``aten.convolution``, ``aten.addmm``) was
  silently ignored: entries match the ops a node decomposes to, and an entry that matches
  nothing warns.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tetrt_support
from tests.assertions import assert_same_outputs
from tests.models import rope
from tetrt_support import zoo
from tetrt_support.compiler.configured_engine import WeightsAsInputs
from tetrt_support.compiler.engines import ENGINE_NAMES, Engine, get_engine
from tetrt_support.compiler.engines.base import keep_scalars_0d, scalar_outputs
from tetrt_support.compiler.engines.tensorrt import TensorRTBlock
from tetrt_support.compiler.settings import CompilationSettings, decomposed_ops
from tetrt_support.optional import available

RUNNABLE_ENGINES = [
    name for name in ENGINE_NAMES if name != "tensorrt" or (available("torch_tensorrt") and torch.cuda.is_available())
]
CPU_BACKENDS = ["onnxruntime", "eager", "inductor"]


class ReluHalf(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 0.5


class Times7(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 7


class SumAll(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


class ScalarMix(torch.nn.Module):
    """A 0-d input, a 0-d output and a 2-d output in one block."""

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * s).sum(), x + s


class KeywordRoPE(torch.nn.Module):
    """Complex RoPE (``polar``, ``view_as_complex``, complex mul) with keyword-only inputs and no weights."""

    def forward(self, *, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        return rope(x, freqs)


def _rope_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(2, 8, 2, 16, generator=g), "freqs": torch.randn(8, 8, generator=g)}


def _engine_classes(compiled: torch.nn.Module) -> list[str]:
    return [b.runner for b in compiled.blocks() if b.kind == "engine"]


# --------------------------------------------------------------------------- 1. save without weights
@pytest.mark.filterwarnings("error")  # the block builds in its engine
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_block_without_weights_saves_in_the_default_format(tmp_path: Path, backend: str) -> None:
    x = torch.randn(2, 3)
    compiled = tetrt_support.compile(ReluHalf(), arg_inputs=(x,), min_block_size=1, backend=backend)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    assert not isinstance(compiled.get_submodule("engine_0"), WeightsAsInputs)  # the bare engine block
    tetrt_support.save(compiled, tmp_path / "m.pt2", arg_inputs=(x,))
    loaded = torch.export.load(tmp_path / "m.pt2").module()
    y = torch.randn(2, 3)
    assert_same_outputs(compiled(y), loaded(y), atol=0, rtol=0)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_complex_rope_without_weights_saves_with_keyword_inputs(tmp_path: Path, backend: str) -> None:
    model = KeywordRoPE()
    compiled = tetrt_support.compile(model, kwarg_inputs=_rope_inputs(), min_block_size=1, backend=backend)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    assert not isinstance(compiled.get_submodule("engine_0"), WeightsAsInputs)
    tetrt_support.save(compiled, tmp_path / "rope.pt2", kwarg_inputs=_rope_inputs())
    loaded = torch.export.load(tmp_path / "rope.pt2").module()
    other = _rope_inputs(seed=1)
    assert_same_outputs(compiled(**other), loaded(**other))
    assert_same_outputs(model(**other), loaded(**other))


@pytest.mark.filterwarnings("error")
def test_zoo_complex_rope_saves_with_keyword_inputs(tmp_path: Path) -> None:
    model = zoo.build_model("complex_rope").eval()
    (xq, xk), _ = zoo.example_inputs("complex_rope", model)
    compiled = tetrt_support.compile(model, kwarg_inputs={"xq": xq, "xk": xk}, min_block_size=1)
    tetrt_support.save(compiled, tmp_path / "rope.pt2", kwarg_inputs={"xq": xq, "xk": xk})
    loaded = torch.export.load(tmp_path / "rope.pt2").module()
    (oq, ok), _ = zoo.example_inputs("complex_rope", model, seed=3)
    assert_same_outputs(compiled(xq=oq, xk=ok), loaded(xq=oq, xk=ok))


def _relu_half_block() -> torch.fx.GraphModule:
    return make_fx(lambda x: torch.relu(x) * 0.5)(torch.randn(2, 3))


@pytest.mark.parametrize("engine", RUNNABLE_ENGINES)
def test_every_engine_block_keeps_the_graph_it_was_built_from(engine: str) -> None:
    block = _relu_half_block()
    built = get_engine(engine).build(block, [torch.randn(2, 3)])
    twin = built.as_pytorch()
    assert isinstance(twin, torch.fx.GraphModule)
    y = torch.randn(2, 3)
    assert_same_outputs(built(y), twin(y))


def test_an_engine_whose_blocks_keep_no_graph_is_refused() -> None:
    class Opaque(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    class NoGraphEngine(Engine):
        name = "no_graph"

        def build_block(self, block, example_inputs, dynamic_dims):
            return Opaque()

    with pytest.raises(TypeError, match="no_graph engine: build_block returned a Opaque without as_pytorch"):
        NoGraphEngine().build(_relu_half_block(), [torch.randn(2, 3)])


def test_tensorrt_block_keeps_its_graph_out_of_its_weights_and_keeps_scalars_0d() -> None:
    # torch_tensorrt does not run here: a stand-in engine that widens a 0-d output to (1,)
    weight = torch.randn(3)
    block = make_fx(lambda x: ((x * weight).sum(), x + 1))(torch.randn(3))
    assert scalar_outputs(block) == [True, False]

    class WideningEngine(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            total, plus = block(x)
            return total.reshape(1), plus

    built = TensorRTBlock(WideningEngine(), block)
    x = torch.randn(3)
    total, plus = built(x)
    assert total.shape == () and plus.shape == (3,)
    assert built.as_pytorch() is block
    assert not any(isinstance(m, torch.fx.GraphModule) for m in built.modules())  # refit cannot reach it
    assert keep_scalars_0d((torch.ones(1), torch.ones(1)), [False, True])[0].shape == (1,)


# --------------------------------------------------------------------------- 2. 0-d tensors
@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(
    "model, inputs",
    [
        (Times7(), (torch.tensor(3.0),)),  # 0-d in, 0-d out
        (SumAll(), (torch.randn(2, 3),)),  # 0-d out
        (ScalarMix(), (torch.randn(2, 3), torch.tensor(0.5))),  # both, beside a 2-d output
    ],
    ids=["times7", "sum", "mix"],
)
def test_0d_tensors_stay_0d_through_each_engine(backend: str, model: torch.nn.Module, inputs: tuple) -> None:
    compiled = tetrt_support.compile(model, arg_inputs=inputs, min_block_size=1, backend=backend)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    other = tuple(torch.randn(x.shape) for x in inputs)
    assert_same_outputs(model(*other), compiled(*other))


@pytest.mark.parametrize("engine", RUNNABLE_ENGINES)
def test_each_engine_block_takes_and_returns_0d_tensors(engine: str) -> None:
    block = make_fx(lambda s, x: (s * 7, (x * s).sum(), x - s))(torch.tensor(3.0), torch.randn(2, 3))
    device = "cuda" if engine == "tensorrt" else "cpu"
    built = get_engine(engine).build(block, [torch.tensor(3.0, device=device), torch.randn(2, 3, device=device)])
    s, x = torch.tensor(-1.5, device=device), torch.randn(2, 3, device=device)
    assert_same_outputs(block(s, x), built(s, x))


# --------------------------------------------------------------------------- 3. torch_executed_ops
def _conv_relu() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()


def _image(seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.filterwarnings("error")  # every spelling matches: no warning
@pytest.mark.parametrize(
    "spelling",
    [
        "torch.ops.aten.convolution.default",
        "aten.convolution.default",
        "aten::convolution",
        torch.ops.aten.convolution,
        torch.ops.aten.convolution.default,
    ],
    ids=["torch.ops-string", "aten-string", "schema-string", "OpOverloadPacket", "OpOverload"],
)
def test_torch_executed_ops_names_the_core_aten_op_a_conv2d_decomposes_to(spelling) -> None:
    model = _conv_relu()
    compiled = tetrt_support.compile(model, arg_inputs=(_image(),), min_block_size=1, torch_executed_ops={spelling})
    assert [(b.kind, b.ops) for b in compiled.blocks()] == [
        ("fallback", ("aten.conv2d.default",)),
        ("engine", ("aten.relu.default",)),
    ]
    assert_same_outputs(model(_image(1)), compiled(_image(1)))


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(
    "bias, spelling",
    [
        (True, torch.ops.aten.addmm),
        (True, torch.ops.aten.addmm.default),
        (True, "aten::t"),
        (True, "aten.permute.default"),  # what aten.t becomes in core ATen
        (False, "torch.ops.aten.mm.default"),
    ],
    ids=["addmm-packet", "addmm-overload", "t-schema-string", "permute", "mm-without-bias"],
)
def test_torch_executed_ops_names_the_core_aten_ops_of_a_linear(bias: bool, spelling) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=bias), torch.nn.Tanh()).eval()
    x = torch.randn(3, 4)
    compiled = tetrt_support.compile(model, arg_inputs=(x,), min_block_size=1, torch_executed_ops={spelling})
    assert [(b.kind, b.ops) for b in compiled.blocks()] == [
        ("fallback", ("aten.linear.default",)),
        ("engine", ("aten.tanh.default",)),
    ]
    assert_same_outputs(model(x), compiled(x))


def test_a_torch_executed_ops_entry_that_matches_nothing_warns_naming_it() -> None:
    model = _conv_relu()
    # aten.mm: what a linear WITHOUT bias becomes; there is none here (and conv2d is no mm)
    ops = {"aten.mm.default", torch.ops.aten.relu}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = tetrt_support.compile(model, arg_inputs=(_image(),), min_block_size=1, torch_executed_ops=ops)
    messages = [str(w.message) for w in caught if "torch_executed_ops" in str(w.message)]
    assert messages == [
        "torch_executed_ops: torch.ops.aten.mm.default matches no op of the graph, before or after its "
        "decomposition to core ATen; it forces nothing into PyTorch"
    ]
    assert [b.kind for b in compiled.blocks()] == ["engine", "fallback"]  # relu, which matched, ran in PyTorch


def test_a_misspelt_torch_executed_ops_entry_still_raises() -> None:
    with pytest.raises(ValueError, match=r"'aten::convolutio' names no op"):
        tetrt_support.compile(_conv_relu(), arg_inputs=(_image(),), torch_executed_ops={"aten::convolutio"})


def test_decomposed_ops_of_composite_and_core_nodes() -> None:
    gm = torch.export.export(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(144, 2)), (_image(),)).module()
    by_target = {n.target: decomposed_ops(n) for n in gm.graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    assert aten.convolution.default in by_target[aten.conv2d.default]
    assert {aten.t.default, aten.addmm.default, aten.permute.default} <= by_target[aten.linear.default]
    assert aten.view.default in by_target[aten.flatten.using_ints]
    settings = CompilationSettings(torch_executed_ops={torch.ops.aten.addmm})
    linear = next(n for n in gm.graph.nodes if n.target is aten.linear.default)
    assert settings.matching_executed_ops(linear) == {torch.ops.aten.addmm}


# --------------------------------------------------------------------------- random ops
class _Noisy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x) * 2 + torch.randn_like(x)) * 0.5


class _Dropout(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(torch.relu(x) * 2, p=0.5, training=True) - 1


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("model", [_Noisy(), _Dropout()], ids=["randn_like", "dropout"])
def test_a_model_with_a_random_op_compiles_with_default_settings(backend: str, model: torch.nn.Module) -> None:
    """The whole-program check runs ep.module() and the compiled module from one generator
    state (the caller's is left as it was); random ops stay in PyTorch, so under the same
    torch.manual_seed the compiled module draws what the model draws."""
    x = torch.randn(4, 8)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    compiled = tetrt_support.compile(model, arg_inputs=(x,), backend=backend, min_block_size=1)
    assert torch.equal(torch.get_rng_state(), before)
    random_ops = [b for b in compiled.blocks() if any("rand" in op or "dropout" in op or "bernoulli" in op
                                                      for op in b.ops)]
    assert random_ops and all(b.kind == "fallback" for b in random_ops)
    torch.manual_seed(7)
    expected = model(x)
    torch.manual_seed(7)
    assert_same_outputs(expected, compiled(x))


# --------------------------------------------------------------------------- refit, as Torch-TensorRT spells it
class _TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class _TwoLayersDoubled(_TwoLayers):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


@pytest.mark.parametrize("in_place", [False, True])
def test_refit_takes_torch_tensorrt_keywords_and_verifies_the_output(in_place: bool) -> None:
    from tetrt_support.compiler.refit import RefitVerificationError

    torch.manual_seed(0)
    x = torch.randn(2, 6)
    compiled = tetrt_support.compile(_TwoLayers().eval(), arg_inputs=(x,), min_block_size=1)
    new = _TwoLayers().eval()
    refitted = tetrt_support.refit_module_weights(compiled_module=compiled, new_weight_module=new, arg_inputs=(x,),
                                                  verify_output=True, in_place=in_place)
    assert (refitted is compiled) == in_place
    with torch.no_grad():
        assert_same_outputs(new(x), refitted(x))
    # same weights, another computation: the verification names the difference, nothing changes
    other = _TwoLayersDoubled().eval()
    other.load_state_dict(_TwoLayers().state_dict())
    before = {k: v.clone() for k, v in compiled.state_dict().items()}
    with pytest.raises(RefitVerificationError, match="does not match new_weight_module on the given inputs"):
        tetrt_support.refit_module_weights(compiled, new_weight_module=other, arg_inputs=(x,), verify_output=True,
                                           in_place=True)
    assert all(torch.equal(before[k], v) for k, v in compiled.state_dict().items())
    with pytest.raises(TypeError, match="once, as new_weights or new_weight_module"):
        tetrt_support.refit_module_weights(compiled, new.state_dict(), new_weight_module=new)
    with pytest.raises(TypeError, match="needs arg_inputs"):
        tetrt_support.refit_module_weights(compiled, new_weight_module=new, verify_output=True)


# --------------------------------------------------------------------------- save, as Torch-TensorRT spells it
def test_save_takes_inputs_or_none_for_a_static_module(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _TwoLayers().eval()
    x = torch.randn(2, 6)
    compiled = tetrt_support.compile(model, arg_inputs=(x,), min_block_size=1)
    tetrt_support.save(compiled, tmp_path / "inputs.ep", inputs=[x])
    tetrt_support.save(compiled, tmp_path / "none.ep")
    for name in ("inputs.ep", "none.ep"):
        with torch.no_grad():
            assert_same_outputs(model(x), torch.export.load(tmp_path / name).module()(x))
    with pytest.raises(TypeError, match="inputs is another name for arg_inputs"):
        tetrt_support.save(compiled, tmp_path / "both.ep", inputs=[x], arg_inputs=(x,))


def test_save_without_inputs_of_a_dynamic_module_asks_for_them(tmp_path: Path) -> None:
    x = torch.randn(3, 6)
    batch = torch.export.Dim("batch", min=1, max=8)
    compiled = tetrt_support.compile(_TwoLayers().eval(), arg_inputs=(x,), dynamic_shapes=({0: batch},),
                                     min_block_size=1)
    with pytest.raises(TypeError, match="compiled with dynamic dims; pass arg_inputs/kwarg_inputs and dynamic_shapes"):
        tetrt_support.save(compiled, tmp_path / "m.ep")
