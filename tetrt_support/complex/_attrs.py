"""Complex parameters, buffers and constants become real ``[..., 2]`` ones, same names.

Shared by both strategies. A parameter stays a parameter, a buffer keeps its
persistence (a non-persistent ``freqs_cis`` stays out of ``state_dict``), a plain
tensor attribute (an exported constant) stays a plain attribute; so ``state_dict`` keys
do not change.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

__all__ = ["pack_complex_attributes", "tensor_names_by_identity"]


def _owner(root: nn.Module, qualname: str) -> tuple[nn.Module, str]:
    *path, field = qualname.split(".")
    mod = root
    for p in path:
        mod = getattr(mod, p)
    return mod, field


def pack_complex_attributes(gm: fx.GraphModule) -> dict[str, torch.Tensor]:
    """Replace every complex tensor that a ``get_attr`` node reads by its
    ``view_as_real`` (sharing storage). Returns {qualname: packed tensor}."""
    packed: dict[str, torch.Tensor] = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        name = str(node.target)
        if name in packed:
            continue
        owner, field = _owner(gm, name)
        value = getattr(owner, field)
        if not (isinstance(value, torch.Tensor) and value.is_complex()):
            continue
        real = torch.view_as_real(value.detach())
        if isinstance(value, nn.Parameter):
            owner._parameters[field] = nn.Parameter(real, requires_grad=value.requires_grad)
        elif field in owner._buffers:
            owner._buffers[field] = real  # keeps its place in _non_persistent_buffers_set
        else:
            setattr(owner, field, real)
        packed[name] = getattr(owner, field)
    return packed


def tensor_names_by_identity(root: nn.Module) -> dict[int, str]:
    """{id(tensor): qualified name} for the parameters, buffers and plain tensor
    attributes of ``root`` and its submodules (first name wins for shared tensors)."""
    names: dict[int, str] = {}
    for prefix, mod in root.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for field, value in [*mod._parameters.items(), *mod._buffers.items(), *vars(mod).items()]:
            if isinstance(value, torch.Tensor):
                names.setdefault(id(value), dot + field)
    return names
