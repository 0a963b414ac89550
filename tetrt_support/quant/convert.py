"""Convert a whole model to quantized training in one call: swap its ``torch.nn.Linear``
layers for :class:`~tetrt_support.quant.linear.Linear`, in place, keeping their parameters.

:func:`convert_to_quantized_training` is torchao's ``convert_to_float8_training`` for this
package's recipes; :func:`unsupported_reason` says, before converting, why a recipe cannot
quantize a layer (its shape or dtype), or None when it can.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal

import torch

from tetrt_support.quant import numerics
from tetrt_support.quant.base import SUPPORTED_INPUT_DTYPES, Quantizer
from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer
from tetrt_support.quant.linear import Linear
from tetrt_support.quant.mxfp8_tensor import MXFP8Quantizer
from tetrt_support.quant.nvfp4_tensor import NVFP4Quantizer
from tetrt_support.quant.recipes import Recipe, as_recipe

__all__ = ["convert_to_quantized_training", "unsupported_reason"]

ON_UNSUPPORTED = ("raise", "skip")

#: Linear arguments every converted layer takes from the layer it replaces (or from the call)
_FROM_LAYER = ("in_features", "out_features", "bias", "recipe", "device", "dtype")

#: TransformerEngine's ``_Linear`` asserts, for every quantized recipe, that the weight's
#: leading dim (out_features) is a multiple of 8 and its last dim (in_features) of 16
#: (``assert_dim_for_fp8_exec(inputmat, weight)``)
_TE_MULTIPLE = {"in_features": 16, "out_features": 8}
_TE_WHY = "which TransformerEngine's Linear asserts for every quantized recipe (assert_dim_for_fp8_exec)"


def _dim_requirements(quantizers: tuple[Quantizer, ...], name: str) -> dict[str, list[tuple[int, str]]]:
    """``{"in_features": [(multiple, why), ...], "out_features": [...]}`` for these quantizers.

    The contraction dims the quantizers block: the input (M, K) and the weight (N, K)
    row-wise along K = in_features; the weight column-wise (dgrad) and the output gradient
    (M, N) row-wise along N = out_features. The recipe's own requirements come first."""
    x_q, w_q, g_q = quantizers
    needs: dict[str, list[tuple[int, str]]] = {dim: [] for dim in _TE_MULTIPLE}
    for cls, block in ((MXFP8Quantizer, numerics.MXFP8_BLOCK), (NVFP4Quantizer, numerics.NVFP4_BLOCK)):
        why = f"which {name}'s 1x{block} blocks need"
        if isinstance(x_q, cls) or isinstance(w_q, cls):
            needs["in_features"].append((block, why))
        if isinstance(w_q, cls) or isinstance(g_q, cls):
            needs["out_features"].append((block, why))
    per_tensor = (Float8CurrentScalingQuantizer, Float8Quantizer)
    if isinstance(w_q, per_tensor) and (isinstance(x_q, per_tensor) or isinstance(g_q, per_tensor)):
        # x (M, K) @ W^T (K, N) and g (M, N) @ W (N, K) run on torch._scaled_mm, whose CUDA
        # kernel refuses a mat1 trailing dim or a mat2 dim that is not a multiple of 16
        why = f"which torch._scaled_mm, {name}'s FP8 GEMM, needs on CUDA"
        needs["in_features"].append((16, why))
        needs["out_features"].append((16, why))
    for dim, multiple in _TE_MULTIPLE.items():  # last: of equal multiples, the recipe's own reason is given
        needs[dim].append((multiple, _TE_WHY))
    return needs


def _rht_refuses(quantizer: Quantizer, dtype: torch.dtype) -> bool:
    return (isinstance(quantizer, NVFP4Quantizer) and quantizer.with_rht and not quantizer.rht_any_input_dtype
            and dtype != torch.bfloat16)


