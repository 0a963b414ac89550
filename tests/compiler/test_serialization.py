"""save/load in the pickle format keeps a module's call signature: keyword inputs, pytree
outputs, weights (the exported-program format: test_save_load_formats.py)."""

from __future__ import annotations

import collections
import dataclasses
import sys
import types

import pytest
import torch
import torch.utils._pytree as pytree
from torch.fx.graph import _PyTreeCodeGen

from tests.assertions import assert_same_outputs
from tetrt_support.compiler.serialization import MissingSignatureType, load, save

Pair = collections.namedtuple("Pair", "first second")


@dataclasses.dataclass
class Stats:
    mean: torch.Tensor
    spread: torch.Tensor


pytree.register_dataclass(Stats)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)
        self.register_buffer("offset", torch.arange(3.0))

    def forward(self, x, *, scale, mask=None):
        h = self.proj(x) * scale + self.offset
        return {"pair": Pair(h, h.sum(-1)), "stats": Stats(h.mean(), h.std()), "nested": [h[:1], (mask * 2,)]}


def _inputs(batch: int = 2):
    return (torch.randn(batch, 4),), {"scale": torch.tensor(1.5), "mask": torch.randn(batch)}


@pytest.fixture(scope="module")
def exported():
    model = Model()
    args, kwargs = _inputs()
    batch = torch.export.Dim("batch")
    ep = torch.export.export(model, args, kwargs, dynamic_shapes={"x": {0: batch}, "scale": None, "mask": {0: batch}})
    return model, ep


def test_plain_torch_save_of_ep_module_fails(exported, tmp_path):
    _, ep = exported
    with pytest.raises(AttributeError, match="Can't pickle local object '_create_stateful_graph_module"):
        torch.save(ep.module(), tmp_path / "plain.pt")


def test_ep_module_round_trip_keeps_signature(exported, tmp_path):
    model, ep = exported
    module = ep.module()
    save(module, tmp_path / "m.pt", output_format="pickle")
    loaded = load(tmp_path / "m.pt", trusted=True)

    assert isinstance(loaded.graph._codegen, _PyTreeCodeGen)
    assert type(loaded).__mro__[1] is type(module).__mro__[1]  # torch.export's _StatefulGraphModule
    assert loaded.state_dict().keys() == module.state_dict().keys()
    args, kwargs = _inputs(batch=5)
    out = loaded(*args, **kwargs)
    assert isinstance(out["pair"], Pair) and isinstance(out["stats"], Stats)
    assert_same_outputs(model(*args, **kwargs), out, rtol=1.3e-6)
    assert_same_outputs(model(*args, **kwargs), loaded(args[0], mask=kwargs["mask"], scale=kwargs["scale"]), rtol=1.3e-6)


def test_loaded_ep_module_still_checks_its_keywords(exported, tmp_path):
    _, ep = exported
    save(ep.module(), tmp_path / "m.pt", output_format="pickle")
    loaded = load(tmp_path / "m.pt", trusted=True)
    args, kwargs = _inputs()
    with pytest.raises(ValueError, match=r"kwarg keyword mismatch.*\['scale', 'mask'\]"):
        loaded(args[0], scale=kwargs["scale"], maks=kwargs["mask"])
    with pytest.raises(NotImplementedError, match=r"Calling train\(\) is not supported yet"):
        loaded.train()


def test_model_output_round_trip(tmp_path):
    from transformers.modeling_outputs import BaseModelOutput

    class Encoder(torch.nn.Module):
        def forward(self, input_ids):
            hidden = torch.nn.functional.one_hot(input_ids, 6).float()
            return BaseModelOutput(last_hidden_state=hidden, hidden_states=(hidden, hidden * 2))

    ids = torch.tensor([[1, 2, 5]])
    ep = torch.export.export(Encoder(), (), {"input_ids": ids})
    save(ep.module(), tmp_path / "enc.pt", output_format="pickle")
    out = load(tmp_path / "enc.pt", trusted=True)(input_ids=ids)
    assert type(out) is BaseModelOutput
    assert_same_outputs(Encoder()(ids).hidden_states, out.hidden_states, rtol=1.3e-6)


def test_engine_blocks_round_trip(tmp_path):
    from torch.fx.experimental.proxy_tensor import make_fx

    from tetrt_support.compiler.engines import get_engine

    x = torch.randn(3, 4)
    block = make_fx(lambda x: (x.relu(), x * 2), tracing_mode="symbolic")(x)
    holder = torch.nn.ModuleDict({e: get_engine(e).build(block, [x], [{0: "batch"}]) for e in ("eager", "onnxruntime")})
    save(holder, tmp_path / "blocks.pt", output_format="pickle")
    loaded = load(tmp_path / "blocks.pt", trusted=True)
    other = torch.randn(6, 4)
    for name in ("eager", "onnxruntime"):
        assert_same_outputs((other.relu(), other * 2), loaded[name](other), rtol=1.3e-6)


