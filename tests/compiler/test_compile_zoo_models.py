"""RoPE models and HF Llama 4 (tiny) compile to ONE engine block with nothing left to
PyTorch, keep dynamic batch and sequence dims, and match eager."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils import _pytree as pytree

import tetrt_support
from tetrt_support import zoo
from tests.assertions import assert_same_outputs


@functools.cache
def _compiled(name: str, dynamic: bool, strategy: str):
    model = zoo.build_model(name)
    exported = zoo.export_model(name, model=model, dynamic=dynamic)
    return model, tetrt_support.compile(exported.program, backend="onnxruntime", strategy=strategy)


@pytest.mark.parametrize(
    ("name", "dynamic", "strategy"),
    [
        ("complex_rope", False, "rewrite"),
        ("complex_rope", True, "retrace"),
        ("complex_rope_polar", True, "rewrite"),
        ("rope_attention", True, "rewrite"),
        ("rope_attention", False, "retrace"),
        ("rotate_half_rope", False, "rewrite"),
    ],
)
def test_rope_models_are_one_engine_block(name: str, dynamic: bool, strategy: str) -> None:
    model, module = _compiled(name, dynamic, strategy)
    assert module.blocks_summary() == "1 engine block, 0 fallback blocks"
    # other sizes than the export's (batch 2, seq 8) when the dims are dynamic
    batch, seq = (3, 5) if dynamic else (2, 8)
    args, kwargs = zoo.example_inputs(name, model, batch=batch, seq=seq, seed=1)
    assert_same_outputs(model(*args, **kwargs), module(*args, **kwargs), atol=1e-5)


def test_static_export_rejects_another_sequence_length() -> None:
    model, module = _compiled("complex_rope", False, "rewrite")
    args, _ = zoo.example_inputs("complex_rope", model, batch=2, seq=5, seed=1)
    with pytest.raises(Exception, match="(?i)dimension|shape|got"):  # ONNX Runtime's own shape error
        module(*args)


def test_tiny_llama4_is_one_engine_block_called_by_keyword() -> None:
    model = zoo.tiny_llama4()
    exported = zoo.export_llama4(model, dynamic=True)
    module = tetrt_support.compile(exported.program, backend="onnxruntime", strategy="rewrite")
    assert module.blocks_summary() == "1 engine block, 0 fallback blocks"
    ids = zoo.llama4_example_inputs(model, batch=3, seq=5, seed=1)
    out, ref = module(**ids), model(**ids)
    assert type(out) is type(ref) and list(out.keys()) == list(ref.keys())
    leaves = [(a, b) for a, b in zip(pytree.tree_leaves(out), pytree.tree_leaves(ref)) if isinstance(a, torch.Tensor)]
    assert leaves and all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in leaves)
    with pytest.raises(TypeError, match="unexpected keyword argument 'input_idz'"):
        module(input_idz=ids["input_ids"])
