"""The one set-up call at the top of every notebook.

nbval compares every stored output, stderr included, so everything that could make a
replay differ from the stored run is pinned here: seeds, print options, warning filters,
the matplotlib backend, a private inductor cache (a warm shared cache once crashed a
compile here, see DESIGN.md §4) and progress bars (they write to stderr).
"""

from __future__ import annotations

import os
import random
import tempfile
import warnings

_INDUCTOR_CACHE: str | None = None


def private_inductor_cache() -> str:
    """Point TORCHINDUCTOR_CACHE_DIR at a fresh directory owned by this process."""
    global _INDUCTOR_CACHE
    if _INDUCTOR_CACHE is None:
        _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="tetrt-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
        os.environ["TRITON_CACHE_DIR"] = os.path.join(_INDUCTOR_CACHE, "triton")
    return _INDUCTOR_CACHE


def setup(seed: int = 0) -> None:
    """Make a notebook's outputs reproducible and its stderr quiet."""
    private_inductor_cache()
    os.environ.setdefault("TQDM_DISABLE", "1")

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=110)
    np.set_printoptions(precision=4, suppress=True, linewidth=110)

    # Known, understood warnings that would otherwise land in (compared) stderr.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    warnings.filterwarnings("ignore", message=".*Casting complex values to real discards.*")
    warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets
    import logging

    for name in ("torch._dynamo", "torch._inductor", "torch.onnx", "onnxscript", "torch.export"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    try:
        import matplotlib

        try:
            get_ipython()  # type: ignore[name-defined]  # noqa: F821
            matplotlib.use("module://matplotlib_inline.backend_inline")
        except NameError:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        plt.rcParams.update({"figure.dpi": 90, "figure.figsize": (7.0, 3.6), "svg.hashsalt": "tetrt"})
    except ImportError:
        pass
