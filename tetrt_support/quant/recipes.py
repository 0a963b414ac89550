"""Recipe name -> the (input, weight, grad) quantizers of a quantized Linear, with TE's defaults.

Recipes ``fp8_current``, ``fp8_block``, ``mxfp8`` and ``nvfp4`` are TransformerEngine's of
those names (``transformer_engine.common.recipe``) with its per-role settings and GEMM
settings (:class:`MMParams`). A :class:`Recipe` records its name and non-default options
(``str(recipe)``: ``nvfp4(row_scaled_activation=True)``) and compares by them; each call
builds fresh value quantizers. Per-recipe details: ``docs/architecture.md`` ("Module notes").
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tetrt_support.quant.base import Quantizer


@dataclass(frozen=True)
class MMParams:
    """TE's per-GEMM setting: ``use_split_accumulator=False`` is FP8 fast accumulation."""

    use_split_accumulator: bool = True


_SPLIT = (MMParams(), MMParams(), MMParams())


@dataclass(frozen=True)
class Recipe:
    """A named way to build a Linear's input, weight and gradient quantizers.

    Identified by ``name`` and ``options`` (the non-default options, sorted by name): the
    builders are not compared, two recipes built alike are equal."""

    name: str
    input: Callable[[], Quantizer] = field(compare=False, repr=False)
    weight: Callable[[], Quantizer] = field(compare=False, repr=False)
    grad: Callable[[], Quantizer] = field(compare=False, repr=False)
    options: tuple[tuple[str, Any], ...] = ()
    #: (fprop, dgrad, wgrad) GEMM settings
    gemms: tuple[MMParams, MMParams, MMParams] = field(default=_SPLIT, compare=False, repr=False)

    @property
    def fast_accum(self) -> tuple[bool, bool, bool]:
        """``use_fast_accum`` of the (fprop, dgrad, wgrad) FP8 GEMMs."""
        return tuple(not p.use_split_accumulator for p in self.gemms)  # type: ignore[return-value]

    def quantizers(self) -> tuple[Quantizer, Quantizer, Quantizer]:
        """Fresh (input, weight, grad) quantizers."""
        return self.input(), self.weight(), self.grad()

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.options)})"

    def __reduce__(self) -> tuple:
        """Pickle a named recipe as ``get_recipe(name, **options)`` (its builders are lambdas,
        which pickle cannot store), when that rebuilds it: the same quantizers and GEMM
        settings. Any other Recipe pickles field by field (its builders must be picklable)."""
        if self.name in _RECIPES:
            try:
                rebuilt = get_recipe(self.name, **dict(self.options))
                same = rebuilt.gemms == self.gemms and rebuilt.quantizers() == self.quantizers()
            except (TypeError, ValueError):
                same = False
            if same:
                return (_recipe_from_options, (self.name, self.options))
        return super().__reduce__()


def _gemms(name: str, fprop: Any, dgrad: Any, wgrad: Any) -> tuple[MMParams, MMParams, MMParams]:
    for role, value in (("fp8_gemm_fprop", fprop), ("fp8_gemm_dgrad", dgrad), ("fp8_gemm_wgrad", wgrad)):
        if not isinstance(value, MMParams):
            raise TypeError(f"{name} recipe: {role} must be an MMParams, got {type(value).__name__}")
    return fprop, dgrad, wgrad


def _fp8_current(
    *,
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=False),
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True),
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True),
) -> Recipe:
    from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer as Q

    gemms = _gemms("fp8_current", fp8_gemm_fprop, fp8_gemm_dgrad, fp8_gemm_wgrad)
    return Recipe("fp8_current", Q, Q, lambda: Q(torch.float8_e5m2), gemms=gemms)


def _fp8_block(
    *,
    fp8_gemm_fprop: MMParams = MMParams(),
    fp8_gemm_dgrad: MMParams = MMParams(),
    fp8_gemm_wgrad: MMParams = MMParams(),
) -> Recipe:
    from tetrt_support.quant.float8_blockwise_tensor import Float8BlockQuantizer as Q

    gemms = _gemms("fp8_block", fp8_gemm_fprop, fp8_gemm_dgrad, fp8_gemm_wgrad)
    for role, params in zip(("fprop", "dgrad", "wgrad"), gemms):
        if not params.use_split_accumulator:  # TE's Float8BlockScaling.__post_init__
            raise ValueError(f"fp8_block recipe: split accumulator required for {role} (fp8_gemm_{role})")
    return Recipe("fp8_block", lambda: Q(block_scaling_dim=1), lambda: Q(block_scaling_dim=2),
                  lambda: Q(block_scaling_dim=1), gemms=gemms)


