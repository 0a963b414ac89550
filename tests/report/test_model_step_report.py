"""report.model_step: the whole-model step's table and claims, from the stored file and a made one."""

from __future__ import annotations

import pytest

from tetrt_support.report import model_step, results


def _result(peer_host: float = 20.0) -> dict:
    def variant(ms: float, host: float, peak: float, loss: float) -> dict:
        return {"median_ms": ms, "speedup_vs_bf16": 30.0 / ms, "host_ms_per_step": host, "peak_memory_gib": peak,
                "first_step_s": 10.0, "loss_rel_diff_vs_bf16": loss}

    return {"machine": {"gpu": "GPU"}, "suites": {"model_step": {"cases": {"c": {
        "config": {"layers": 4, "hidden": 64, "ffn": 128}, "tokens": 256,
        "variants": {"bf16": variant(30.0, 10.0, 8.0, 0.0), "torchao_float8_tensorwise": variant(25.0, peer_host, 7.5, 0.001),
                     "fp8_current": variant(60.0, 60.0, 9.0, 0.02), "fp8_block": {"error": "boom"}}}}}}}


def test_claims_are_ratios_within_the_case() -> None:
    (line,) = model_step.model_step_claims(_result(), "c")
    assert line == ("fp8_current: 0.500x bf16; 0.417x torchao's speed; host 3.00x torchao's; "
                    "peak memory 1.125x bf16's; loss +2.00% (OUTSIDE 1% of bf16's)")


def test_table_lists_every_variant_and_marks_a_failed_one() -> None:
    table = model_step.model_step_table(_result(), "c")
    assert [row[0] for row in table.rows] == ["bf16", "torchao_float8_tensorwise", "fp8_current", "fp8_block"]
    assert table.rows[-1][1] == "failed"
    assert table.title == "c: 4 layers, hidden 64, FFN 128, 256 tokens, GPU"


def test_the_stored_file_reads() -> None:
    stored = results.load(results.RESULTS_DIR / "model_step_cuda.json", "model_step")
    cases = stored["suites"]["model_step"]["cases"]
    assert cases, "the stored model_step run holds no case"
    for case in cases:
        table = model_step.model_step_table(stored, case)
        assert table.rows[0][0] == "bf16" and table.rows[0][2] == "1.000x"
        assert len(model_step.model_step_claims(stored, case)) == len(table.rows) - 2


def test_an_unknown_case_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        model_step.model_step_table(_result(), "nope")
