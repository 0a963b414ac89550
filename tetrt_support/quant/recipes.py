"""Recipe name -> the (input, weight, grad) quantizers of a quantized Linear.

The pairings follow TransformerEngine's reference recipes (DESIGN.md section 4):

- ``fp8_current`` (Float8CurrentScaling, HYBRID format): per-tensor current scaling,
  E4M3 for activations and weights, E5M2 (more range) for gradients;
- ``fp8_block`` (Float8BlockScaling): 1x128 blocks for activations and gradients,
  128x128 blocks for weights, E4M3 throughout, power-of-2 scales;
- ``mxfp8`` (MXFP8BlockScaling): 1x32 blocks with E8M0 scales, E4M3 throughout;
- ``nvfp4`` (NVFP4BlockScaling): E2M1 with 1x16 E4M3 block scales and a global scale.
  TransformerEngine additionally applies a random Hadamard transform to the wgrad
  operands and stochastic rounding to gradients; neither is modelled in this recipe.

Each call builds fresh quantizers (value quantizers: equal recipes give equal, hence
compile-cache-sharing, quantizers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tetrt_support.quant.quantizer import Quantizer


@dataclass(frozen=True)
class Recipe:
    """A named way to build a Linear's input, weight and gradient quantizers."""

    name: str
    input: Callable[[], Quantizer]
    weight: Callable[[], Quantizer]
    grad: Callable[[], Quantizer]

    def quantizers(self) -> tuple[Quantizer, Quantizer, Quantizer]:
        """Fresh (input, weight, grad) quantizers."""
        return self.input(), self.weight(), self.grad()


def _fp8_current() -> Recipe:
    from tetrt_support.quant.float8 import Float8CurrentScalingQuantizer as Q

    return Recipe("fp8_current", Q, Q, lambda: Q(torch.float8_e5m2))


def _fp8_block() -> Recipe:
    from tetrt_support.quant.blockwise import Float8BlockQuantizer as Q

    return Recipe("fp8_block", Q, lambda: Q(block_scaling_dim=2), Q)


def _mxfp8() -> Recipe:
    from tetrt_support.quant.mxfp8 import MXFP8Quantizer as Q

    return Recipe("mxfp8", Q, Q, Q)


def _nvfp4() -> Recipe:
    from tetrt_support.quant.nvfp4 import NVFP4Quantizer as Q

    return Recipe("nvfp4", Q, Q, Q)


_RECIPES: dict[str, Callable[[], Recipe]] = {
    "fp8_current": _fp8_current,
    "fp8_block": _fp8_block,
    "mxfp8": _mxfp8,
    "nvfp4": _nvfp4,
}
RECIPES: tuple[str, ...] = tuple(_RECIPES)


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; a ValueError names the valid ones."""
    if name not in _RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}")
    return _RECIPES[name]()