def unsupported_reason(linear: torch.nn.Module, recipe: str | Recipe = "fp8_current") -> str | None:
    """Why ``recipe`` cannot quantize ``linear`` (a ``torch.nn.Linear``), or None if it can.

    The rules, checked in this order (the first kind that fails is given; of the shape
    rules, one reason per failing dimension):

    - the module can be swapped: no child modules (a subclass's would be dropped) and
      ``weight`` / ``bias`` that are ``torch.nn.Parameter`` (the converted layer reuses them);
    - the weight's dtype is one the quantizers take (fp32, bf16, fp16);
    - per dimension, the largest multiple it fails (all are powers of two, so meeting the
      largest meets the rest): 16 for in_features and 8 for out_features in every recipe
      (TransformerEngine's Linear asserts them); 32 for both in mxfp8 (1x32 blocks), 16 in
      nvfp4 (1x16 blocks), as the quantizers refuse otherwise; 16 for both in fp8_current
      (``torch._scaled_mm`` refuses other shapes on CUDA; its CPU kernel does not, but a
      converted model should not break when it moves to a GPU);
    - nvfp4 with the Hadamard transform (its default) needs bfloat16, which TE's kernels
      require of the transform's input (the input and the output gradient, taken to be in
      the layer's dtype) unless the recipe has ``rht_any_input_dtype=True``.

    Not decidable here: the token count (the rows of the input) is blocked too, by the
    column-wise copies (mxfp8: a multiple of 32, nvfp4: 16, fp8_current on CUDA: 16);
    the quantized Linear checks it on each call.
    """
    if not isinstance(linear, torch.nn.Linear):
        raise TypeError(f"unsupported_reason: expected a torch.nn.Linear, got {type(linear).__name__}")
    recipe = as_recipe(recipe)
    children = [name for name, _ in linear.named_children()]
    if children:
        return (f"{type(linear).__name__} has child modules ({', '.join(children)}), which replacing it with a "
                "quantized Linear would drop")
    for name in ("weight", "bias"):
        value = getattr(linear, name)
        if value is not None and not isinstance(value, torch.nn.Parameter):
            return (f"its {name} is a {type(value).__name__}, not a torch.nn.Parameter, so the quantized Linear "
                    "cannot take it over")
    dtype = linear.weight.dtype
    if dtype not in SUPPORTED_INPUT_DTYPES:
        return f"dtype {dtype} is not one of {SUPPORTED_INPUT_DTYPES}, the dtypes the quantizers take"
    quantizers = recipe.quantizers()
    sizes = {"in_features": linear.in_features, "out_features": linear.out_features}
    failures = []
    for dim, needs in _dim_requirements(quantizers, str(recipe)).items():
        failed = [(multiple, why) for multiple, why in needs if sizes[dim] % multiple]
        if failed:
            multiple, why = max(failed, key=lambda need: need[0])
            failures.append(f"{dim}={sizes[dim]} is not a multiple of {multiple}, {why}")
    if failures:
        return "; ".join(failures)
    if any(_rht_refuses(q, dtype) for q in (quantizers[0], quantizers[2])):
        return (f"dtype {dtype}: {recipe}'s Hadamard transform takes torch.bfloat16 input only, as TE's kernels do "
                "(the layer's input and output gradient are taken to be in its dtype); cast the layer to bfloat16, "
                "or use get_recipe('nvfp4', rht_any_input_dtype=True) (same results for bf16 input) or "
                "disable_rht=True")
    return None


def _describe(fqn: str, linear: torch.nn.Linear) -> str:
    where = fqn or "the root module"
    return (f"{where} ({type(linear).__name__}, in_features={linear.in_features}, "
            f"out_features={linear.out_features}, dtype={linear.weight.dtype})")


def _quantized(linear: torch.nn.Linear, recipe: Recipe, linear_kwargs: dict[str, Any]) -> Linear:
    """A quantized Linear holding ``linear``'s own weight and bias Parameters: built on the
    meta device (its initialisation costs nothing), then given the parameters; the weight
    templates, made for the meta weight, are made again for the real one."""
    new = Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, recipe=recipe,
                 device="meta", dtype=linear.weight.dtype, **linear_kwargs)
    new.weight = linear.weight
    if linear.bias is not None:
        new.bias = linear.bias
    if new.enable_fsdp_float8_all_gather:  # a new Parameter wrapping the layer's weight data
        new.wrap_weight_for_fsdp()
    new._weight_templates = new._make_weight_templates()
    new._weight_cache = None
    new.train(linear.training)
    return new


