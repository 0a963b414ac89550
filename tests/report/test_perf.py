"""report.perf states the tables and target claims of the stored results files."""

from __future__ import annotations

import json
import pathlib

import pytest

from tetrt_support.report import perf, results
from tetrt_support.report.results import RESULTS_DIR


def _fake_perf() -> dict:
    def rope(frac: float) -> dict:
        return {"median_s": 1e-3 / frac, "bandwidth_GBps": 4000 * frac, "fraction_of_clone_bandwidth": frac}

    return {
        "benchmark": "perf",
        "machine": {"gpu": "GPU X", "torch": "2.x", "when_utc": "then", "processor": "x86_64", "cpu_count": 1, "torch_threads": 1},
        "suites": {
            "rope": {"shape_q_k": [1, 2, 3, 4], "variants": {
                "clone": rope(1.0), "lowered_rewrite_compiled": rope(0.98), "lowered_retrace_compiled": rope(0.90),
                "real_handwritten_compiled": rope(0.97), "real_handwritten_compiled_one_graph": rope(0.99)}},
            "linear": {"m_n_k": [8, 8, 8], "cases": {}, "ratios": {"fp8_current_forward_over_scaled_mm": 0.69}},
        },
    }


def _fake_lowering(rewrite=(1.0, 2.0), retrace=(2.0, 4.0), torch_s=(4.0, 8.0)) -> dict:  # noqa: ANN001
    rows = [
        {"layers": n, "strategies": {"rewrite": {"median_s": a}, "retrace": {"median_s": b}, "decompose_complex_in_graph": {"median_s": c}}}
        for n, a, b, c in zip((2, 4), rewrite, retrace, torch_s)
    ]
    return {
        "benchmark": "lowering",
        "machine": {"platform": "Linux-test", "torch": "2.14.1", "cpu_count": 2},
        "lowering_time": {
            "rows": rows,
            "linear_fit": {"rewrite": {"seconds_per_layer": 0.5, "intercept_s": 0.0, "r2": 1.0}},
            "rewrite_over_decompose": [{"layers": 2, "rewrite_over_decompose": 0.25}, {"layers": 4, "rewrite_over_decompose": 0.25}],
            "target": "rewrite <= 0.5 x decompose_complex_in_graph at every size",
            "target_met": True,
        },
        "rope_runtime_cpu": {"shape_q_k": [1, 2, 3, 4], "variants": {"complex_eager": {"median_s": 1.0, "relative_to_complex_eager": 1.0}}},
    }


def test_targets_are_judged_from_the_file() -> None:
    lines = perf.target_claims(_fake_perf())
    assert "RoPE lowered_rewrite_compiled: 0.980 of clone bandwidth (target >= 0.97): met" in lines
    assert "RoPE lowered_retrace_compiled: 0.900 of clone bandwidth (target >= 0.97): NOT met" in lines
    assert any(line.startswith("noise yardstick") and line.endswith("0.020") for line in lines)
    assert ("RoPE lowered_retrace_compiled / real_handwritten_compiled_one_graph: 0.909 (target >= 0.99): NOT met"
            in lines)
    assert any("(target >= 0.7): NOT met" in line for line in lines)


def test_cpu_files_get_figures_without_verdicts() -> None:
    result = _fake_perf()
    del result["machine"]["gpu"]
    lines = perf.target_claims(result)
    assert "RoPE lowered_rewrite_compiled: 0.980 of clone bandwidth" in lines
    assert not any("target" in line for line in lines)


def test_smoke_runs_say_so_in_every_headline() -> None:
    result = _fake_perf() | {"smoke_run": True}
    assert perf.machine_line(result).startswith("SMOKE RUN")
    assert perf.target_claims(result)[0].startswith("SMOKE RUN")
    assert perf.lowering_claims(_fake_lowering() | {"smoke_run": True})[0].startswith("SMOKE RUN")
    assert not perf.machine_line(_fake_perf()).startswith("SMOKE RUN")


def test_a_failed_suite_is_reported_not_tabulated() -> None:
    result = _fake_perf()
    result["suites"]["rope_attention"] = {"error": "RuntimeError: boom"}
    with pytest.raises(KeyError, match="rope_attention"):
        perf.attention_table(result)


