"""The Hugging Face families that compute with complex numbers: found by reading
transformers, built tiny without a download, exported, and compiled into one engine block."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils import _pytree as pytree

import tetrt_support
from tetrt_support import zoo
from tetrt_support.zoo.discover import complex_modeling_files


def test_discovery_reads_the_modeling_code_and_every_found_family_has_a_recipe() -> None:
    found = {s.family: s for s in complex_modeling_files()}
    assert {"llama4", "deepseek_v2", "fnet", "autoformer", "wavtokenizer", "xcodec2", "neucodec"} <= set(found)
    assert {f.module for f in zoo.hf_families().values()} == set(found)
    assert "torch.fft" in found["fnet"].markers and "view_as_complex" in found["llama4"].markers
    assert all(s.path.startswith("models/") and "/modeling_" in s.path for s in found.values())


@pytest.mark.parametrize("name", ["torch.view_as_complex", "x.view_as_complex", "torch.polar", "torch.fft.rfft",
                                  "torch.complex64", "torch.cdouble", "torch.istft", "torch.complex"])
def test_every_name_a_marker_matches_holds_a_word_of_the_text_filter(name: str) -> None:
    """Discovery parses only files whose text holds one of ``MARKER_WORDS``: each marker's
    pattern needs one of them (a pattern without one would make the filter skip real hits)."""
    from tetrt_support.zoo.discover import COMPLEX_MARKERS, MARKER_WORDS

    matched = [marker for marker, pattern in COMPLEX_MARKERS.items() if pattern.search(name)]
    assert matched and any(word in name for word in MARKER_WORDS)
    for marker, pattern in COMPLEX_MARKERS.items():  # and each pattern's literal part holds one
        assert any(word in pattern.pattern for word in MARKER_WORDS), marker


def test_families_are_tiny_seeded_and_take_keyword_inputs() -> None:
    a, b, c = zoo.build_model("fnet", seed=0), zoo.build_model("fnet", seed=0), zoo.build_model("fnet", seed=1)
    assert not a.training and sum(p.numel() for p in a.parameters()) < 100_000
    wa, wb, wc = (m.embeddings.word_embeddings.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    with pytest.raises(KeyError, match="unknown zoo model 'fnet2'"):
        zoo.build_model("fnet2")


def _max_rel(expected, actual) -> float:
    worst = 0.0
    for w, g in zip(pytree.tree_leaves(expected), pytree.tree_leaves(actual)):
        if isinstance(w, torch.Tensor) and w.is_floating_point():
            worst = max(worst, ((g - w).abs().max() / (w.abs().max() or 1)).item())
    return worst


@pytest.mark.parametrize("name", list(zoo.hf_families()))
def test_family_compiles_into_one_onnxruntime_block_called_like_the_model(name: str) -> None:
    model = zoo.build_model(name)
    program, _, inputs = zoo.export_model(name, model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter notices; a failed build would show in the summary
        compiled = tetrt_support.compile(program, backend="onnxruntime", strategy="rewrite")
    assert compiled.blocks_summary() == "1 engine block, 0 fallback blocks"
    with torch.no_grad():
        expected, actual = model(**inputs), compiled(**inputs)
    assert type(actual) is type(expected) and list(actual.keys()) == list(expected.keys())
    assert _max_rel(expected, actual) < 1e-4


def test_autoformer_with_a_dynamic_time_axis_is_refused_by_torch_export_itself() -> None:
    """Upstream: Autoformer's code ties the past length to its config (context_length plus the
    largest lag), so export specialises a dynamic time axis, with no complex rule involved."""
    from torch.export import Dim

    model = zoo.build_model("autoformer")
    inputs = zoo.example_inputs("autoformer", model)[1]
    t = Dim("t", min=4, max=64)
    shapes = {k: ({1: t} if k.startswith("past_") else None) for k in inputs}
    with pytest.raises(Exception, match=r"specialized it to be a constant \(10\)"):
        torch.export.export(model, (), inputs, dynamic_shapes=shapes, strict=False)


def test_fnet_with_tpu_fourier_matrices_takes_one_sequence_length_only() -> None:
    """Upstream: FNet's DFT-matrix path checks seq == tpu_short_seq_length in its own code."""
    model = zoo.build_model("fnet_tpu")
    inputs = zoo.example_inputs("fnet_tpu", model, seq=6)[1]
    with pytest.raises(ValueError, match="tpu_short_seq_length"):
        model(**inputs)