def _mxfp8(*, enable_2d_quantization: bool = False) -> Recipe:
    from tetrt_support.quant.mxfp8_tensor import MXFP8Quantizer as Q

    return Recipe("mxfp8", Q, lambda: Q(with_2d_quantization=enable_2d_quantization), Q)


def _nvfp4(
    *,
    disable_rht: bool = False,
    disable_stochastic_rounding: bool = False,
    disable_2d_quantization: bool = False,
    row_scaled_activation: bool = False,
    nvfp4_4over6: str = "none",
    nvfp4_4over6_e4m3_use_256: str = "all",
    nvfp4_4over6_err_mode: str = "MAE",
    rht_any_input_dtype: bool = False,
    nvfp4_4over6_err_use_fast_math: bool = False,
) -> Recipe:
    """TE's ``NVFP4BlockScaling`` roles (``quantization.py``): 4over6 never applies to the
    gradient; its scope names which of input/weight use it and which of those bound the
    global scale by 256; ``row_scaled_activation`` row-scales the forward input."""
    from tetrt_support.quant.nvfp4_tensor import NVFP4Quantizer as Q

    scopes = ("none", "weights", "activations", "all")
    for name, value in (("nvfp4_4over6", nvfp4_4over6), ("nvfp4_4over6_e4m3_use_256", nvfp4_4over6_e4m3_use_256)):
        if value not in scopes:
            raise ValueError(f"nvfp4 recipe: {name} must be one of {scopes}, got {value!r}")

    if nvfp4_4over6_err_mode not in ("MAE", "MSE"):  # exact: TE upper-cases only its env default
        raise ValueError(f"nvfp4 recipe: nvfp4_4over6_err_mode must be 'MAE' or 'MSE', got {nvfp4_4over6_err_mode!r} "
                         "(TE's NVFP4BlockScaling asserts the field as given; the quantizer alone upper-cases it)")

    def in_scope(scope: str, role: str) -> bool:
        return {"none": False, "all": True, "weights": role == "weight", "activations": role != "weight"}[scope]

    def four_over_six(role: str) -> dict[str, Any]:
        if not in_scope(nvfp4_4over6, role):
            return {}
        return {"nvfp4_use_4over6": True, "nvfp4_4over6_err_mode": nvfp4_4over6_err_mode,
                "nvfp4_e4m3_max": 256 if in_scope(nvfp4_4over6_e4m3_use_256, role) else 448,
                "nvfp4_4over6_err_use_fast_math": nvfp4_4over6_err_use_fast_math}

    rht = {"with_rht": not disable_rht, "with_post_rht_amax": not disable_rht, "rht_any_input_dtype": rht_any_input_dtype}
    return Recipe(
        "nvfp4",
        lambda: Q(**rht, row_scaled_nvfp4=row_scaled_activation, **four_over_six("input")),
        lambda: Q(with_2d_quantization=not disable_2d_quantization, **four_over_six("weight")),
        lambda: Q(**rht, stochastic_rounding=not disable_stochastic_rounding),
    )


_RECIPES: dict[str, Callable[..., Recipe]] = {
    "fp8_current": _fp8_current,
    "fp8_block": _fp8_block,
    "mxfp8": _mxfp8,
    "nvfp4": _nvfp4,
}
RECIPES: tuple[str, ...] = tuple(_RECIPES)


def get_recipe(name: str, **options: Any) -> Recipe:
    """The recipe called ``name`` (``options``: that recipe's TE switches); a ValueError
    names the valid recipes, a TypeError an option the recipe does not have."""
    if name not in _RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}")
    factory = _RECIPES[name]
    recipe = factory(**options)
    defaults = inspect.signature(factory).parameters
    changed = tuple(sorted((k, v) for k, v in options.items() if v != defaults[k].default))
    return dataclasses.replace(recipe, options=changed)


def _recipe_from_options(name: str, options: tuple[tuple[str, Any], ...]) -> Recipe:
    """Unpickle a named recipe (see :meth:`Recipe.__reduce__`)."""
    return get_recipe(name, **dict(options))


def as_recipe(recipe: str | Recipe) -> Recipe:
    """``recipe`` itself, or the recipe of that name with its defaults (a TypeError names anything else)."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str):
        return get_recipe(recipe)
    raise TypeError(f"recipe must be a recipe name or a Recipe (from get_recipe), got {type(recipe).__name__}")
