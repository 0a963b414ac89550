"""FP8 weight all-gather under FSDP2 (``fully_shard``) for the quantized Linear (fp8_current).

:class:`Float8AllGatherWeight` wraps a Linear's high-precision weight and implements
FSDP2's all-gather extension (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``): each
rank quantizes its shard with the scale of the WHOLE weight (the shards' amaxes
all-reduced, MAX, over the FSDP shard group, or taken from
:func:`precompute_float8_dynamic_scale_for_fsdp`), FSDP2 all-gathers the FP8 bytes (as
uint8: gloo has no float8 dtypes), and the gathered :class:`Float8GatheredWeight` (FP8
data and ``scale_inv``) is what the Linear computes with, byte for byte what the unsharded
Linear's weight quantizer makes of the whole weight.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree

from tetrt_support.quant import numerics
from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer, Float8Tensor
from tetrt_support.quant.ops import with_usage

aten = torch.ops.aten

#: the option's name (torchao's ``Float8LinearConfig.enable_fsdp_float8_all_gather``)
OPTION = "enable_fsdp_float8_all_gather"

# FSDP2 shards, pads, moves and copies the parameter with these ops: their results stay
# wrapped, so the sharded local tensor still has the all-gather extension.
_KEEP_WRAPPED = {
    aten.detach.default, aten.alias.default, aten.empty_like.default, aten.new_zeros.default,
    aten.slice.Tensor, aten.copy_.default, aten.view.default, aten.as_strided.default,
    aten._to_copy.default, aten._pin_memory.default, aten.split.Tensor, aten.clone.default,
}


def check_weight_quantizer(quantizer: Any) -> None:
    """Raise unless ``quantizer`` is FP8 current scaling: the only recipe whose weight the
    FP8 all-gather quantizes (one tensor-wise scale, reducible across shards by a MAX)."""
    if type(quantizer) is not Float8CurrentScalingQuantizer:
        raise ValueError(
            f"{OPTION}=True: the weight_quantizer is a {type(quantizer).__name__}; the FP8 weight "
            "all-gather is implemented for Float8CurrentScalingQuantizer (recipe 'fp8_current') "
            "only: its one tensor-wise scale comes from the whole weight's amax, a MAX over the "
            "shards (block and microscaled recipes have a scale per block, which would have to be "
            "gathered with the data; delayed scaling keeps live amax history)")


def _scale_settings(quantizer: Any) -> tuple[torch.dtype, bool, float]:
    return quantizer.fp8_dtype, quantizer.force_pow_2_scales, quantizer.amax_epsilon


class Float8AllGatherWeight(torch.Tensor):
    """A high-precision weight (it behaves as the tensor it wraps) whose FSDP2 all-gather
    moves FP8 bytes: the shard is quantized with the whole weight's scale before the gather.

    ``quantizer``: the Linear's weight quantizer (FP8 current scaling), whose dtype,
    power-of-two rule and amax epsilon the gathered weight is quantized with."""

    _tensor: torch.Tensor
    _quantizer: Float8CurrentScalingQuantizer
    #: from the precompute: (amax, the sharded parameter (a DTensor), its version then)
    _precomputed: tuple[torch.Tensor, weakref.ref, int] | None

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, quantizer: Float8CurrentScalingQuantizer,
                ) -> Float8AllGatherWeight:
        return torch.Tensor._make_wrapper_subclass(
            cls, tensor.size(), strides=tensor.stride(), storage_offset=tensor.storage_offset(),
            dtype=tensor.dtype, layout=tensor.layout, device=tensor.device,
            requires_grad=tensor.requires_grad)

    def __init__(self, tensor: torch.Tensor, quantizer: Float8CurrentScalingQuantizer) -> None:
        check_weight_quantizer(quantizer)
        self._tensor = tensor
        self._quantizer = with_usage(quantizer, rowwise=True, columnwise=False)
        self._precomputed = None

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"Float8AllGatherWeight({self._tensor!r}, quantizer={self._quantizer!r})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_tensor"], self._quantizer

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], quantizer: Any, outer_size: Any,
                             outer_stride: Any) -> Float8AllGatherWeight:
        del outer_size, outer_stride
        return Float8AllGatherWeight(inner["_tensor"], quantizer)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        quantizers = []

        def unwrap(t: Float8AllGatherWeight) -> torch.Tensor:
            quantizers.append(t._quantizer)
            return t._tensor

        args, kwargs = pytree.tree_map_only(Float8AllGatherWeight, unwrap, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _KEEP_WRAPPED:
            return out  # in-place ops (the optimizer's) have updated the wrapped tensor
        quantizer = quantizers[0]
        return pytree.tree_map_only(torch.Tensor, lambda t: Float8AllGatherWeight(t, quantizer),
                                    out)

    __torch_function__ = torch._C._disabled_torch_function_impl

    # ------------------------------------------------------------ FSDP2's all-gather extension
    def fsdp_pre_all_gather(self, mesh: Any, outer_size: torch.Size, outer_stride: tuple[int, ...],
                            module: torch.nn.Module, mp_policy: Any,
                            ) -> tuple[tuple[torch.Tensor, ...], Any]:
        """This rank's shard as FP8 bytes (uint8), padded to FSDP's padded shard size, and
        the metadata: the ``scale_inv`` of the whole weight."""
        del outer_stride, module, mp_policy
        group = _shard_group(mesh)
        fp8_dtype, pow2, epsilon = _scale_settings(self._quantizer)
        local = self._tensor
        amax = None
        if self._precomputed is not None:
            # The DTensor's version: in-place updates (the optimizer's) bump it; they run below
            # autograd on this wrapper and its tensor, whose versions do not move.
            precomputed, param, version = self._precomputed
            if param() is not None and param()._version == version:
                amax = precomputed
        if amax is None:  # every rank takes this branch together: the versions move in step
            amax = numerics.amax(local) if local.numel() else torch.zeros((), device=local.device)
            amax = amax.float()
            torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=group)
        data, scale_inv, _ = numerics.float8_current_scaling_quantize(
            numerics.flatten_2d(local), fp8_dtype, force_pow_2_scales=pow2, amax_epsilon=epsilon,
            tensor_amax=amax)
        data = data.reshape(local.shape)
        rows = math.ceil(outer_size[0] / mesh.size())  # FSDP's padded shard (dim 0)
        if data.shape[0] < rows:  # the padding is zero bytes, which the gathered weight drops
            data = torch.cat([data, data.new_zeros((rows - data.shape[0], *data.shape[1:]))])
        # The FP8 bytes travel as uint8: gloo refuses float8 dtypes ("Invalid scalar type"),
        # and FSDP2 gathers a group of mixed dtypes as uint8 anyway.
        return (data.view(torch.uint8),), (scale_inv, fp8_dtype)

    def fsdp_post_all_gather(self, all_gather_outputs: tuple[torch.Tensor, ...], metadata: Any,
                             param_dtype: torch.dtype, *, out: torch.Tensor | None = None) -> Any:
        """The gathered FP8 weight (its data a view of FSDP's all-gather output), or, on a
        later all-gather into the same output, ``out`` given this gather's ``scale_inv``."""
        (gathered,) = all_gather_outputs
        scale_inv, fp8_dtype = metadata
        if out is not None:
            if not isinstance(out, Float8GatheredWeight):
                raise RuntimeError(f"{OPTION}: FSDP2's unsharded weight is a {type(out).__name__}, "
                                   "expected the Float8GatheredWeight of the first all-gather")
            out._scale_inv = scale_inv
            return None
        data = gathered.view(fp8_dtype)
        return Float8GatheredWeight(data, scale_inv, param_dtype, self._quantizer), (gathered,)


def _shard_group(mesh: Any) -> Any:
    """The group of FSDP2's shard mesh (1-D: under HSDP, the shard dimension's)."""
    if mesh.ndim != 1:
        raise NotImplementedError(f"{OPTION}: FSDP2 handed the all-gather extension a "
                                  f"{mesh.ndim}-D mesh; the amax reduction covers a 1-D shard mesh")
    return mesh.get_group()


class Float8GatheredWeight(torch.Tensor):
    """The weight FSDP2 gathered in FP8: ``_data`` (the whole weight's FP8 bytes) and
    ``_scale_inv`` (1,), standing for ``data * scale_inv`` in ``dtype``. The quantized Linear
    computes with the bytes; any other op sees the dequantized weight."""

    _data: torch.Tensor
    _scale_inv: torch.Tensor
    _quantizer: Float8CurrentScalingQuantizer

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                quantizer: Float8CurrentScalingQuantizer) -> Float8GatheredWeight:
        return torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=data.storage_offset(),
            dtype=dtype, device=data.device)

    def __init__(self, data: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                 quantizer: Float8CurrentScalingQuantizer) -> None:
        self._data, self._scale_inv, self._quantizer = data, scale_inv, quantizer

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (f"Float8GatheredWeight(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"fp8={self._data.dtype})")

    def dequantize(self) -> torch.Tensor:  # type: ignore[override]
        return (self._data.float() * self._scale_inv).to(self.dtype)

    def quantized(self, weight_quantizer: Any, *, columnwise: bool) -> Float8Tensor:
        """The gathered weight as the quantized Linear's weight operand: a Float8Tensor with
        the row-wise bytes and, for ``columnwise``, the transposed copy the dgrad layout names.
        Raises if ``weight_quantizer`` would quantize the weight otherwise than it was gathered."""
        if type(weight_quantizer) is not Float8CurrentScalingQuantizer or (
                _scale_settings(weight_quantizer) != _scale_settings(self._quantizer)):
            raise ValueError(f"{OPTION}: the weight was gathered quantized by {self._quantizer!r}, "
                             f"but the Linear's weight_quantizer is now {weight_quantizer!r}; the "
                             "gathered bytes would not be its own")
        data = self._data.contiguous()
        return Float8Tensor(shape=data.shape, dtype=self.dtype,
                            quantizer=with_usage(weight_quantizer, columnwise=columnwise),
                            _data=data, _transpose=data.t().contiguous() if columnwise else None,
                            _scale_inv=self._scale_inv)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else None
        if isinstance(first, Float8GatheredWeight):
            if func in (aten.detach.default, aten.alias.default):
                data = first._data
            elif func in (aten.as_strided.default, aten.view.default):  # FSDP2 trims the padding
                data = func(first._data, *args[1:], **kwargs)
            else:
                data = None
            if data is not None:
                return Float8GatheredWeight(data, first._scale_inv, first.dtype, first._quantizer)
        for arg in pytree.tree_leaves((args, kwargs)):
            if isinstance(arg, Float8GatheredWeight) and func._schema.is_mutable:
                raise NotImplementedError(f"{func}: in-place ops on the FP8-gathered weight are "
                                          "not supported")
        args, kwargs = pytree.tree_map_only(Float8GatheredWeight, lambda t: t.dequantize(),
                                            (args, kwargs))
        return func(*args, **kwargs)

    __torch_function__ = torch._C._disabled_torch_function_impl


