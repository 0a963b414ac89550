"""Constructor and recipe defaults equal TransformerEngine's, as one table: field -> TE's default -> ours.

TE's values are read from its source (NVIDIA/TransformerEngine): the quantizer constructors
in ``transformer_engine/pytorch/tensor/{float8_tensor,float8_blockwise_tensor,mxfp8_tensor,
nvfp4_tensor}.py``, the base ``Quantizer`` in ``pytorch/quantized_tensor.py`` (``internal``
and ``optimize_for_gemm`` start False), the recipes in ``common/recipe/__init__.py`` and the
per-role quantizers TE's recipe states build in ``pytorch/quantization.py``.

Deliberate differences in SPELLING, not in behaviour (each default still TE's):
``rowwise_usage``/``columnwise_usage`` are TE's ``rowwise``/``columnwise`` arguments (the
attributes TE stores them in carry these names); ``rht_sign_mask`` (TE's mask) stands for
``with_random_sign_mask=True``; the amax-reduction group is a per-call ``quantize`` option
(a value quantizer must not hold a ProcessGroup), so there is no ``with_amax_reduction``
field; ``fp8_dtype`` has a default (E4M3, TE's forward format) where TE requires it, and
``Float8BlockQuantizer``'s usages default to True where TE requires them.

One field is not TE's: ``NVFP4Quantizer.rht_any_input_dtype`` chooses between TE's two
behaviours for the Hadamard transform on non-bf16 input (its kernels refuse it, its
reference quantizer accepts it); the default is the kernels' refusal.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from tetrt_support.quant import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from tetrt_support.quant.recipes import get_recipe

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2

# (class, field, TE's default, where TE says so)
TE_DEFAULTS = [
    (Float8Quantizer, "rowwise_usage", True, "float8_tensor.py Float8Quantizer(rowwise=True)"),
    (Float8Quantizer, "columnwise_usage", True, "float8_tensor.py Float8Quantizer(columnwise=True)"),
    (Float8Quantizer, "margin", 0, "recipe DelayedScaling.margin"),
    (Float8Quantizer, "amax_history_len", 1024, "recipe DelayedScaling.amax_history_len"),
    (Float8Quantizer, "amax_compute_algo", "max", "recipe DelayedScaling.amax_compute_algo"),
    (Float8CurrentScalingQuantizer, "rowwise_usage", True, "float8_tensor.py (rowwise=True)"),
    (Float8CurrentScalingQuantizer, "columnwise_usage", True, "float8_tensor.py (columnwise=True)"),
    (Float8CurrentScalingQuantizer, "force_pow_2_scales", False, "float8_tensor.py (force_pow_2_scales=False)"),
    (Float8CurrentScalingQuantizer, "amax_epsilon", 0.0, "float8_tensor.py (amax_epsilon=0.0)"),
    (Float8BlockQuantizer, "rowwise_usage", True, "required in TE; its recipes pass True"),
    (Float8BlockQuantizer, "columnwise_usage", True, "required in TE; its recipes pass True"),
    (Float8BlockQuantizer, "block_scaling_dim", 2, "float8_blockwise_tensor.py (block_scaling_dim=2)"),
    (Float8BlockQuantizer, "force_pow_2_scales", True, "float8_blockwise_tensor.py (force_pow_2_scales=True)"),
    (Float8BlockQuantizer, "amax_epsilon", 0.0, "float8_blockwise_tensor.py (amax_epsilon=0.0)"),
    (MXFP8Quantizer, "rowwise_usage", True, "mxfp8_tensor.py (rowwise=True)"),
    (MXFP8Quantizer, "columnwise_usage", True, "mxfp8_tensor.py (columnwise=True)"),
    (MXFP8Quantizer, "with_2d_quantization", False, "mxfp8_tensor.py (with_2d_quantization=False)"),
    (MXFP8Quantizer, "optimize_for_gemm", False, "quantized_tensor.py Quantizer.optimize_for_gemm"),
    (NVFP4Quantizer, "rowwise_usage", True, "nvfp4_tensor.py (rowwise=True)"),
    (NVFP4Quantizer, "columnwise_usage", True, "nvfp4_tensor.py (columnwise=True)"),
    (NVFP4Quantizer, "with_rht", False, "nvfp4_tensor.py (with_rht=False)"),
    (NVFP4Quantizer, "with_post_rht_amax", False, "nvfp4_tensor.py (with_post_rht_amax=False)"),
    (NVFP4Quantizer, "with_2d_quantization", False, "nvfp4_tensor.py (with_2d_quantization=False)"),
    (NVFP4Quantizer, "stochastic_rounding", False, "nvfp4_tensor.py (stochastic_rounding=False)"),
    (NVFP4Quantizer, "row_scaled_nvfp4", False, "nvfp4_tensor.py (row_scaled_nvfp4=False)"),
    (NVFP4Quantizer, "nvfp4_use_4over6", False, "nvfp4_tensor.py (nvfp4_use_4over6=False)"),
    (NVFP4Quantizer, "nvfp4_e4m3_max", 448, "nvfp4_tensor.py (nvfp4_e4m3_max=448)"),
    (NVFP4Quantizer, "nvfp4_4over6_err_mode", "MAE", "nvfp4_tensor.py (nvfp4_4over6_err_mode='MAE')"),
    (NVFP4Quantizer, "rht_sign_mask", 55272, "with_random_sign_mask=True -> get_wgrad_sign_vector as bits"),
    (NVFP4Quantizer, "optimize_for_gemm", False, "quantized_tensor.py Quantizer.optimize_for_gemm"),
    # Not a TE field: False is the rule of TE's kernels, which refuse the RHT on non-bf16 input
    # (csrc/quantizer.cpp NVFP4Quantizer::quantize_impl); True is what TE's reference quantizer does.
    (NVFP4Quantizer, "rht_any_input_dtype", False, "quantizer.cpp quantize_impl: RHT refuses non-bf16 input"),
    (NVFP4Quantizer, "nvfp4_4over6_err_use_fast_math", False,
     "env NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=0 (docs/envvars.rst); reference_nvfp4.py field default False"),
]
for _cls in (Float8Quantizer, Float8CurrentScalingQuantizer, Float8BlockQuantizer, MXFP8Quantizer, NVFP4Quantizer):
    TE_DEFAULTS.append((_cls, "internal", False, "quantized_tensor.py Quantizer.internal"))


@pytest.mark.parametrize("cls, field, te_default, source", TE_DEFAULTS,
                         ids=[f"{c.__name__}.{f}" for c, f, _, _ in TE_DEFAULTS])
def test_constructor_default_is_tes(cls: type, field: str, te_default: object, source: str) -> None:
    """Both the signature's default and what a default-constructed quantizer holds."""
    ours_signature = inspect.signature(cls.__init__).parameters[field].default
    ours_instance = getattr(cls(), field)
    assert ours_signature == te_default and ours_instance == te_default, (
        f"{cls.__name__}.{field}: TE's default is {te_default!r} ({source}); ours {ours_signature!r} / {ours_instance!r}"
    )


