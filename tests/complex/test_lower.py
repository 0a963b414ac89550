"""lower(): RoPE end to end, dynamic shapes, the call signature, state, complex I/O."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim
from torch.utils import _pytree as pytree

from tests.complex.complex_testing import STRATEGIES, export, pack
from tests.models import DC, NT, register_case_dataclass
from tetrt_support.complex import complex_nodes, lower, retrace_preserving_signature


def rope_freqs(seq: int, half_dim: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / theta ** (torch.arange(half_dim).float() / half_dim)
    return torch.polar(torch.ones(seq, half_dim), torch.outer(torch.arange(seq).float(), freqs))


class Rope(nn.Module):
    """Llama-style complex RoPE: a non-persistent complex buffer sliced to the sequence."""

    def __init__(self, dim: int = 8, max_seq: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("freqs_cis", rope_freqs(max_seq, dim // 2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        f = self.freqs_cis[: x.shape[1]]
        return torch.view_as_real(xc * f).flatten(-2).type_as(x)


class PolarRope(nn.Module):
    """RoPE whose frequencies are built in forward with torch.polar (HF Llama 4 style)."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(dim // 2).float() / (dim // 2)))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, :, None].float() * self.inv_freq
        freqs = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(-2)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rope_static(strategy: str) -> None:
    model, x = Rope(), torch.randn(2, 10, 8)
    ep = export(model, (x,))
    names = [n.name for n in complex_nodes(ep.module())]
    assert names == ["freqs_cis", "view_as_complex", "slice_1", "mul", "view_as_real"]
    gm = lower(ep, strategy)
    assert complex_nodes(gm) == []
    torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rope_dynamic_batch_and_sequence(strategy: str) -> None:
    model = Rope()
    shapes = {"x": {0: Dim("batch", max=8), 1: Dim("seq", max=16)}}
    ep = export(model, (torch.randn(2, 10, 8),), dynamic_shapes=shapes)
    gm = lower(ep, strategy)
    assert complex_nodes(gm) == []
    for batch, seq in [(2, 10), (3, 5), (1, 16), (5, 2)]:
        x = torch.randn(batch, seq, 8)
        torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)
    # every node carries meta["val"] for later passes, and the symbols survived: the
    # output's meta value still has symbolic batch and sequence
    assert all("val" in n.meta for n in gm.graph.nodes if n.op in ("placeholder", "get_attr", "call_function")
               and n.target is not torch.ops.aten._assert_tensor_metadata.default)
    (out,) = gm.graph.find_nodes(op="output")[0].args[0]
    assert all(isinstance(s, torch.SymInt) for s in out.meta["val"].shape[:2])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_polar_rope_dynamic(strategy: str) -> None:
    model = PolarRope()
    x, pos = torch.randn(2, 6, 8), torch.arange(6).expand(2, 6)
    shapes = {"x": {0: Dim("b", max=8), 1: Dim("s", max=64)}, "positions": {0: Dim("b", max=8), 1: Dim("s", max=64)}}
    ep = export(model, (x, pos), dynamic_shapes=shapes)
    assert {str(n.target) for n in complex_nodes(ep.module())} >= {"aten.polar.default", "aten.mul.Tensor"}
    gm = lower(ep, strategy)
    for b, s in [(2, 6), (3, 9)]:
        x, pos = torch.randn(b, s, 8), torch.randint(0, 100, (b, s))
        torch.testing.assert_close(gm(x, pos), model(x, pos), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_state_dict_keys_and_buffer_names_survive(strategy: str) -> None:
    model = Rope()
    ep = export(model, (torch.randn(2, 10, 8),))
    before = ep.module()
    gm = lower(ep, strategy)
    assert list(gm.state_dict()) == list(before.state_dict()) == ["proj.weight", "proj.bias"]
    buffers = dict(gm.named_buffers())
    assert buffers["freqs_cis"].shape == (16, 4, 2) and buffers["freqs_cis"].dtype == torch.float32
    torch.testing.assert_close(buffers["freqs_cis"], torch.view_as_real(model.freqs_cis))
    assert isinstance(gm.get_parameter("proj.weight"), nn.Parameter)
    assert {n.target for n in gm.graph.find_nodes(op="get_attr")} == {"proj.weight", "proj.bias", "freqs_cis"}
    gm.load_state_dict(before.state_dict())  # loads without key errors


class ComplexParam(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, dtype=torch.complex64))
        self.sub = nn.Module()
        self.sub.register_buffer("b", torch.randn(4, dtype=torch.complex128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x * self.w).to(torch.complex128) + self.sub.b).abs()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_complex_parameter_and_nested_buffer(strategy: str) -> None:
    model, x = ComplexParam(), torch.randn(3, 4)
    gm = lower(export(model, (x,)), strategy)
    assert list(gm.state_dict()) == ["w", "sub.b"]
    assert isinstance(gm.w, nn.Parameter) and gm.w.shape == (4, 2) and gm.sub.b.dtype == torch.float64
    torch.testing.assert_close(gm(x), model(x), rtol=1e-6, atol=1e-6)


