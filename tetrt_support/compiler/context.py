"""The pass contract: every compiler pass is a :class:`Pass`, ``(gm, ctx) -> gm``.

``ctx`` is the :class:`CompileContext`: what ``compile`` was asked and what earlier passes
found. Those facts live on ``ctx`` only, since a pass may hand on a NEW module; ``gm.meta`` is
written once, by the last pass, as the compiled module's record (read by ``blocks()``,
``complex_io()``, ``refit_module_weights``, ``save``). A helper also used on its own
(``lower``, ``fold_constants``) returns its record in ``meta``; its pass moves it to ``ctx``.
This module imports nothing at run time, so any module of passes can import it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import fx

    from tetrt_support.compiler.constant_folding import FoldedConstants
    from tetrt_support.compiler.engines.base import Engine
    from tetrt_support.compiler.settings import CompilationSettings

__all__ = ["CompileContext", "Pass"]


@dataclasses.dataclass
class CompileContext:
    """What the passes share. The first six fields are set by ``run_passes`` and read only;
    each later field is written by the one pass named and read by the passes after it.

    - ``exported_program``: the program being compiled (never changed: passes work on
      ``ep.module()``);
    - ``engine_name``: the engine that builds engine blocks, i.e. ``compile(backend=...)``
      (``"onnxruntime"``, ``"eager"``, ...), not torch.compile's backend;
    - ``strategy``: the complex lowering, ``"rewrite"`` or ``"retrace"``;
    - ``engine``: that engine with ``settings`` applied (a ``ConfiguredEngine``);
    - ``example_inputs``: the user inputs the program was exported with, flat, in
      placeholder order;
    - ``settings``: the options (:class:`~tetrt_support.compiler.settings.CompilationSettings`);
    - ``complex_inputs``, ``complex_outputs`` (``lower_complex``): a complex dtype, or None
      for a real value, per flat input and output of the program;
    - ``folded`` (``fold_constants``): how to compute the folded constants again, or None
      if nothing folded;
    - ``refit_weights``, ``block_weights`` (``record_refit_weights``): the program's weights
      ``{name: (shape, dtype, persistent, device)}``, and per block the names of those its
      graph reads; None until recorded;
    - ``reference_blocks`` (``keep_reference_blocks``): a PyTorch copy of each engine block,
      which ``check_engine_blocks`` compares the built block with (and then drops);
    - ``block_ops`` (``build_engine_blocks``): per engine block, the ATen ops of its graph,
      recorded before the engine replaces it.

    A block demoted to PyTorch keeps its entries under its new name
    (:func:`~tetrt_support.compiler.partition.run_block_in_pytorch`).
    """

    exported_program: torch.export.ExportedProgram
    engine_name: str
    strategy: str
    engine: Engine
    example_inputs: list[Any]
    settings: CompilationSettings
    complex_inputs: list[torch.dtype | None] = dataclasses.field(default_factory=list)
    complex_outputs: list[torch.dtype | None] = dataclasses.field(default_factory=list)
    folded: FoldedConstants | None = None
    refit_weights: dict[str, tuple[Any, ...]] | None = None
    block_weights: dict[str, list[str]] | None = None
    reference_blocks: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)
    block_ops: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def packed_example_inputs(self) -> list[Any]:
        """The example inputs as the lowered graph takes them (complex ones packed)."""
        import torch

        return [
            torch.view_as_real(v) if dtype is not None else v
            for v, dtype in zip(self.example_inputs, self.complex_inputs)
        ]


class Pass(Protocol):
    """One step of the compiler: returns the module to hand to the next pass (``gm`` itself,
    changed in place, or a new module); reads and writes ``ctx`` as :class:`CompileContext`
    says. A pass's ``__name__`` is how pass lists name it."""

    __name__: str

    def __call__(self, gm: fx.GraphModule, ctx: CompileContext, /) -> fx.GraphModule: ...
