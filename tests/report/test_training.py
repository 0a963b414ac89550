"""report.training: step tables, target verdicts and the loss study, from results files."""

from __future__ import annotations

import copy
import math
import pathlib

import pytest

from tetrt_support.report import results, training

SMALL, LARGE = "8192x4096x4096", "16384x8192x8192"


def _variant(ms: float, base_ms: float) -> dict:
    return {"median_s": ms / 1e3, "best_s": ms / 1e3, "speedup_vs_bf16": base_ms / ms, "TFLOPs": 1.0}


def _fake_train_step(gpu: bool = True) -> dict:
    def size(times: dict[str, float]) -> dict:
        return {"variants": {name: _variant(ms, times["bf16"]) for name, ms in times.items()}}

    default = {SMALL: size({"bf16": 1.0, training.PEER: 0.8, "fp8_current": 0.5, "fp8_block": 0.9, "mxfp8": 1.2, "nvfp4": 2.0}),
               LARGE: size({"bf16": 8.0, training.PEER: 6.0, "fp8_current": 4.0, "fp8_block": 6.0, "mxfp8": 10.0, "nvfp4": 9.0})}
    graphs = copy.deepcopy(default)
    graphs[SMALL]["variants"]["fp8_current"] = _variant(0.9, 1.0)  # 1.11x: misses 1.35x
    one_graph = copy.deepcopy(default)
    one_graph[SMALL]["variants"]["fp8_block"] = _variant(0.8, 1.0)  # 1.25x: meets 1.2x only here
    machine = {"torch": "2.x", "when_utc": "then", "processor": "x86_64", "cpu_count": 2, "torch_threads": 2}
    if gpu:
        machine["gpu"] = "GPU X"
    return {"benchmark": "train_step", "machine": machine, "suites": {
        "train_step": {"sizes": default}, "train_step_reduce-overhead": {"sizes": graphs},
        "train_step_cuda-graph-step": {"sizes": one_graph},
        "forward_vs_scaled_mm": {"m_n_k": [8, 8, 8], "variants": {
            "scaled_mm_raw": {"median_s": 1e-3, "TFLOPs": 1.0, "throughput_vs_scaled_mm": 1.0},
            "fp8_current_forward": {"median_s": 1.05e-3, "TFLOPs": 1.0, "throughput_vs_scaled_mm": 1 / 1.05},
            "fp8_current_forward_cached_weight": {"median_s": 1.1e-3, "TFLOPs": 1.0, "throughput_vs_scaled_mm": 1 / 1.1}}}}}


def test_every_target_verdict_follows_from_its_ratio() -> None:
    table = training.step_target_table(_fake_train_step())
    assert table.headers[3:] == ("default", "reduce-overhead", "one CUDA graph")
    assert len(table.rows) == sum(map(len, training.STEP_TARGETS.values())) + 2 + len(training.FORWARD_TARGETS)
    for name, size, needed, *cells in table.rows:
        target = float(needed.removeprefix(">= ").removesuffix("x"))
        for cell in cells:
            if cell != "-":  # (the forward is measured once)
                value, verdict = cell.split()
                assert verdict == ("met" if float(value.removesuffix("x")) >= target else "MISSED"), (name, size)


def test_missed_targets_are_stated_with_their_numbers() -> None:
    lines = training.missed_targets(_fake_train_step())
    assert (f"MISSED fp8_current / bf16 at {SMALL}, target >= 1.35x: default 2.000x (met); "
            "reduce-overhead 1.111x (MISSED); one CUDA graph 2.000x (met)") in lines
    assert (f"MISSED fp8_block / bf16 at {SMALL}, target >= 1.2x: default 1.111x (MISSED); "
            "reduce-overhead 1.111x (MISSED); one CUDA graph 1.250x (met)") in lines
    assert (f"MISSED nvfp4 / bf16 at {SMALL}, target >= 0.75x: default 0.500x (MISSED); "
            "reduce-overhead 0.500x (MISSED); one CUDA graph 0.500x (MISSED)") in lines
    assert "MISSED FP8 fwd, cached W / _scaled_mm at 8x8x8, target >= 0.95x: default 0.909x (MISSED)" in lines
    assert not any("FP8 forward / raw" in line for line in lines)  # 0.952 >= 0.90
    assert (f"MISSED fp8_current / torchao float8 at {SMALL}, target >= 1.0x: default 1.600x (met); "
            "reduce-overhead 0.889x (MISSED); one CUDA graph 1.600x (met)") in lines  # 1.111x against torchao's 1.25x
    assert not any(f"torchao float8 at {LARGE}" in line for line in lines)
    assert not any(f"fp8_current / bf16 at {LARGE}" in line for line in lines)  # met every way


