"""The audio codecs' whole forward, as users call it: ``model(input_values=wave,
input_features=features)`` encodes (weight-normed convolutions, a semantic model under
``no_grad``), quantizes and decodes. Exported with grad mode on, as users export, then
compiled with either strategy, static and dynamic: one engine block, eager's numbers.
XCodec2 here, NeuCodec in ``test_codec_neucodec.py`` (``codec_cases.py`` holds the check);
the upstream limits of NeuCodec and WavTokenizer here."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from tests.zoo.codec_cases import (  # noqa: F401 - the shared test, collected here with this codec
    CODECS,
    Codec,
    test_the_whole_codec_compiles_into_one_engine_block_called_by_keyword,
)
from tetrt_support import zoo
from tetrt_support.zoo import hf


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec("xcodec2_model")


def test_the_codec_recipes_are_the_whole_models_with_the_hop_the_dynamic_dims_use() -> None:
    for name in CODECS:
        model = zoo.build_model(name)
        assert type(model).__name__ in ("Xcodec2Model", "NeuCodecModel") and not model.training
        assert model.hop_length == hf.CODEC_HOP
        inputs = zoo.example_inputs(name, model)[1]
        assert set(inputs) == {"input_values", "input_features"}
        assert inputs["input_values"].shape[-1] == hf.CODEC_HOP * inputs["input_features"].shape[1]


def test_neucodec_with_a_dynamic_length_is_refused_by_torch_export_itself() -> None:
    """Upstream: NeuCodec's forward truncates its output to ``int(length * 1.5)`` (output over
    input sampling rate), a float of the length that export specialises: only the batch is
    dynamic in the zoo."""
    model = zoo.build_model("neucodec_model")
    inputs = zoo.example_inputs("neucodec_model", model)[1]
    t = Dim("t", min=2, max=32)
    shapes = {"input_values": {2: hf.CODEC_HOP * t}, "input_features": {1: t}}
    with pytest.raises(Exception, match=r"Constraints violated \(t\)") as raised:
        torch.export.export(model, (), inputs, dynamic_shapes=shapes, strict=False)
    assert "specialized value of 6" in str(raised.value)


def test_wavtokenizer_whole_forward_does_not_export_upstream() -> None:
    """Upstream: WavTokenizer's encoder convolution keeps its stride and kernel size as tensor
    buffers and pads by amounts computed from them; ``_pad1d`` then branches on
    ``length <= max(left, right)``, a data-dependent guard export cannot decide. The smallest
    repro is one such convolution, static shapes; the whole ``WavTokenizerModel(input_values=...)``
    stops at the same line. When torch (or transformers) lifts it, this test fails: add
    ``wavtokenizer_model`` to the zoo then."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    codec = zoo.build_model("wavtokenizer").codec
    conv = next(m for m in codec.modules() if type(m).__name__ == "WavTokenizerConv1d")
    x = torch.randn(2, conv.conv.in_channels, 16)
    match = r"data-dependent expression Eq\(u\d+, 1\)"
    with pytest.raises(GuardOnDataDependentSymNode, match=match):
        torch.export.export(conv, (x,), strict=False)