def test_every_value_field_of_a_value_quantizer_is_in_the_table() -> None:
    """A new field cannot slip in without its TE default being stated here."""
    covered = {(c, f) for c, f, _, _ in TE_DEFAULTS}
    for cls in (Float8CurrentScalingQuantizer, Float8BlockQuantizer, MXFP8Quantizer, NVFP4Quantizer):
        missing = [f for f in cls._value_field_names if (cls, f) not in covered and f != "fp8_dtype"]
        assert not missing, f"{cls.__name__}: no TE default stated for {missing}"


# recipe -> role -> {field: TE's value for that role} (common/recipe/__init__.py, pytorch/quantization.py)
TE_RECIPE_ROLES = {
    "fp8_current": {  # Float8CurrentScaling: HYBRID format, use_power_2_scales=False, amax_epsilon=0
        "input": {"fp8_dtype": E4M3, "force_pow_2_scales": False, "amax_epsilon": 0.0},
        "weight": {"fp8_dtype": E4M3, "force_pow_2_scales": False, "amax_epsilon": 0.0},
        "grad": {"fp8_dtype": E5M2, "force_pow_2_scales": False, "amax_epsilon": 0.0},
    },
    "fp8_block": {  # Float8BlockScaling: E4M3, use_f32_scales=False -> pow-2, x/w/grad dims 1/2/1
        "input": {"fp8_dtype": E4M3, "block_scaling_dim": 1, "force_pow_2_scales": True},
        "weight": {"fp8_dtype": E4M3, "block_scaling_dim": 2, "force_pow_2_scales": True},
        "grad": {"fp8_dtype": E4M3, "block_scaling_dim": 1, "force_pow_2_scales": True},
    },
    "mxfp8": {  # MXFP8BlockScaling: E4M3, enable_2d_quantization=False
        "input": {"fp8_dtype": E4M3, "with_2d_quantization": False},
        "weight": {"fp8_dtype": E4M3, "with_2d_quantization": False},
        "grad": {"fp8_dtype": E4M3, "with_2d_quantization": False},
    },
    "nvfp4": {  # NVFP4BlockScaling: fp4_quant_fwd_inp / fwd_weight / bwd_grad QParams; 4over6 "none"
        "input": {"with_rht": True, "with_post_rht_amax": True, "with_2d_quantization": False,
                  "stochastic_rounding": False, "row_scaled_nvfp4": False, "nvfp4_use_4over6": False,
                  "rht_any_input_dtype": False},
        "weight": {"with_rht": False, "with_2d_quantization": True, "stochastic_rounding": False,
                   "nvfp4_use_4over6": False, "nvfp4_4over6_err_use_fast_math": False},
        "grad": {"with_rht": True, "with_post_rht_amax": True, "with_2d_quantization": False,
                 "stochastic_rounding": True, "nvfp4_use_4over6": False, "rht_any_input_dtype": False},
    },
}
ROLE_ROWS = [(r, role, f, v) for r, roles in TE_RECIPE_ROLES.items() for role, fields in roles.items() for f, v in fields.items()]


@pytest.mark.parametrize("recipe, role, field, te_value", ROLE_ROWS, ids=[f"{r}.{ro}.{f}" for r, ro, f, _ in ROLE_ROWS])
def test_recipe_role_default_is_tes(recipe: str, role: str, field: str, te_value: object) -> None:
    quantizer = getattr(get_recipe(recipe), role)()
    assert getattr(quantizer, field) == te_value
    assert quantizer.rowwise_usage and quantizer.columnwise_usage  # TE's recipe states build both usages