def test_a_file_without_the_graph_suites_has_default_columns_only() -> None:
    result = _fake_train_step()
    del result["suites"]["train_step_reduce-overhead"], result["suites"]["train_step_cuda-graph-step"]
    table = training.step_target_table(result)
    assert table.headers == ("ratio", "size", "needed", "default")


def test_cpu_files_get_figures_without_verdicts() -> None:
    result = _fake_train_step(gpu=False)
    assert training.missed_targets(result) == [
        "no verdicts: the targets were set for an H200 and this file is not from a GPU"]
    table = training.step_target_table(result)
    assert all(cell == "-" or cell.endswith("x") for row in table.rows for cell in row[3:])
    assert "no verdicts" in table.title


def test_step_table_marks_failed_variants_and_fits_the_page() -> None:
    result = _fake_train_step()
    result["suites"]["train_step"]["sizes"][LARGE]["variants"]["nvfp4"] = {"error": "RuntimeError: boom"}
    table = training.step_table(result)
    nvfp4 = next(row for row in table.rows if row[0] == "nvfp4")
    assert nvfp4 == ("nvfp4", "2.000", "0.500x", "", "failed", "", "")
    assert max(len(line) for line in str(table).splitlines()) <= 110
    with pytest.raises(KeyError, match="no suite 'train_step_max-autotune'"):
        training.step_table(result, "train_step_max-autotune")


def test_the_stored_h200_file_gives_a_verdict_for_every_target() -> None:
    result = results.load(results.RESULTS_DIR / "train_step_cuda.json", "train_step")
    table = training.step_target_table(result)
    assert table.headers[3:] == ("default", "reduce-overhead", "one CUDA graph")
    assert all(row[3].split()[1] in ("met", "MISSED") for row in table.rows)
    assert len(table.blocks()) == 1 and max(len(line) for line in str(table).splitlines()) <= 110
    missed = [row for row in table.rows if any(cell.endswith("MISSED") for cell in row[3:])]
    assert len(training.missed_targets(result)) == len(missed)


def test_running_mean() -> None:
    assert training.running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert training.running_mean([2.0], 20) == [2.0]


def _fake_loss_study() -> dict:
    losses = [3.0 - 0.01 * i for i in range(30)]
    return {"benchmark": "loss_study", "machine": {"cpu_count": 2},
            "setup": {"layers": 1, "width": 8, "heads": 1, "mlp": 16, "seq": 4, "batch": 2, "steps": 30, "lr": 1e-3,
                      "optimizer": "AdamW", "data": "d", "entropy_rate_nats": 1.5},
            "recipes": {"bf16": {"losses": losses, "wall_s": 1.0},
                        "fp8_current": {"losses": [v + 0.01 for v in losses], "wall_s": 2.0},
                        "nvfp4": {"losses": losses[:12] + [math.nan], "wall_s": 0.5},
                        "mxfp8": {"error": "RuntimeError: boom"}}}


def test_the_loss_file_is_described_exactly() -> None:
    lines = training.loss_file_contents(_fake_loss_study())
    assert lines[1:] == ["bf16: 30 steps", "fp8_current: 30 steps", "nvfp4: 13 steps (stopped early: of 30)",
                         "mxfp8: failed: RuntimeError: boom", "recipes not in the file: fp8_block"]


def test_final_loss_table_measures_against_bf16_and_the_entropy_rate() -> None:
    table = training.final_loss_table(_fake_loss_study(), last=10)
    rows = {row[0]: row for row in table.rows}
    bf16_final = sum(3.0 - 0.01 * i for i in range(20, 30)) / 10
    assert rows["bf16"][2:5] == (f"{bf16_final:.4f}", "+0.0000", f"{bf16_final - 1.5:.4f}")
    assert rows["fp8_current"][3] == "+0.0100"
    assert rows["mxfp8"][1] == "failed"
    assert "CPU (2 cores)" in table.title


def test_plots_draw_one_artist_per_variant_and_recipe() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3)
    try:
        training.plot_step_speedups(axes[0], _fake_train_step())
        assert len(axes[0].patches) == 5 * 2  # five variants besides bf16, two sizes
        training.plot_loss_study(axes[1:], _fake_loss_study())
        assert len(axes[1].lines) == 3 + 1  # three recipes with losses, the entropy rate
        assert len(axes[2].lines) == 2 + 1  # two recipes besides bf16, the zero line
    finally:
        plt.close(fig)