register_case_dataclass()  # Structured("dataclass") returns a DC


class Structured(nn.Module):
    """Interior complex region; real inputs (one of them keyword) and a structured output."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.register_buffer("f", rope_freqs(4, 4), persistent=False)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> object:
        y = torch.view_as_real(torch.view_as_complex(x.reshape(4, 4, 2)) * self.f).reshape(1, 32) * scale
        z = y.sum(-1)
        return {
            "tensor": lambda: y,
            "tuple": lambda: (y, z),
            "dict": lambda: {"y": y, "z": z},
            "namedtuple": lambda: NT(y, z),
            "dataclass": lambda: DC(y, z),
            "nested": lambda: {"pair": (y, [z, y]), "dc": DC(z, y)},
        }[self.kind]()


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("kind", ["tensor", "tuple", "dict", "namedtuple", "dataclass", "nested"])
def test_call_signature_and_output_structure(kind: str, strategy: str) -> None:
    model = Structured(kind)
    x, scale = torch.randn(32), torch.tensor(2.0)
    ep = export(model, (x,), kwargs={"scale": scale})
    gm = lower(ep, strategy)
    expected = ep.module()(x, scale=scale)
    got = gm(x, scale=scale)
    assert type(got) is type(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert got_spec == expected_spec
    torch.testing.assert_close(got_leaves, expected_leaves, rtol=1e-5, atol=1e-5)
    if kind == "tensor":
        assert got.shape == (1, 32)  # not silently flattened to [32]
    # the keyword input keeps its name in the generated signature
    assert [p.name for p in gm.graph.find_nodes(op="placeholder")] == ["x", "scale"]


class ComplexIO(nn.Module):
    def forward(self, z: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return z * z.conj() + r, (z * r).abs()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_complex_inputs_and_outputs_are_packed_and_recorded(strategy: str) -> None:
    model = ComplexIO()
    z, r = torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 4)
    ep = export(model, (z,), kwargs={"r": r})
    gm = lower(ep, strategy)
    assert gm.meta["tetrt_complex_io"] == {"inputs": [torch.complex64, None], "outputs": [torch.complex64, None]}
    assert complex_nodes(gm) == []
    got = gm(torch.view_as_real(z), r=r)
    torch.testing.assert_close(got, pack(model(z, r)), rtol=1e-5, atol=1e-5)
    assert isinstance(got, tuple) and got[0].shape == (3, 4, 2)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_dynamic_complex_input(strategy: str) -> None:
    model = ComplexIO()
    z, r = torch.randn(3, 4, dtype=torch.complex64), torch.randn(3, 4)
    ep = export(model, (z, r), dynamic_shapes=({0: Dim("n")}, {0: Dim("n")}))
    gm = lower(ep, strategy)
    z, r = torch.randn(6, 4, dtype=torch.complex64), torch.randn(6, 4)
    torch.testing.assert_close(gm(torch.view_as_real(z), r), pack(model(z, r)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_graph_module_input_is_not_modified(strategy: str) -> None:
    model, x = Rope(), torch.randn(2, 10, 8)
    source = export(model, (x,)).module()
    n_complex = len(complex_nodes(source))
    gm = lower(source, strategy)
    assert len(complex_nodes(source)) == n_complex and source.freqs_cis.is_complex()
    torch.testing.assert_close(gm(x), source(x), rtol=1e-5, atol=1e-5)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.register_buffer("f", rope_freqs(16, 4), persistent=False)

    def rope(self, t: torch.Tensor) -> torch.Tensor:
        tc = torch.view_as_complex(t.reshape(*t.shape[:-1], -1, 2))
        return torch.view_as_real(tc * self.f[: t.shape[-2]]).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)


def test_retrace_keeps_linear_and_sdpa() -> None:
    """pre_dispatch make_fx keeps aten.linear and scaled_dot_product_attention intact."""
    model, x = Attention(), torch.randn(2, 6, 8)
    ep = export(model, (x,), dynamic_shapes={"x": {1: Dim("s", max=16)}})
    for strategy in STRATEGIES:
        gm = lower(ep, strategy)
        targets = {str(n.target) for n in gm.graph.nodes}
        assert {"aten.linear.default", "aten.scaled_dot_product_attention.default"} <= targets, strategy
        for s in (6, 11):
            x = torch.randn(2, s, 8)
            torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)


def test_same_numbers_as_torch_complex_decomposition() -> None:
    """torch >= 2.14 ships its own retrace (a ComplexTensor subclass under an Interpreter);
    both of our strategies agree with it and with eager on RoPE."""
    mod = pytest.importorskip("torch._functorch._aot_autograd.complex_decomposition")  # torch < 2.14 lacks it
    model, x = Rope(), torch.randn(2, 10, 8)
    ep = export(model, (x,))
    theirs = retrace_preserving_signature(ep.module(), lambda g: mod.decompose_complex_in_graph(g, [x]))
    reference = theirs(x)
    torch.testing.assert_close(reference, model(x), rtol=1e-6, atol=1e-6)
    for strategy in STRATEGIES:
        torch.testing.assert_close(lower(ep, strategy)(x), reference, rtol=1e-6, atol=1e-6)


def test_bad_arguments_name_what_was_wrong() -> None:
    ep = export(Rope(), (torch.randn(2, 10, 8),))
    with pytest.raises(ValueError, match="strategy must be 'rewrite' or 'retrace', got 'trace'"):
        lower(ep, "trace")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unsupported must be 'raise' or 'fallback', got 'skip'"):
        lower(ep, unsupported="skip")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ExportedProgram or a torch.fx.GraphModule, got Rope"):
        lower(Rope())  # type: ignore[arg-type]


class WrappedRegions(nn.Module):
    """Complex values made under no_grad and autocast(enabled=False): export wraps them in
    wrap_with_set_grad_enabled / wrap_with_autocast submodules (as HF Llama 4 on torch 2.11)."""

    def __init__(self) -> None:
        super().__init__()
        self.inv = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            ang = pos[:, None].float() * self.inv
            f = torch.polar(torch.ones_like(ang), ang)
        with torch.autocast("cpu", enabled=False):
            g = f * 2
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * g).flatten(-2)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_complex_values_inside_grad_and_autocast_wrappers(strategy: str) -> None:
    model, x, pos = WrappedRegions(), torch.randn(5, 8), torch.arange(5)
    ep = export(model, (x, pos))
    hops = {n.target.name() for n in ep.module().graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)}
    assert hops == {"wrap_with_set_grad_enabled", "wrap_with_autocast"}
    gm = lower(ep, strategy)
    assert complex_nodes(gm) == []
    assert not any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes)
    assert list(gm.state_dict()) == ["inv"]
    torch.testing.assert_close(gm(x, pos), model(x, pos), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_lowered_nodes_keep_the_source_line_of_the_complex_op(strategy: str) -> None:
    """Partitioners and error messages point at the user's line, also after lowering."""
    gm = lower(export(Rope(), (torch.randn(2, 10, 8),)), strategy)
    made = [n for n in gm.graph.nodes if n.target in (torch.ops.aten.stack.default, torch.ops.aten.sub.Tensor)]
    assert len(made) == 2
    assert all("torch.view_as_real(xc * f)" in n.meta["stack_trace"] for n in made)