def test_rope_table_is_titled_by_the_shape() -> None:
    table = perf.rope_table(_fake_perf())
    assert table.title == "q, k of shape [1, 2, 3, 4], float32"
    assert table.column("of clone") == ["1.000", "0.980", "0.900", "0.970", "0.990"]
    assert str(table).splitlines()[0] == table.title


def test_lowering_results_become_curves_and_stable_claims() -> None:
    result = _fake_lowering()
    assert perf.lowering_curves(result)["retrace"] == ([2, 4], [2.0, 4.0])
    claims = perf.lowering_claims(result)
    assert "rewrite: 500.0 ms per layer, linear fit R^2 = 1.000" in claims
    assert "rewrite faster than retrace at every size: True" in claims
    assert " 4 layers: rewrite / decompose_complex_in_graph = 0.25" in claims
    assert claims[-1] == "RoPE [1, 2, 3, 4] complex_eager: 1.00x complex eager time"
    assert "rewrite faster than retrace at every size: False" in perf.lowering_claims(_fake_lowering(rewrite=(1.0, 5.0)))


def test_stored_files_read_back(tmp_path: pathlib.Path) -> None:
    cuda = results.load(RESULTS_DIR / "perf_cuda.json", "perf")
    assert "H200" in perf.machine_line(cuda)
    assert "lowered_rewrite_compiled" in str(perf.rope_table(cuda))
    assert "fp8_scaled_mm_raw" in str(perf.linear_table(cuda))
    cpu = results.load(RESULTS_DIR / "perf_cpu.json", "perf")
    assert "CPU" in perf.machine_line(cpu) and not results.is_smoke_run(cpu)
    lowering = results.load(RESULTS_DIR / "lowering.json", "lowering")
    assert set(perf.lowering_curves(lowering)) == {"rewrite", "retrace", "decompose_complex_in_graph"}
    path = tmp_path / "lowering.json"
    path.write_text(json.dumps(_fake_lowering()))
    assert results.load(path, "lowering")["lowering_time"]["target_met"] is True


def test_gpu_check_claims_count_the_unequal_cases_by_family_and_dtype() -> None:
    def case(name: str, ok: bool) -> dict:
        return {"case": name, "ok": ok}

    result = {"bit_identity": [case("current torch.float8_e4m3fn pow2=False 256x512 float32", False),
                               case("current torch.float8_e5m2 pow2=True 256x512 float32 special", False),
                               case("blockwise 128x128 192x320 float32", False),
                               case("blockwise 1x128 192x320 bfloat16", True)]}
    assert perf.gpu_check_claims(result) == [
        "scripts/gpu_check.py: 1 of 4 cases equal the CPU reference",
        "  not equal: blockwise 128x128, float32: 1 cases",
        "  not equal: current, float32: 2 cases"]
    stored = perf.gpu_check_claims(results.load(RESULTS_DIR / "gpu_check_cuda.json", "gpu_check"))
    assert all("float32" in line for line in stored[1:])  # every unequal case of the stored run is an fp32 input
    # a run without the quantizers part claims no "0 of 0"
    assert perf.gpu_check_claims({"bit_identity": []}) == [
        "scripts/gpu_check.py: no quantizer case in this file (its run left the quantizers part out)"]


def test_gpu_check_kernel_table_lists_every_timed_kernel_with_its_unit() -> None:
    result = {"kernel_times_8192x4096": {"copy bf16 (ceiling)": {"us": 33.44, "GBps": 4019.0},
                                         "bf16 mm": {"us": 396.4, "TFLOPs": 693.0}}}
    table = perf.gpu_check_kernel_table(result)
    assert table.rows == (("copy bf16 (ceiling)", "33.4", "4019 GB/s"), ("bf16 mm", "396.4", "693 TFLOP/s"))
    with pytest.raises(KeyError, match="--skip times"):
        perf.gpu_check_kernel_table({"bit_identity": []})
    stored = perf.gpu_check_kernel_table(results.load(RESULTS_DIR / "gpu_check_cuda.json", "gpu_check"))
    assert "blockwise 1x128 both" in str(stored)