def test_the_loss_studies_share_one_figure_that_fits_the_page() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tetrt_support import notebook

    fig = training.plot_loss_studies([_fake_loss_study(), _fake_loss_study()], window=5)
    try:
        assert fig.get_size_inches()[0] <= notebook.FIGURE_MAX_WIDTH_IN
        axes = fig.axes
        assert len(axes) == 4 and all(ax.get_ylabel().endswith(")") for ax in axes)  # units
        assert [len(ax.lines) for ax in axes] == [4, 3, 4, 3]
        assert fig.legends and [t.get_text() for t in fig.legends[0].get_texts()] == ["bf16", "fp8_current", "nvfp4"]
        assert fig.get_suptitle().startswith("Training loss per recipe")
    finally:
        plt.close(fig)


def test_the_loss_study_runs_from_the_entry_point(tmp_path: pathlib.Path) -> None:
    from benchmarks import perf

    perf.main(["--device", "cpu", "--suites", "loss_study", "--quick", "--recipes", "bf16,fp8_current",
               "--out-dir", str(tmp_path)])
    result = results.load(tmp_path / "loss_curves_cpu.json", "loss_study")
    assert results.is_smoke_run(result) and result["machine"]["device"] == "cpu"
    steps = result["setup"]["steps"]
    assert [len(result["recipes"][r]["losses"]) for r in ("bf16", "fp8_current")] == [steps, steps]
    # the same initial weights and batches: the first losses differ only by FP8's rounding
    first = [result["recipes"][r]["losses"][0] for r in ("bf16", "fp8_current")]
    assert abs(first[0] - first[1]) < 0.05 * first[0]


def test_the_train_step_script_is_the_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from benchmarks import perf

    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    with pytest.raises(SystemExit):
        perf.suite_main("train_step", ["--sizes", SMALL])
    assert "--device cuda: no CUDA device here" in capsys.readouterr().err


def test_loss_claim_names_the_recipe_furthest_from_bf16() -> None:
    study = _fake_loss_study()
    assert training.loss_claim(study, last=10) == (
        "CPU (2 cores): every other recipe ends within 0.0100 nats of bf16 (mean of the last 10); "
        "furthest: fp8_current (+0.0100); diverged: nvfp4")
    del study["recipes"]["nvfp4"]  # its curve ends in NaN
    assert training.loss_claim(study, last=10) == (
        "CPU (2 cores): every recipe ends within 0.0100 nats of bf16 (mean of the last 10); "
        "furthest: fp8_current (+0.0100)")
    del study["recipes"]["bf16"]
    assert "no bf16 run" in training.loss_claim(study)


def test_profile_table_lists_the_top_kernels_of_a_stored_profile() -> None:
    result = results.load(results.RESULTS_DIR / "train_step_cuda.json", "train_step")
    key = next(iter(result["suites"]["profiles"]))
    table = training.profile_table(result, key, rows=3)
    assert len(table.rows) == 3 and table.title.startswith(f"{key}: GPU kernels")
    times = [float(row[1]) for row in table.rows]
    assert times == sorted(times, reverse=True)
    with pytest.raises(KeyError, match="no profile 'bf16@1x1x1'"):
        training.profile_table(result, "bf16@1x1x1")


def test_host_breakdown_table_reads_the_stored_run_and_names_a_missing_one() -> None:
    result = results.load(results.RESULTS_DIR / "train_step_cuda.json", "train_step")
    table = training.host_breakdown_table(result)
    names = [row[0] for row in table.rows]
    assert "compiled step (fp8_current)" in names and "compiled step (bf16 nn.Linear)" in names
    assert all(float(row[1]) > 0 for row in table.rows)
    with pytest.raises(KeyError, match="no host breakdown"):
        training.host_breakdown_table(_fake_train_step())


def test_clock_table_reports_the_power_cap_and_says_where_nothing_was_recorded() -> None:
    result = _fake_train_step()
    result["suites"]["train_step"]["sizes"][SMALL]["gpu_clocks"] = {
        "samples_under_load": 4, "samples_idle": 0, "samples_unparsed": 0,
        "sm_clock_mhz": {"min": 1545.0, "median": 1642.5, "max": 1980.0}, "power_w": {"median": 500.0, "max": 690.6},
        "clock_event_reasons_fraction": {"sw power cap": 0.75}}
    rows = training.clock_table(result).rows
    assert list(rows[0]) == ["default", SMALL, "1642", "1545-1980", "691", "75%"]
    assert len(rows) == 6 and all(r[2] == "not recorded" for r in rows[1:])