def convert_to_quantized_training(
    module: torch.nn.Module,
    recipe: str | Recipe = "fp8_current",
    *,
    module_filter_fn: Callable[[torch.nn.Module, str], bool] | None = None,
    on_unsupported: Literal["raise", "skip"] = "raise",
    **linear_kwargs: Any,
) -> torch.nn.Module:
    """Swap every ``torch.nn.Linear`` of ``module`` for a quantized
    :class:`~tetrt_support.quant.linear.Linear` of ``recipe``, in place; returns ``module``.

    As torchao's ``convert_to_float8_training``: a layer is swapped when
    ``isinstance(layer, torch.nn.Linear)`` (subclasses too; their own ``forward``, hooks
    and attributes are not carried over, so exclude with the filter any that matter) and
    ``module_filter_fn(layer, fqn)`` is true (no filter: all), ``fqn`` its fully qualified
    name (``""`` for the root). A root that is itself a Linear cannot be swapped in place:
    the new Linear is returned instead. A layer reachable under several names is replaced
    by one quantized Linear wherever its name passes the filter.

    The new layer takes over the old one's ``weight`` and ``bias`` Parameter objects (data,
    dtype, device, ``requires_grad``; an optimizer built before still updates them) and
    its train/eval mode. ``linear_kwargs`` go to every new Linear (``fake_impl``,
    ``compile_as``, ``amax_reduction_group`` for training across ranks,
    ``enable_fsdp_float8_all_gather`` for FSDP2's FP8 weight all-gather (fp8_current only; then
    the weight is a new Parameter wrapping the old one's data, so build the optimizer after
    converting and sharding), ...); its shape, bias, device and dtype come from the layer it
    replaces.

    Layers the recipe cannot quantize (:func:`unsupported_reason`): ``on_unsupported="raise"``
    raises a ValueError naming each (its name, shape, dtype and the reason) before any
    layer is swapped, so the model is left unchanged; ``"skip"`` leaves them
    ``torch.nn.Linear`` and warns once, listing them. Every new Linear is built before the
    first swap, so an error in building one also leaves the model unchanged.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert_to_quantized_training: expected a torch.nn.Module, got {type(module).__name__}")
    if module_filter_fn is not None and not callable(module_filter_fn):
        raise TypeError("convert_to_quantized_training: module_filter_fn must be a callable (module, fqn) -> bool "
                        f"or None, got {type(module_filter_fn).__name__}")
    if on_unsupported not in ON_UNSUPPORTED:
        raise ValueError(f"convert_to_quantized_training: on_unsupported must be one of {ON_UNSUPPORTED}, "
                         f"got {on_unsupported!r}")
    clashing = sorted(set(linear_kwargs) & set(_FROM_LAYER))
    if clashing:
        raise TypeError(f"convert_to_quantized_training: {', '.join(clashing)} cannot be given: each converted Linear "
                        "takes its shape, bias, device and dtype from the layer it replaces, and recipe is an "
                        "argument of its own")
    recipe = as_recipe(recipe)

    # Every (fqn, layer) the filter selects, shared layers under each of their names.
    selected = [(fqn, m) for fqn, m in module.named_modules(remove_duplicate=False)
                if isinstance(m, torch.nn.Linear) and (module_filter_fn is None or module_filter_fn(m, fqn))]
    refused: dict[int, str | None] = {}  # id(layer) -> why it cannot be converted, None: it can
    problems = []
    for fqn, layer in selected:
        if id(layer) not in refused:
            refused[id(layer)] = unsupported_reason(layer, recipe)
        if refused[id(layer)] is not None:
            problems.append(f"{_describe(fqn, layer)}: {refused[id(layer)]}")
    if problems and on_unsupported == "raise":
        raise ValueError(f"convert_to_quantized_training: {recipe} cannot quantize {len(problems)} layer(s), "
                         "nothing was converted:\n  " + "\n  ".join(problems) +
                         "\n(on_unsupported='skip' leaves them torch.nn.Linear; module_filter_fn can exclude them)")
    if problems:
        warnings.warn(f"convert_to_quantized_training: {recipe} cannot quantize {len(problems)} layer(s), left as "
                      "torch.nn.Linear:\n  " + "\n  ".join(problems), stacklevel=2)

    replacements: dict[int, Linear] = {}
    for _, layer in selected:
        if refused[id(layer)] is None and id(layer) not in replacements:
            replacements[id(layer)] = _quantized(layer, recipe, linear_kwargs)
    for fqn, layer in selected:
        if id(layer) not in replacements:
            continue
        if fqn == "":
            return replacements[id(layer)]  # the root: nothing to swap it in
        parent_name, _, name = fqn.rpartition(".")
        setattr(module.get_submodule(parent_name), name, replacements[id(layer)])
    return module
