"""The shipped compiler: an exported program in, a module of engine blocks out, called
exactly like ``ep.module()``.

:func:`compile` is the ordered pass list :data:`~tetrt_support.compiler.pipeline.PASSES`
(lower, partition, build engine blocks, complex I/O adapters, signature, input check);
:mod:`.context` is the contract every pass keeps (``(gm, ctx) -> gm``, and what ``ctx``
holds); :mod:`.partition`, :mod:`.io_adapters`, :mod:`.input_check` and :mod:`.engines`
hold what the passes call, and :mod:`.serialization` saves and loads the result.
:mod:`.settings` holds the options (Torch-TensorRT's names; ``backend`` is the engine of
the engine blocks), :mod:`.backend` the ``torch.compile`` backend ``"tetrt"``,
:mod:`.refit` ``refit_module_weights``.
"""

from __future__ import annotations

from tetrt_support.compiler.backend import register_backend
from tetrt_support.compiler.pipeline import BACKENDS, PASSES, STRATEGIES, CompiledModule, compile
from tetrt_support.compiler.refit import refit_module_weights
from tetrt_support.compiler.serialization import load, save
from tetrt_support.compiler.settings import CompilationSettings

__all__ = [
    "BACKENDS",
    "PASSES",
    "STRATEGIES",
    "CompilationSettings",
    "CompiledModule",
    "compile",
    "load",
    "refit_module_weights",
    "save",
]

# torch.compile(..., backend="tetrt") works once this package is imported (and without
# any import where the package is installed: its torch_dynamo_backends entry point).
register_backend()
