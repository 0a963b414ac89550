"""The error raised when a complex-valued op has no lowering rule."""

from __future__ import annotations

from typing import Any

import torch.fx as fx

__all__ = ["UnsupportedComplexOp", "user_source_line"]


def user_source_line(node: fx.Node) -> str:
    """The user's own frame of ``node.meta["stack_trace"]`` (its last ``File ...`` entry
    plus the code line under it), or ``"<unknown source>"`` when the graph carries none.

    Export records the whole Python stack; the last frame is the line of the model that
    called the op, which is what a user needs to find it.
    """
    trace = node.meta.get("stack_trace") or ""
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith("File "):
            frame = lines[i].strip()
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{frame}: {code}" if code else frame
    return "<unknown source>"


class UnsupportedComplexOp(Exception):
    """A node computes on complex values and no rule lowers it to real arithmetic.

    Attributes: ``op`` (the ATen op or callable), ``node`` (the node's name) and
    ``source`` (the user's source line, from ``node.meta["stack_trace"]``).
    Lower with ``unsupported="fallback"`` to keep such ops as complex islands instead.
    """

    def __init__(self, op: Any, node: str, source: str) -> None:
        self.op = op
        self.node = node
        self.source = source
        super().__init__(
            f"no real lowering rule for complex op {op} at node {node!r} ({source}); "
            'lower(..., unsupported="fallback") keeps it as a complex op between '
            "view_as_complex and view_as_real"
        )
