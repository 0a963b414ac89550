"""The real models of the notebooks, tests and benchmarks, in one registry.

- :mod:`.registry`: :data:`ZOO`, every model by name (a :class:`ZooEntry` each), and
  :func:`build_model`, :func:`example_inputs`, :func:`export_model` for any of them;
- :mod:`.rope`: small rotary-embedding modules (complex and rotate-half RoPE, an attention
  block, a tiny Hugging Face Llama 4), registered by name;
- :mod:`.hf`: every model family of the installed ``transformers`` that computes with
  complex numbers, each built from a tiny config with random weights (nothing is
  downloaded), with keyword example inputs and its dynamic dims (:func:`hf_families`);
  transformers is imported when a family is built, not before;
- :mod:`.discover`: finds those families by reading transformers' own modeling code, so a
  sweep notices a family that has no recipe here yet.
- :mod:`.decoder`: a plain-PyTorch Llama-3-style decoder for training benchmarks
  (``Decoder``, ``DecoderConfig``, ``decoder_config``); imported on its own, not re-exported.
"""

from __future__ import annotations

from tetrt_support.zoo import hf, registry, rope  # noqa: F401 (each registers its models)
from tetrt_support.zoo.registry import *  # noqa: F403
from tetrt_support.zoo.rope import *  # noqa: F403

__all__ = sorted([*registry.__all__, *rope.__all__, "complex_modeling_files"])


def __getattr__(name: str):
    if name == "complex_modeling_files":  # reads transformers' source files: only when asked for
        from tetrt_support.zoo.discover import complex_modeling_files

        return complex_modeling_files
    raise AttributeError(f"module 'tetrt_support.zoo' has no attribute {name!r}")
