"""report.results: the one reader of benchmarks/results/*.json names what is wrong with a file."""

from __future__ import annotations

import json
import pathlib

import pytest

from tetrt_support.report import results


@pytest.mark.parametrize("name, benchmark", [("perf_cpu.json", "perf"), ("perf_cuda.json", "perf"),
                                             ("lowering.json", "lowering"), ("fake_impls.json", "fake_impls"),
                                             ("train_step_cuda.json", "train_step"), ("loss_curves_cuda.json", "loss_study"),
                                             ("loss_curves_cpu.json", "loss_study"), ("gpu_check_cuda.json", "gpu_check"),
                                             ("step_bounds_cuda.json", "step_bounds"),
                                             ("hf_sweep.json", "hf_sweep"),
                                             ("host_cost_cpu.json", "host_cost"),
                                             ("host_cost_cuda.json", "host_cost"),
                                             ("model_step_recipes_cuda_h100.json", "model_step"),
                                             ("gpu_check_inline_cuda_h100.json", "gpu_check"),
                                             ("gpu_check_inline_cuda_h200.json", "gpu_check"),
                                             ("gpu_check_inline_cuda_h100_stopped.json", "gpu_check"),
                                             ("install_time.json", "install_time"),
                                             ("omp_wait_policy.json", "omp_wait_policy"),
                                             ("gc_settings.json", "gc_settings"),
                                             ("suite_cpu_time.json", "suite_cpu_time")])
def test_every_stored_file_is_a_complete_results_file(name: str, benchmark: str) -> None:
    result = results.load(results.RESULTS_DIR / name, benchmark)
    assert set(results.SECTIONS[benchmark]) <= set(result)
    assert not results.is_smoke_run(result)  # smoke runs are never committed


def test_a_missing_file_names_the_command_that_writes_it(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"run `python -m benchmarks.perf --suites lowering`"):
        results.load(tmp_path / "nope.json", "lowering")


def test_a_foreign_or_incomplete_file_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match=r"x.json was written by benchmark None, not 'perf'"):
        results.load(path, "perf")
    path.write_text(json.dumps({"benchmark": "lowering", "machine": {}}))
    with pytest.raises(ValueError, match=r"x.json was written by benchmark 'lowering', not 'perf'"):
        results.load(path, "perf")
    with pytest.raises(ValueError, match=r"lacks \['lowering_time', 'rope_runtime_cpu'\]"):
        results.load(path, "lowering")
    with pytest.raises(ValueError, match="unknown benchmark 'speed'"):
        results.load(path, "speed")


def test_every_file_the_entry_point_writes_is_one_the_reader_knows() -> None:
    from benchmarks import perf

    assert set(perf.BENCHMARK_OF_FILE.values()) <= set(results.SECTIONS)
    assert set(perf.FILES.values()) == set(perf.BENCHMARK_OF_FILE)
    # every suite runs by default on the device it measures: reachable from the one entry point;
    # te_conformance alone is opt-in (it needs TransformerEngine, which is built for it per run)
    assert set(perf.DEFAULT_SUITES["cpu"]) | set(perf.DEFAULT_SUITES["cuda"]) == set(perf.FILES) - {"te_conformance"}


def test_the_entry_point_refuses_unknown_and_misplaced_suites(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import perf

    with pytest.raises(SystemExit):
        perf.main(["--suites", "speed"])
    assert "unknown suites ['speed']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        perf.main(["--device", "cuda", "--suites", "lowering"])
    assert "suites ['lowering'] measure host work: run them with --device cpu" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        perf.main(["--device", "cpu", "--suites", "train_step"])
    assert "suites ['train_step'] measure GPU kernels: run them with --device cuda" in capsys.readouterr().err
