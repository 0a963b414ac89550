"""The audio codecs' whole forward, exported with grad mode on and compiled: what the test
files of each codec share (``test_codec_models.py`` for XCodec2, ``test_codec_neucodec.py``
for NeuCodec, one file per codec so that two workers can each take one)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.export import Dim

import tetrt_support
from tetrt_support import zoo
from tetrt_support.zoo.sweep import max_relative_error

CODECS = ("xcodec2_model", "neucodec_model")
STRATEGIES = ("rewrite", "retrace")
TOLERANCE = 1e-4  # as the Hugging Face family tests and the sweep


class Codec:
    """One tiny codec and its programs, exported once per test module."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model = zoo.build_model(name)
        self.inputs = zoo.example_inputs(name, self.model)[1]
        family = zoo.ZOO[name]
        batch_dim, seq_dim = Dim("batch", min=1, max=16), Dim("seq", min=2, max=family.max_seq)
        shapes = family.dynamic_shapes(batch_dim, seq_dim)
        # grad mode on, as a user exports: the weight norms are computed with autograd
        self.programs = {
            False: torch.export.export(self.model, (), self.inputs, strict=False),
            True: torch.export.export(
                self.model, (), self.inputs, dynamic_shapes=shapes, strict=False
            ),
        }
        length_is_dynamic = "seq" in str(family.dynamic_shapes("batch", "seq"))
        seq = family.seq + 3 if length_is_dynamic else family.seq
        self.other = zoo.example_inputs(name, self.model, batch=3, seq=seq, seed=1)[1]


def same_outputs(expected: Any, actual: Any) -> None:
    assert type(actual) is type(expected) and list(actual.keys()) == list(expected.keys())
    assert max_relative_error(expected, actual) < TOLERANCE
    assert torch.equal(actual.audio_codes, expected.audio_codes)


def check_whole_codec_compiles(codec: Codec, strategy: str, dynamic: bool) -> None:
    """One engine block, the caller's program unchanged, eager's numbers by keyword."""
    program = codec.programs[dynamic]
    before = {k: v.clone() for k, v in program.state_dict.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter notices; a failed build shows in the summary
        compiled = tetrt_support.compile(program, backend="onnxruntime", strategy=strategy)
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    assert all(torch.equal(v, before[k]) for k, v in program.state_dict.items())  # unchanged
    with torch.no_grad():
        same_outputs(codec.model(**codec.inputs), compiled(**codec.inputs))
        if dynamic:
            same_outputs(codec.model(**codec.other), compiled(**codec.other))
        assert not torch.is_grad_enabled()  # the semantic model's no_grad region left no switch


@pytest.mark.parametrize("dynamic", (False, True), ids=("static", "dynamic"))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_whole_codec_compiles_into_one_engine_block_called_by_keyword(
    codec: Codec, strategy: str, dynamic: bool
) -> None:
    """Collected by each codec's test file (imported there), with that file's ``codec``."""
    check_whole_codec_compiles(codec, strategy, dynamic)
