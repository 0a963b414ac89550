"""The quantized Linear with DTensor parameters (``parallelize_module``'s tensor parallelism).

:func:`colwise_parallel` and :func:`rowwise_parallel` return subclasses of torch's
``ColwiseParallel`` / ``RowwiseParallel`` that shard a quantized Linear as they shard an
``nn.Linear``. Such a Linear runs its step on the local shards, as TE's does, with amaxes
all-reduced over the group (``docs/architecture.md``, "Module notes", tensor parallelism).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tetrt_support.quant.linear import Linear


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor``."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def dtensor_forward(layer: Linear, x: Any, *, is_first_microbatch: bool | None = None) -> Any:
    """``layer(x)`` for a Linear whose weight is a DTensor on a 1-D mesh (see the module docstring)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    if is_first_microbatch is not None:
        raise NotImplementedError("quant.Linear with a DTensor weight: is_first_microbatch (weight caching) is not "
                                  "supported; call it with is_first_microbatch=None")
    weight, bias = layer.weight, layer.bias
    mesh = weight.device_mesh
    if mesh.ndim != 1:
        raise NotImplementedError(f"quant.Linear with a DTensor weight: a 1-D device mesh is supported, got {mesh.ndim}-D")
    if not isinstance(x, DTensor) or x.device_mesh != mesh:
        raise TypeError("quant.Linear with a DTensor weight: the input must be a DTensor on the weight's mesh "
                        f"(parallelize_module's ColwiseParallel / RowwiseParallel make it one), got {type(x).__name__}")
    (w_place,), (x_place,) = weight.placements, x.placements
    last = Shard(x.ndim - 1)
    x_place = Shard(x_place.dim % x.ndim) if isinstance(x_place, Shard) else x_place
    if w_place == Shard(0) and x_place == Replicate():
        # column-wise: each rank's input gradient is its shard's part of the sum over out_features
        out_place, local_bias, bias_after, x_grad_place = last, bias, None, Partial()
    elif w_place == Shard(1) and x_place == last:
        out_place, local_bias, bias_after, x_grad_place = Partial(), None, bias, last  # row-wise
    else:
        raise NotImplementedError(
            f"quant.Linear with a DTensor weight: weight {weight.placements} with input {x.placements}; supported are "
            "column-wise (weight Shard(0), input Replicate) and row-wise (weight Shard(1), input Shard(-1))")
    if local_bias is not None:
        if not (isinstance(local_bias, DTensor) and local_bias.placements == (Shard(0),)):
            raise NotImplementedError(f"quant.Linear column-wise: the bias must be Shard(0) with the weight, got "
                                      f"{getattr(local_bias, 'placements', type(local_bias).__name__)}")
        local_bias = local_bias.to_local()
    group = layer._amax_group_name or mesh.get_group().group_name
    out = layer._step(x.to_local(grad_placements=(x_grad_place,)), weight.to_local(), local_bias, group)
    out = DTensor.from_local(out, mesh, (out_place,), run_check=False)
    if bias_after is not None:
        if not (isinstance(bias_after, DTensor) and bias_after.placements == (Replicate(),)):
            raise NotImplementedError(f"quant.Linear row-wise: the bias must be Replicate, got "
                                      f"{getattr(bias_after, 'placements', type(bias_after).__name__)}")
        out = out.redistribute(mesh, (Replicate(),)) + bias_after
    return out


def _distribute_as_linear(style: Any, module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
    """What torch's Colwise/RowwiseParallel ``_apply`` does for an ``nn.Linear``."""
    from torch.distributed.tensor import distribute_module

    return distribute_module(
        module, device_mesh, style._partition_linear_fn,
        partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),
        partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
    )


def colwise_parallel(**options: Any) -> Any:
    """torch's ``ColwiseParallel(**options)`` that also shards a quantized Linear."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    from tetrt_support.quant.linear import Linear

    class QuantColwiseParallel(ColwiseParallel):
        def _apply(self, module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
            if isinstance(module, Linear):
                return _distribute_as_linear(self, module, device_mesh)
            return super()._apply(module, device_mesh)

    return QuantColwiseParallel(**options)


def rowwise_parallel(**options: Any) -> Any:
    """torch's ``RowwiseParallel(**options)`` that also shards a quantized Linear."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import RowwiseParallel

    from tetrt_support.quant.linear import Linear

    class QuantRowwiseParallel(RowwiseParallel):
        def _apply(self, module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
            if isinstance(module, Linear):
                self.desired_input_layouts = (Shard(-1),)  # as RowwiseParallel sets it for nn.Linear
                return _distribute_as_linear(self, module, device_mesh)
            return super()._apply(module, device_mesh)

    return QuantRowwiseParallel(**options)