class _WeightShape(torch.autograd.Function):
    """A stand-in for the gathered weight in the Linear's op: the op reads only the weight's
    shape and dtype when it is handed the quantized buffers; the weight gradient passes
    through to the gathered parameter (FSDP2 reduce-scatters it)."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor) -> torch.Tensor:
        return torch.zeros((), dtype=weight.dtype, device=weight.device).expand(weight.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def weight_stand_in(weight: Float8GatheredWeight) -> torch.Tensor:
    """A zero-stride tensor of ``weight``'s shape and dtype, differentiable into ``weight``."""
    return _WeightShape.apply(weight)


def wrap_weight(weight: torch.nn.Parameter, quantizer: Any) -> torch.nn.Parameter:
    """A new Parameter wrapping ``weight``'s data in :class:`Float8AllGatherWeight` (``weight``
    itself is left as it is)."""
    if isinstance(weight, Float8AllGatherWeight):
        return weight
    wrapped = Float8AllGatherWeight(weight.detach(), quantizer)
    return torch.nn.Parameter(wrapped, requires_grad=weight.requires_grad)


@torch.no_grad()
def precompute_float8_dynamic_scale_for_fsdp(module: torch.nn.Module) -> int:
    """The amaxes of every FP8-all-gathered weight of ``module`` (sharded by ``fully_shard``),
    in one all-reduce (MAX) per shard group, kept with each weight for its next all-gathers
    (torchao's function of the same name; call it after ``optimizer.step()``). An amax is used
    only while the weight is unchanged since (its version), so a forgotten call costs an
    all-reduce per weight at the gather, never a stale scale. Returns how many weights."""
    from torch.distributed.tensor import DTensor

    by_group: dict[Any, list[Any]] = {}
    for m in module.modules():
        weight = getattr(m, "weight", None)
        if isinstance(weight, DTensor) and isinstance(weight._local_tensor, Float8AllGatherWeight):
            if weight.device_mesh.ndim != 1:
                raise NotImplementedError(
                    "precompute_float8_dynamic_scale_for_fsdp: a weight on a "
                    f"{weight.device_mesh.ndim}-D mesh; the precompute covers 1-D FSDP meshes "
                    "(without it, the all-gather reduces each amax itself)")
            by_group.setdefault(weight.device_mesh.get_group(), []).append(weight)
    for group, weights in by_group.items():
        locals_ = [w._local_tensor._tensor for w in weights]
        amaxes = torch.stack([numerics.amax(t).float() if t.numel() else
                              torch.zeros((), device=t.device) for t in locals_])
        torch.distributed.all_reduce(amaxes, op=torch.distributed.ReduceOp.MAX, group=group)
        for weight, amax in zip(weights, amaxes):
            weight._local_tensor._precomputed = (amax, weakref.ref(weight), weight._version)
    return sum(len(v) for v in by_group.values())
