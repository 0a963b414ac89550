"""NeuCodec's whole forward, as users call it (``model(input_values=wave,
input_features=features)``), exported with grad mode on and compiled with either strategy,
static and dynamic (the batch: its length is specialised by export, see
``test_codec_models.py``): one engine block, eager's numbers. The check is
``codec_cases.py``'s, shared with XCodec2 in ``test_codec_models.py``."""

from __future__ import annotations

import pytest

from tests.zoo.codec_cases import (  # noqa: F401 - the shared test, collected here with this codec
    Codec,
    test_the_whole_codec_compiles_into_one_engine_block_called_by_keyword,
)


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec("neucodec_model")
