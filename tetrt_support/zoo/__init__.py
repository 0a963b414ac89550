"""The real models of the notebooks, tests and benchmarks, in two families of modules.

- :mod:`.rope`: small rotary-embedding modules (complex and rotate-half RoPE, an attention
  block, a tiny Hugging Face Llama 4) and the :data:`ZOO` registry that exports them by name;
- :mod:`.hf`: every model family of the installed ``transformers`` that computes with
  complex numbers, each built from a tiny config with random weights (nothing is
  downloaded), with keyword example inputs and its dynamic dims (:data:`HF_FAMILIES`);
- :mod:`.discover`: finds those families by reading transformers' own modeling code, so a
  sweep notices a family that has no recipe here yet.
"""

from __future__ import annotations

from tetrt_support.zoo.rope import (
    ZOO,
    ComplexRoPE,
    ComplexRoPEAttention,
    ComplexRoPEPolar,
    RotateHalfRoPE,
    ZooEntry,
    ZooExport,
    apply_complex_rope,
    apply_rotate_half_rope,
    build_model,
    example_inputs,
    export_llama4,
    export_model,
    half_to_interleaved,
    interleaved_to_half,
    llama4_config,
    llama4_example_inputs,
    precompute_freqs_cis,
    rope_inverse_frequencies,
    rotate_half,
    tiny_llama4,
)

__all__ = [
    "HF_FAMILIES",
    "ZOO",
    "ComplexRoPE",
    "ComplexRoPEAttention",
    "ComplexRoPEPolar",
    "HFFamily",
    "RotateHalfRoPE",
    "ZooEntry",
    "ZooExport",
    "apply_complex_rope",
    "apply_rotate_half_rope",
    "build_model",
    "complex_modeling_files",
    "example_inputs",
    "export_family",
    "export_llama4",
    "export_model",
    "half_to_interleaved",
    "interleaved_to_half",
    "llama4_config",
    "llama4_example_inputs",
    "precompute_freqs_cis",
    "rope_inverse_frequencies",
    "rotate_half",
    "tiny_llama4",
]


def __getattr__(name: str):
    # The Hugging Face families import transformers model code: only when asked for.
    if name in ("HF_FAMILIES", "HFFamily", "export_family"):
        from tetrt_support.zoo import hf

        return getattr(hf, name)
    if name == "complex_modeling_files":
        from tetrt_support.zoo.discover import complex_modeling_files

        return complex_modeling_files
    raise AttributeError(f"module 'tetrt_support.zoo' has no attribute {name!r}")
