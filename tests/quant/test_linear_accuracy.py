"""The quantized Linear's three GEMMs against the exact float64 products, per recipe.

Bit-exactness of each quantizer says nothing about whether the GEMMs read the right
copy the right way round: a column-wise operand read as its own transpose still gives a
tensor of the right shape when the matrix is square. So each product is checked against
float64 arithmetic on the unquantized values, within a bound that the format's rounding
explains (a swapped operand gives a relative error near sqrt(2)).
"""

from __future__ import annotations

import pytest
import torch

from tetrt_support.quant.linear import Linear
from tetrt_support.quant.recipes import RECIPES

#: relative Frobenius error allowed per recipe: a few units of the format's rounding
BOUND = {"fp8_current": 0.12, "fp8_block": 0.12, "mxfp8": 0.12, "nvfp4": 0.35}


def _relative(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact).norm() / exact.norm())


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("tokens,in_features,out_features", [(128, 128, 128), (64, 256, 128)])
def test_forward_dgrad_and_wgrad_are_the_exact_products_within_the_format(
    recipe: str, tokens: int, in_features: int, out_features: int
) -> None:
    layer = Linear(in_features, out_features, bias=False, recipe=recipe, dtype=torch.bfloat16)
    x = torch.randn(tokens, in_features, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    w, xd, dyd = layer.weight.detach().double(), x.detach().double(), dy.double()
    bound = BOUND.get(recipe, 0.12)
    errors = {
        "forward": _relative(y.detach(), xd @ w.t()),
        "dgrad": _relative(x.grad, dyd @ w),
        "wgrad": _relative(layer.weight.grad, dyd.t() @ xd),
    }
    assert all(e < bound for e in errors.values()), f"{recipe}: relative errors {errors} (bound {bound})"
