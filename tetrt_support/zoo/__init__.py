"""The real models of the notebooks, tests and benchmarks, in two families of modules.

- :mod:`.rope`: small rotary-embedding modules (complex and rotate-half RoPE, an attention
  block, a tiny Hugging Face Llama 4) and the :data:`ZOO` registry that exports them by name;
- :mod:`.hf`: every model family of the installed ``transformers`` that computes with
  complex numbers, each built from a tiny config with random weights (nothing is
  downloaded), with keyword example inputs and its dynamic dims (:data:`HF_FAMILIES`);
- :mod:`.discover`: finds those families by reading transformers' own modeling code, so a
  sweep notices a family that has no recipe here yet.
- :mod:`.decoder`: a plain-PyTorch Llama-3-style decoder for training benchmarks
  (``Decoder``, ``DecoderConfig``, ``decoder_config``); imported on its own, not re-exported.
"""

from __future__ import annotations

from tetrt_support.zoo import rope
from tetrt_support.zoo.rope import *  # noqa: F403 (the RoPE zoo is the package's eager part)

# Loaded on first use by ``__getattr__``: they import transformers' model code.
_FROM_HF = ("HF_FAMILIES", "HFFamily", "export_family")

__all__ = sorted([*rope.__all__, *_FROM_HF, "complex_modeling_files"])


def __getattr__(name: str):
    # The Hugging Face families import transformers model code: only when asked for.
    if name in _FROM_HF:
        from tetrt_support.zoo import hf

        return getattr(hf, name)
    if name == "complex_modeling_files":
        from tetrt_support.zoo.discover import complex_modeling_files

        return complex_modeling_files
    raise AttributeError(f"module 'tetrt_support.zoo' has no attribute {name!r}")
