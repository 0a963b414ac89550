"""A quantized Linear whose forward and backward are torch.library custom ops (or, under
torch.compile, the inline step of :mod:`~tetrt_support.quant.inline_linear`).

The module holds the high-precision weight and three value quantizers chosen by
``recipe``; each call quantizes the operands in the layouts TE's GEMMs read, runs the
GEMMs and saves the quantized copies backward needs. It also takes TE's weight caching
(``is_first_microbatch``), an amax reduction group across ranks, a DTensor weight, and
FSDP2's FP8 weight all-gather (``enable_fsdp_float8_all_gather``, :mod:`.fsdp_float8`).
``docs/architecture.md`` ("The quantized Linear") says what each rule follows in TE.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tetrt_support.quant import fsdp_float8, inline_linear, numerics, tensor_parallel
from tetrt_support.quant.fake_impls import get_strategy
from tetrt_support.quant.ops import flatten_quantized, linear_ops, with_usage
from tetrt_support.quant.recipes import Recipe, as_recipe
from tetrt_support.quant.base import QuantizedTensor, Quantizer, functional_all_reduce_max, group_name


#: the Linear's quantizer attributes; assigning one re-derives what depends on it
_QUANTIZER_FIELDS = ("input_quantizer", "weight_quantizer", "grad_quantizer")
#: how the step enters a torch.compile graph: "auto" (inline under torch.compile where the
#: recipe has an inline form and the device is one the inline step is verified on, else the
#: custom ops), "inline" (always, eager too) or "custom_ops"
COMPILE_AS = ("auto", "inline", "custom_ops")


class Linear(torch.nn.Module):
    """``y = x @ W.T + b`` with quantized operands, as custom ops traceable by torch.compile."""

    _amax_group_name: str | None = None  # the amax_reduction_group's name (a str pickles)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        recipe: str | Recipe = "fp8_current",
        fake_impl: str = "make_empty_traceable",
        compile_as: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        amax_reduction_group: Any = None,
        enable_fsdp_float8_all_gather: bool = False,
    ) -> None:
        super().__init__()
        self.enable_fsdp_float8_all_gather = bool(enable_fsdp_float8_all_gather)
        self._amax_group_name = None if amax_reduction_group is None else group_name(amax_reduction_group)
        recipe = as_recipe(recipe)
        quantizers = recipe.quantizers()  # raise on a bad name before allocating
        if compile_as not in COMPILE_AS:
            raise ValueError(f"Linear: compile_as must be one of {COMPILE_AS}, got {compile_as!r}")
        self.compile_as = compile_as
        self._strategy = get_strategy(fake_impl)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.recipe, self.fake_impl = recipe, fake_impl
        # The recipe's GEMM settings stay the layer's when a quantizer is replaced.
        self.fast_accum = recipe.fast_accum
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = torch.nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.input_quantizer, self.weight_quantizer, self.grad_quantizer = quantizers
        self._weight_cache: QuantizedTensor | None = None
        self._weight_cache_columnwise = False  # whether the cache holds the dgrad copy
        self._use_quantizers()  # the ops, the weight templates
        device = self.weight.device
        if compile_as == "inline" and device.type != "meta":
            family = inline_linear.inline_family(quantizers)
            if not inline_linear.verified_on(device, family):
                inline_linear.warn_unverified(device, family)  # here too: a compiled call does not warn
        self.reset_parameters()
        if self.enable_fsdp_float8_all_gather:
            self.wrap_weight_for_fsdp()

    def wrap_weight_for_fsdp(self) -> None:
        """With ``enable_fsdp_float8_all_gather``: make ``weight`` a new Parameter wrapping its
        data in :class:`~tetrt_support.quant.fsdp_float8.Float8AllGatherWeight` (done at
        construction and by the converter; ``fully_shard`` must come after)."""
        if not self.enable_fsdp_float8_all_gather:
            raise ValueError("Linear.wrap_weight_for_fsdp: the Linear was built without "
                             f"{fsdp_float8.OPTION}=True")
        if tensor_parallel.is_dtensor(self.weight):
            raise ValueError(f"Linear({fsdp_float8.OPTION}=True): the weight is already a DTensor "
                             "(sharded); wrap it before fully_shard, which then shards the wrapped "
                             "weight")
        self.weight = fsdp_float8.wrap_weight(self.weight, self.weight_quantizer)

    def _make_weight_templates(self) -> tuple[object, object]:
        """The strategy's stand-ins for the quantized weight, row-wise only and with both
        layouts (indexed by ``weight_columnwise``). Built eagerly: rebuilding a quantized
        tensor inside a trace needs the strategy's description of it, and allocating one
        there (make_empty copies the quantizer) is not traceable. Rebuilt when
        .to()/.cuda() change the weight."""
        return tuple(  # type: ignore[return-value]
            self._strategy.fake_quantized(with_usage(self.weight_quantizer, columnwise=columnwise),
                                          self.weight.shape, self.weight.dtype, "meta")
            for columnwise in (False, True)
        )

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if name in _QUANTIZER_FIELDS and "_ops" in self.__dict__:
            self._use_quantizers()

    def _use_quantizers(self) -> None:
        """What depends on the quantizers: the custom ops typed for their classes, the weight
        templates, and no cached weight (after an assignment, the old quantizer made it)."""
        quantizers = tuple(getattr(self, field) for field in _QUANTIZER_FIELDS)
        bad = next((f for f, q in zip(_QUANTIZER_FIELDS, quantizers) if not isinstance(q, Quantizer)), None)
        if bad is not None:
            raise TypeError(f"Linear.{bad} must be a Quantizer, got {type(getattr(self, bad)).__name__}")
        self._ops = linear_ops(*(type(q) for q in quantizers), self.fake_impl)
        self._inline = inline_linear.inline_family(quantizers)  # None: no inline step
        if self.compile_as == "inline" and self._inline is None:
            raise ValueError(
                "Linear(compile_as='inline'): the inline step covers FP8 current scaling (no stored amax reduction "
                "group) and FP8 block scaling with 1x128 input and grad quantizers, the same for all three roles; "
                f"these quantizers are {', '.join(type(q).__name__ for q in quantizers)}: use compile_as='auto' or "
                "'custom_ops'"
            )
        if self._amax_group_name is not None:
            _check_reducible(quantizers)
        if self.__dict__.get("enable_fsdp_float8_all_gather"):
            fsdp_float8.check_weight_quantizer(quantizers[1])
            if self.compile_as == "inline":
                raise ValueError(f"Linear({fsdp_float8.OPTION}=True, compile_as='inline'): the "
                                 "FP8-gathered weight takes the custom ops (its bytes are their "
                                 "weight cache); use compile_as='auto' or 'custom_ops'")
        if self.recipe is not None and quantizers != self.recipe.quantizers():
            self.recipe = None  # the layer no longer follows the recipe it was built with
        self._weight_templates = self._make_weight_templates()
        self._weight_cache = None

    # -------------------------------------------------------------- pickling
    #: derived from fake_impl and the quantizers, rebuilt on load: the custom ops (and the
    #: torch.ops namespace they hold) cannot be pickled or deep-copied
    _DERIVED = ("_ops", "_strategy", "_weight_templates")

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        for name in self._DERIVED:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        cache, cache_columnwise, recipe = self._weight_cache, self._weight_cache_columnwise, self.recipe
        self._strategy = get_strategy(self.fake_impl)
        self._use_quantizers()  # the ops and the templates (it also drops the cache: restored)
        self._weight_cache, self._weight_cache_columnwise, self.recipe = cache, cache_columnwise, recipe

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        result = super()._apply(fn, recurse)
        self._weight_templates = self._make_weight_templates()
        self._weight_cache = None
        return result

    def reset_parameters(self) -> None:
        """torch.nn.Linear's initialisation."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @property
    def amax_reduction_group(self) -> Any:
        """The process group the input's and the output gradient's amaxes all-reduce (MAX)
        over on every call, or None (each rank its own amax)."""
        if self._amax_group_name is None:
            return None
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(self._amax_group_name)

    def forward(self, x: torch.Tensor, *, is_first_microbatch: bool | None = None) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear: input's last dimension is {x.shape[-1]}, expected in_features={self.in_features}")
        if isinstance(self.weight, fsdp_float8.Float8GatheredWeight):
            return self._gathered_step(x, self.weight, self.bias,
                                       is_first_microbatch=is_first_microbatch)
        if tensor_parallel.is_dtensor(self.weight):
            if self.enable_fsdp_float8_all_gather:
                raise NotImplementedError(
                    f"Linear({fsdp_float8.OPTION}=True) called with a DTensor weight: the FP8 "
                    "all-gather is FSDP2's, which gathers the weight before the forward (call "
                    "the model, not a sharded layer outside it); tensor parallelism with the FP8 "
                    "all-gather is not supported")
            return tensor_parallel.dtensor_forward(self, x, is_first_microbatch=is_first_microbatch)
        return self._step(x, self.weight, self.bias, self._amax_group_name, is_first_microbatch=is_first_microbatch)

    def _gathered_step(self, x: torch.Tensor, weight: fsdp_float8.Float8GatheredWeight,
                       bias: torch.Tensor | None, *, is_first_microbatch: bool | None = None,
                       ) -> torch.Tensor:
        """The step with the weight FSDP2 gathered in FP8: its bytes go to the forward op as the
        quantized weight (the op's weight-cache input), a zero-stride stand-in as ``weight``
        (the op reads only its shape and dtype then; the gradient passes to the parameter)."""
        if is_first_microbatch is not None:
            raise ValueError(f"Linear({fsdp_float8.OPTION}=True): is_first_microbatch (weight "
                             "caching) does not apply: FSDP2 gathers the weight already quantized "
                             "at every all-gather")
        weight_columnwise = torch.is_grad_enabled() and x.requires_grad
        input_columnwise = torch.is_grad_enabled() and weight.requires_grad
        w_q = weight.quantized(self.weight_quantizer, columnwise=weight_columnwise)
        group = self._amax_group_name
        input_amax = None if group is None else functional_all_reduce_max(numerics.amax(x), group)
        out, _, _ = self._ops.forward(
            x.reshape(-1, x.shape[-1]), fsdp_float8.weight_stand_in(weight), bias,
            flatten_quantized(w_q), self.input_quantizer, self.weight_quantizer,
            self.grad_quantizer, input_columnwise, weight_columnwise, list(self.fast_accum),
            input_amax, group,
        )
        return out.reshape(*x.shape[:-1], weight.shape[0])

    def compiled_step(self, x: torch.Tensor) -> str:
        """Which step a ``torch.compile``d call of this layer on ``x`` runs (``is_first_microbatch``
        left None): ``"inline"`` or ``"custom_ops"``; raises as that call would."""
        return "custom_ops" if self._inline_call(x, self.weight, self.bias, compiling=True) is None else "inline"

    def _inline_call(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     *, compiling: bool) -> tuple[torch.Tensor, inline_linear.Plan] | None:
        """``x`` as 2-D rows and the inline step's plan when a call on ``x`` takes it
        (``compiling``: under torch.compile), None when it takes the custom ops. A layer with
        no inline step, or one that may not take it here, reshapes nothing (its graph keeps
        no unused node)."""
        if self._inline is None or not (self.compile_as == "inline" or (self.compile_as == "auto" and compiling)):
            return None
        x2d = x.reshape(-1, x.shape[-1])
        # Read the quantizers here, inside the trace: Dynamo guards on their values, so a
        # quantizer changed in place recompiles (a plan built at assignment would go stale).
        plan = inline_linear.plan_for((self.input_quantizer, self.weight_quantizer, self.grad_quantizer),
                                      self._inline, self.fast_accum)
        unfit = inline_linear.unfit(plan, x2d, weight, bias)
        if unfit is not None and self.compile_as == "inline":
            raise ValueError(f"Linear(compile_as='inline'): {unfit}; compile_as='auto' takes the custom ops here")
        verified = inline_linear.verified_on(x2d.device, self._inline)
        if unfit is not None or not (verified or self.compile_as == "inline"):
            return None
        if not verified and not compiling:
            # eager calls only: a warning inside the trace would break the graph at every Linear
            inline_linear.warn_unverified(x2d.device, self._inline)
        return x2d, plan

    def _step(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, amax_group: str | None,
              *, is_first_microbatch: bool | None = None) -> torch.Tensor:
        """The quantized step on plain tensors (a DTensor layer's local shards), the input's
        and the gradient's amaxes reduced over the group named ``amax_group`` if not None."""
        out_features = weight.shape[0]
        grad_enabled = torch.is_grad_enabled()
        input_columnwise = grad_enabled and weight.requires_grad  # TE: backward_needs_input
        weight_columnwise = grad_enabled and x.requires_grad
        inline = None if is_first_microbatch is not None else self._inline_call(
            x, weight, bias, compiling=torch.compiler.is_compiling())
        if inline is not None:
            x2d, plan = inline
            out = inline_linear.linear(x2d, weight, bias, plan, input_columnwise=input_columnwise,
                                       weight_columnwise=weight_columnwise, group_name=amax_group)
            return out.reshape(*x.shape[:-1], out_features)
        cache: list[torch.Tensor] = []
        if is_first_microbatch is False:
            if self._weight_cache is None or (weight_columnwise and not self._weight_cache_columnwise):
                is_first_microbatch = True  # TE: no workspace, or one without the needed usage, is a miss
            else:
                weight_columnwise = self._weight_cache_columnwise  # the layouts the cache holds
                cache = self._strategy.flat_buffers(self._weight_cache, like=self._weight_templates[weight_columnwise])
        # The input's amax all-reduced here, outside the op: a functional collective, so under
        # torch.compile a node of the graph (the backward formula reduces the gradient's).
        input_amax = None if amax_group is None else functional_all_reduce_max(numerics.amax(x), amax_group)
        out, _, w_flat = self._ops.forward(
            x.reshape(-1, x.shape[-1]), weight, bias, cache,
            self.input_quantizer, self.weight_quantizer, self.grad_quantizer, input_columnwise, weight_columnwise,
            list(self.fast_accum), input_amax, amax_group,
        )
        if is_first_microbatch:
            self._weight_cache = self._strategy.reassemble(self._weight_templates[weight_columnwise], w_flat)
            self._weight_cache_columnwise = weight_columnwise
        return out.reshape(*x.shape[:-1], out_features)

    def extra_repr(self) -> str:
        made_by = (f"recipe={str(self.recipe)!r}" if self.recipe is not None else
                   "recipe=None, " + ", ".join(f"{f}={getattr(self, f)!r}" for f in _QUANTIZER_FIELDS))
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{made_by}, fake_impl={self.fake_impl!r}, compile_as={self.compile_as!r}"
                + (f", amax_reduction_group={self._amax_group_name!r}" if self._amax_group_name is not None else "")
                + (f", {fsdp_float8.OPTION}=True" if self.enable_fsdp_float8_all_gather else ""))


def _check_reducible(quantizers: tuple[Quantizer, ...]) -> None:
    """Raise unless the input and grad quantizers take an all-reduced amax per call (FP8
    current scaling): the Linear's group is for their amaxes."""
    from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer

    for field, q in ((_QUANTIZER_FIELDS[0], quantizers[0]), (_QUANTIZER_FIELDS[2], quantizers[2])):
        if type(q) is not Float8CurrentScalingQuantizer:
            raise ValueError(
                f"Linear(amax_reduction_group=...): the {field} is a {type(q).__name__}; the group's amax reduction "
                "is implemented for Float8CurrentScalingQuantizer (recipe 'fp8_current') only (delayed scaling "
                "reduces at update_scale(amax_reduction_group=...); NVFP4's per-tensor amax per call to "
                "quantize(x, amax_reduction_group=...), not through the Linear)")
