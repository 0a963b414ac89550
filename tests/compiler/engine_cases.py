"""Small real engine blocks: ATen graphs traced from tiny functions, with dynamic dims.

Each case is traced with symbolic make_fx (or torch.export), so sizes inside the graph are
``sym_size`` values, as in blocks cut from a dynamically exported program. ``inputs`` and
``other_inputs`` differ in the dims named by ``dynamic_dims``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx


@dataclasses.dataclass
class BlockCase:
    name: str
    fn: Callable[..., Any]  # the eager reference
    block: fx.GraphModule
    inputs: list[torch.Tensor]
    other_inputs: list[torch.Tensor]
    dynamic_dims: list[dict[int, str]]


def _elementwise(x, y):
    return (x * y).sin() + torch.exp(-x.abs()) / (1 + y * y)


_W = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
_B = torch.randn(5, generator=torch.Generator().manual_seed(2))


def _linear(x):
    # _W/_B are captured as constants: the block reads them through get_attr.
    return F.linear(x, _W, _B).relu() @ _W


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _slicing(x, y):
    both = torch.cat([x[:, 1:3], y[:, :2]], dim=0)
    return torch.stack([both, both * 2], dim=-1)[:, ::2].flatten(1) + x.narrow(1, 0, 1).repeat(2, 1)


def _multi_output(x, idx):
    # pass-through input, int64 arithmetic, a bool 0-d tensor, a reduction
    return x, idx * 3 + 1, x.sum(-1), (x.mean() > 0), x[idx]


def _constant_output(x):
    return torch.ones(3, dtype=torch.float64) * 2, x + 1


class _TinyMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(4, 8)
        self.down = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.down(F.silu(self.up(x))) + x


def _symbolic(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> fx.GraphModule:
    return make_fx(fn, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*inputs)


def _cases() -> dict[str, Callable[[], BlockCase]]:
    def elementwise() -> BlockCase:
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        return BlockCase(
            "elementwise", _elementwise, _symbolic(_elementwise, [x, y]), [x, y],
            [torch.randn(6, 4), torch.randn(6, 4)], [{0: "batch"}, {0: "batch"}],
        )

    def linear() -> BlockCase:
        x = torch.randn(2, 3, 4)
        return BlockCase(
            "linear", _linear, _symbolic(_linear, [x]), [x], [torch.randn(5, 7, 4)], [{0: "batch", 1: "seq"}]
        )

    def sdpa() -> BlockCase:
        qkv = [torch.randn(2, 2, 5, 8) for _ in range(3)]
        other = [torch.randn(3, 2, 9, 8) for _ in range(3)]
        dims = [{0: "batch", 2: "seq"}] * 3
        return BlockCase("sdpa", _sdpa, _symbolic(_sdpa, qkv), qkv, other, dims)

    def slicing() -> BlockCase:
        x, y = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
        other = [torch.randn(7, 4, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)]
        return BlockCase("slicing", _slicing, _symbolic(_slicing, [x, y]), [x, y], other, [{0: "batch"}, {0: "batch"}])

    def multi_output() -> BlockCase:
        x, idx = torch.randn(4, 3), torch.tensor([0, 3, 2, 1])
        other = [torch.randn(6, 3), torch.tensor([1, 2, 3, 4, 5, 0])]
        return BlockCase(
            "multi_output", _multi_output, _symbolic(_multi_output, [x, idx]), [x, idx], other,
            [{0: "batch"}, {0: "batch"}],
        )

    def constant_output() -> BlockCase:
        x = torch.randn(2, 3, dtype=torch.float64)
        return BlockCase(
            "constant_output", _constant_output, _symbolic(_constant_output, [x]), [x],
            [torch.randn(4, 3, dtype=torch.float64)], [{0: "batch"}],
        )

    def exported_mlp() -> BlockCase:
        # A flat torch.export graph: parameters are lifted to placeholders (plain tensors in).
        mlp = _TinyMLP()
        x = torch.randn(2, 3, 4)
        batch = torch.export.Dim("batch")
        ep = torch.export.export(mlp, (x,), dynamic_shapes=({0: batch},))
        params = [p.detach() for p in mlp.parameters()]

        def reference(*flat):
            return torch.func.functional_call(mlp, dict(zip(dict(mlp.named_parameters()), flat[:-1])), flat[-1:])

        # ep.graph_module returns a tuple of user outputs; its inputs are params then x.
        return BlockCase(
            "exported_mlp", lambda *flat: (reference(*flat),), ep.graph_module, [*params, x],
            [*params, torch.randn(5, 3, 4)], [{}] * len(params) + [{0: "batch"}],
        )

    return {
        f.__name__: f
        for f in (elementwise, linear, sdpa, slicing, multi_output, constant_output, exported_mlp)
    }


CASES = _cases()
CASE_NAMES = tuple(CASES)


def make_block_cases() -> dict[str, BlockCase]:
    torch.manual_seed(0)
    return {name: make() for name, make in CASES.items()}


def assert_same_outputs(got: Any, expected: Any) -> None:
    """Same structure, dtypes and shapes; values equal to float tolerance."""
    got_leaves, got_spec = torch.utils._pytree.tree_flatten(got)
    exp_leaves, exp_spec = torch.utils._pytree.tree_flatten(expected)
    assert got_spec == exp_spec, f"output structure {got_spec} != {exp_spec}"
    for i, (g, e) in enumerate(zip(got_leaves, exp_leaves)):
        assert isinstance(g, torch.Tensor), f"output {i} is {type(g).__name__}"
        assert g.dtype == e.dtype and g.shape == e.shape, f"output {i}: {g.dtype}{tuple(g.shape)} != {e.dtype}{tuple(e.shape)}"
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
