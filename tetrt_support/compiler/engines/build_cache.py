"""Engine bytes built once per process for each distinct block.

An engine that serializes a block (ONNX Runtime) reads only the block's graphs, the tensors
it holds, its example inputs' metadata and the ``dynamic_shapes`` its export gets; weights
reach it as inputs. :func:`block_key` hashes exactly that, and :class:`BuildCache` returns
the bytes of an earlier build with the same key instead of exporting again. Torch-TensorRT's
engine cache, compared: ``docs/architecture.md`` ("Module notes", the ONNX Runtime engine).
"""

from __future__ import annotations

import hashlib
import types
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.export.dynamic_shapes import Dim

from tetrt_support.compiler.engines.base import attribute_at

__all__ = ["BuildCache", "CacheInfo", "block_key"]


@dataclass(frozen=True)
class CacheInfo:
    """What a :class:`BuildCache` holds and how it has been used."""

    hits: int
    misses: int
    entries: int
    size_bytes: int


def _tensor_digest(t: torch.Tensor) -> str:
    t = t.detach()
    head = f"{t.dtype}{tuple(t.shape)}{t.stride()}{t.device}"
    if t.numel() == 0:
        return head
    data = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return head + hashlib.sha256(data).hexdigest()


def _input_digest(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {x.dtype}{tuple(x.shape)}{x.stride()}{x.device} grad={x.requires_grad}"
    return f"{type(x).__name__} {x!r}"  # an int input: export marks it dynamic


# Targets the generated code names unambiguously: torch's op objects (``torch.ops...``) and
# functions built into C (``torch.tanh``, ``operator.mul``). A Python function is named there
# by its ``__name__`` only, so two different functions could read the same: a block calling
# one is not stored.
_NAMED_TYPES = (torch._ops.OpOverload, torch._ops.OpOverloadPacket, torch._ops.HigherOrderOperator,
                types.BuiltinFunctionType)


def _dims_digest(shapes: Any) -> str:
    """Every Dim export receives, with its bounds (a derived Dim's repr hides its root's)."""

    def describe(leaf: Any) -> Any:
        if isinstance(leaf, Dim):
            root = getattr(leaf, "root", None)
            own = (leaf.__name__, leaf.min, leaf.max)
            return own if root is None else (own, (root.__name__, root.min, root.max))
        return repr(leaf)

    return repr(pytree.tree_map(describe, shapes, is_leaf=lambda x: isinstance(x, Dim)))


def block_key(
    block: fx.GraphModule, example_inputs: list[Any], dynamic_shapes: Any, *engine_config: Any
) -> str | None:
    """A digest of what building ``block`` reads (and the grad mode and default dtype a trace
    runs under), or ``None`` if the block holds something other than tensors and graphs or
    calls a function the generated code cannot name unambiguously."""
    digest = hashlib.sha256()
    for name, module in block.named_modules():
        if not isinstance(module, fx.GraphModule):
            return None
        digest.update(f"module {name}\n{module.code}\n".encode())
        for node in module.graph.nodes:
            if node.op == "call_function" and not isinstance(node.target, _NAMED_TYPES):
                return None
            if node.op != "get_attr":
                continue
            obj = attribute_at(module, str(node.target))
            if isinstance(obj, torch.Tensor):
                digest.update(f"attr {name}.{node.target} {_tensor_digest(obj)}\n".encode())
            elif not isinstance(obj, fx.GraphModule):
                return None
    for i, x in enumerate(example_inputs):
        digest.update(f"input {i} {_input_digest(x)}\n".encode())
    digest.update(f"dynamic {_dims_digest(dynamic_shapes)}\n".encode())
    digest.update(f"trace grad={torch.is_grad_enabled()} {torch.get_default_dtype()}\n".encode())
    digest.update(f"engine {engine_config!r}\n".encode())
    return digest.hexdigest()


class BuildCache:
    """Bytes by :func:`block_key`, least recently used dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._hits = 0
        self._misses = 0

    def get_or_build(self, key: str | None, build: Callable[[], bytes]) -> bytes:
        """The bytes stored under ``key``, else ``build()``'s (stored unless ``key`` is None).
        A build that raises stores nothing."""
        if key is not None and key in self._entries:
            self._hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        self._misses += 1
        built = build()
        if key is not None and len(built) <= self.max_bytes:
            self._entries[key] = built
            while sum(map(len, self._entries.values())) > self.max_bytes:
                self._entries.popitem(last=False)
        return built

    def info(self) -> CacheInfo:
        return CacheInfo(self._hits, self._misses, len(self._entries), sum(map(len, self._entries.values())))

    def clear(self) -> None:
        """Forget every entry and reset the counts."""
        self._entries.clear()
        self._hits = self._misses = 0