def test_signature_type_missing_at_load(tmp_path):
    source = types.ModuleType("tetrt_vanishing_types")
    exec("import collections\nPoint = collections.namedtuple('Point', 'x y')", source.__dict__)
    sys.modules[source.__name__] = source
    try:

        class Split(torch.nn.Module):
            def forward(self, t):
                return source.Point(t + 1, t - 1)

        save(torch.export.export(Split(), (torch.randn(2),)).module(), tmp_path / "p.pt", output_format="pickle")
    finally:
        del sys.modules[source.__name__]
    with pytest.raises(MissingSignatureType, match="uses tetrt_vanishing_types.Point, which cannot be imported here"):
        load(tmp_path / "p.pt", trusted=True)


def test_signature_type_defined_in_a_function_is_refused_at_save(tmp_path):
    @dataclasses.dataclass
    class Local:
        value: torch.Tensor

    pytree.register_dataclass(Local)

    class Wrap(torch.nn.Module):
        def forward(self, t):
            return Local(t * 3)

    module = torch.export.export(Wrap(), (torch.randn(2),)).module()
    with pytest.raises(TypeError, match=r"Local, a class defined inside a function; load could never import it"):
        save(module, tmp_path / "local.pt", output_format="pickle")



def test_dataclass_not_registered_at_load(tmp_path):
    save(torch.export.export(Model(), *_inputs()).module(), tmp_path / "stats.pt", output_format="pickle")
    # As in a process that imports Stats but never registers it. (Popping the registry
    # entry: torch 2.14's _deregister_pytree_node raises KeyError on a dataclass
    # registered without a serialized_type_name.)
    node_def = pytree.SUPPORTED_NODES.pop(Stats)
    try:
        with pytest.raises(MissingSignatureType, match=r"Stats, which is not registered with torch.utils._pytree"):
            load(tmp_path / "stats.pt", trusted=True)
    finally:
        pytree.SUPPORTED_NODES[Stats] = node_def


def test_load_refuses_other_files(tmp_path):
    torch.save({"weights": torch.ones(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="was not written by tetrt_support.compiler.serialization.save"):
        load(tmp_path / "other.pt")


def test_unpicklable_hook_is_named(tmp_path):
    module = torch.nn.Linear(2, 2)
    gm = torch.fx.symbolic_trace(module)
    gm.register_forward_hook(lambda *a: None)
    with pytest.raises(TypeError, match="has a forward_hooks entry '.*<lambda>' that cannot be pickled"):
        save(gm, tmp_path / "h.pt", output_format="pickle")
    assert len(gm._forward_hooks) == 1  # save never changes the module it writes


class ComplexRope(torch.nn.Module):
    """Llama-style RoPE: a complex buffer, view_as_complex, complex multiply, view_as_real."""

    def __init__(self, max_seq: int = 16, head_dim: int = 8) -> None:
        super().__init__()
        freqs = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_seq).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def forward(self, q, *, k):
        freqs = self.freqs_cis[: q.shape[1]][None, :, None, :]
        qc = torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2))
        kc = torch.view_as_complex(k.reshape(*k.shape[:-1], -1, 2))
        return {"rotated": Pair(torch.view_as_real(qc * freqs).flatten(3), torch.view_as_real(kc * freqs).flatten(3))}


@pytest.mark.parametrize("backend", ["eager", "onnxruntime"])
def test_compiled_module_round_trip(backend, tmp_path):
    import tetrt_support

    model = ComplexRope()
    q, k = torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=16)
    dims = {0: batch, 1: seq}
    ep = torch.export.export(model, (q,), {"k": k}, dynamic_shapes={"q": dims, "k": dims})
    compiled = tetrt_support.compile(ep, backend=backend)
    save(compiled, tmp_path / "compiled.pt", output_format="pickle")
    loaded = load(tmp_path / "compiled.pt", trusted=True)

    assert type(loaded).__mro__[1] is type(compiled).__mro__[1]  # CompiledModule, with its methods
    assert loaded.blocks_summary() == compiled.blocks_summary()
    assert isinstance(loaded.graph._codegen, _PyTreeCodeGen)
    for q, k in [(q, k), (torch.randn(3, 7, 2, 8), torch.randn(3, 7, 2, 8))]:
        out = loaded(q, k=k)
        assert isinstance(out["rotated"], Pair)
        assert_same_outputs(model(q, k=k), out, rtol=1.3e-6)


def test_plain_torch_save_of_a_compiled_module_retraces_it(tmp_path):
    """Why save() exists: GraphModule.__reduce__ re-traces the generated code, so the
    compiled module comes back as a plain GraphModule with a plain CodeGen."""
    import tetrt_support

    model = ComplexRope()
    q, k = torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8)
    compiled = tetrt_support.compile(torch.export.export(model, (q,), {"k": k}), backend="eager")
    torch.save(compiled, tmp_path / "plain.pt")
    plain = torch.load(tmp_path / "plain.pt", weights_only=False)
    assert type(plain).__mro__[1] is torch.fx.GraphModule and not hasattr(plain, "blocks_summary")
    assert type(plain.graph._codegen) is torch.fx.graph.CodeGen

    save(compiled, tmp_path / "kept.pt", output_format="pickle")
    kept = load(tmp_path / "kept.pt", trusted=True)
    assert hasattr(kept, "blocks_summary") and isinstance(kept.graph._codegen, _PyTreeCodeGen)
    assert_same_outputs(model(q, k=k), kept(q, k=k), rtol=1.3e-6)
