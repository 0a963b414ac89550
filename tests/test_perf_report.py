"""perf_report reads the stored results and states the targets from them."""

import json
import pathlib

import pytest

from tetrt_support import perf_report

RESULTS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _fake_result() -> dict:
    def rope(frac: float) -> dict:
        return {"median_s": 1e-3 / frac, "bandwidth_GBps": 4000 * frac, "fraction_of_clone_bandwidth": frac}

    return {
        "machine": {"gpu": "GPU X", "torch": "2.x", "when_utc": "then", "processor": "x86_64", "cpu_count": 1, "torch_threads": 1},
        "suites": {
            "rope": {"shape_q_k": [1, 2, 3, 4], "variants": {
                "clone": rope(1.0), "lowered_rewrite_compiled": rope(0.98), "lowered_retrace_compiled": rope(0.90),
                "real_handwritten_compiled": rope(0.97), "real_handwritten_compiled_one_graph": rope(0.99)}},
            "linear": {"m_n_k": [8, 8, 8], "cases": {}, "ratios": {"fp8_current_forward_over_scaled_mm": 0.69}},
        },
    }


def test_targets_are_judged_from_the_file() -> None:
    lines = perf_report.target_claims(_fake_result())
    assert "RoPE lowered_rewrite_compiled: 0.980 of clone bandwidth (target >= 0.97): met" in lines
    assert "RoPE lowered_retrace_compiled: 0.900 of clone bandwidth (target >= 0.97): NOT met" in lines
    assert any(line.startswith("noise yardstick") and line.endswith("0.020") for line in lines)
    assert any("(target >= 0.7): NOT met" in line for line in lines)


def test_cpu_files_get_figures_without_verdicts() -> None:
    result = _fake_result()
    del result["machine"]["gpu"]
    lines = perf_report.target_claims(result)
    assert "RoPE lowered_rewrite_compiled: 0.980 of clone bandwidth" in lines
    assert not any("target" in line for line in lines)


def test_a_file_that_is_not_a_results_file_is_named(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match=r"x.json lacks \['machine', 'suites'\]"):
        perf_report.load_results(bad)
    with pytest.raises(FileNotFoundError, match="benchmarks.perf"):
        perf_report.load_results(tmp_path / "missing.json")


def test_a_failed_suite_is_reported_not_tabulated() -> None:
    result = _fake_result()
    result["suites"]["rope_attention"] = {"error": "RuntimeError: boom"}
    with pytest.raises(KeyError, match="rope_attention"):
        perf_report.attention_table(result)


def test_stored_h200_results_read_back() -> None:
    result = perf_report.load_results(RESULTS / "perf_cuda.json")
    assert "H200" in perf_report.machine_line(result)
    assert "lowered_rewrite_compiled" in perf_report.rope_table(result)
    assert "fp8_scaled_mm_raw" in perf_report.linear_table(result)
