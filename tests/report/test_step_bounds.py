"""benchmarks.step_bounds: the parts it times are the step's own calls, and its floor counts the right bytes."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks.step_bounds import INPUT_READS, bound, step_parts
from tetrt_support.quant.linear import Linear

T, K, N = 256, 256, 128


@pytest.mark.parametrize("recipe", sorted(INPUT_READS))
def test_the_gemms_alone_compute_what_the_layer_computes(recipe: str) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, K, generator=g).bfloat16()
    weight = (torch.randn(N, K, generator=g) / 16).bfloat16()
    dy = torch.randn(T, N, generator=g).bfloat16()
    torch.manual_seed(7)  # NVFP4's stochastic rounding of the gradient draws its seeds from torch's generator
    y, dx, dw = step_parts(recipe, x, weight, dy).gemms()
    layer = Linear(K, N, bias=False, recipe=recipe, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(weight)
    x_leaf = x.clone().requires_grad_(True)
    torch.manual_seed(7)
    out = layer(x_leaf)
    out.backward(dy)
    assert torch.equal(out, y) and torch.equal(x_leaf.grad, dx) and torch.equal(layer.weight.grad, dw)


def test_the_floor_counts_each_input_read_and_each_buffer_written() -> None:
    x, weight, dy = torch.zeros(T, K).bfloat16(), torch.zeros(N, K).bfloat16(), torch.zeros(T, N).bfloat16()
    elements = T * K + N * K + T * N
    # current scaling: amax and cast each read the bf16 input; data and its transpose are FP8,
    # plus one fp32 scale_inv per tensor
    assert step_parts("fp8_current", x, weight, dy).floor_bytes == 2 * 2 * elements + 2 * elements + 3 * 4
    # blockwise: one read; the same FP8 bytes plus fp32 block scales
    blockwise = step_parts("fp8_block", x, weight, dy).floor_bytes
    assert 2 * elements + 2 * elements < blockwise < 2 * elements + 2 * elements + 4 * elements // 64


def test_the_bound_is_the_bf16_step_over_gemms_plus_the_floor() -> None:
    b = bound(bf16_step_s=1e-3, gemms_s=0.6e-3, floor_bytes=800_000_000, copy_bytes_per_s=4e12)
    assert b["quantize_floor_s"] == pytest.approx(0.2e-3)
    assert b["bound_speedup_vs_bf16"] == pytest.approx(1.25)


def test_an_unknown_recipe_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no quantize-traffic rule for recipe 'int8'"):
        step_parts("int8", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1))


def test_the_bound_table_reads_the_stored_file_and_judges_each_target_against_its_bound() -> None:
    from tetrt_support.report import results
    from tetrt_support.report.training import bound_table

    stored = results.load(results.RESULTS_DIR / "step_bounds_cuda.json", "step_bounds")
    table = bound_table(stored)
    entries = {(size, recipe): r for size, e in stored["suites"]["step_bounds"]["sizes"].items()
               for recipe, r in e["recipes"].items()}
    assert len(table.rows) == len(entries)
    for row in table.rows:
        r = entries[(row[0], row[1])]
        above = r["target_speedup_vs_bf16"] > r["bound_speedup_vs_bf16"]
        assert row[8] == ("above" if above else "within")
        assert row[9] == ("yes" if r["gemms_replay_equals_eager"] else "NO")


def test_the_bound_table_names_a_recipe_that_failed_and_gives_no_verdict_off_a_gpu() -> None:
    from tetrt_support.report.training import bound_table

    result = {"machine": {"device": "cpu"}, "suites": {"step_bounds": {"sizes": {"8x8x8": {"recipes": {
        "mxfp8": {"error": "RuntimeError: boom"},
        "fp8_current": {"step_s": 1e-3, "speedup_vs_bf16": 1.0, "gemms_s": 5e-4, "quantize_s": 5e-4,
                        "quantize_floor_s": 1e-4, "bound_speedup_vs_bf16": 1.6, "target_speedup_vs_bf16": 1.35}}}}}}}
    rows = {row[1]: row for row in bound_table(result).rows}
    assert rows["mxfp8"][2] == "failed" and len(rows["mxfp8"]) == len(rows["fp8_current"])
    assert rows["fp8_current"][8] == "" and rows["fp8_current"][9] == "not checked"


def test_the_baselines_give_the_times_behind_the_ratios_or_say_what_is_missing() -> None:
    from tetrt_support.report.training import bound_baselines

    result = {"suites": {"step_bounds": {"sizes": {
        "8x8x8": {"median_s": {"bf16.step": 1.0639e-3, "copy": 35.1e-6}, "copy_GBps": 3819.8},
        "16x16x16": {"median_s": {}, "errors": {"copy": "RuntimeError: boom"}}}}}}
    assert bound_baselines(result) == [
        "8x8x8: bf16 step 1.064 ms, copy of the T x K input 35.1 us (3.82 TB/s)",
        "16x16x16: no bf16 step or copy timed (errors: {'copy': 'RuntimeError: boom'})"]


def test_each_gemm_call_alone_is_one_of_the_three_the_step_makes() -> None:
    g = torch.Generator().manual_seed(5)
    x, weight, dy = (torch.randn(*shape, generator=g).bfloat16() for shape in ((T, K), (N, K), (T, N)))
    parts = step_parts("fp8_block", x, weight, dy)
    assert list(parts.gemm_calls) == ["fprop", "dgrad", "wgrad"]
    shapes = {name: tuple(call().shape) for name, call in parts.gemm_calls.items()}
    assert shapes == {"fprop": (T, N), "dgrad": (T, K), "wgrad": (N, K)}
    for alone, together in zip((call() for call in parts.gemm_calls.values()), parts.gemms(), strict=True):
        assert torch.equal(alone, together)


def test_the_forward_floor_counts_two_reads_and_one_fp8_write_per_quantized_input() -> None:
    from benchmarks.step_bounds import forward_floor_bytes

    e = 64 * 32
    assert forward_floor_bytes(64, 16, 32, cached_weight=True, reads=2) == 2 * 2 * e + e + 4
    assert forward_floor_bytes(64, 16, 32, cached_weight=True, reads=1) == 2 * e + e + 4
    assert forward_floor_bytes(64, 16, 32, cached_weight=False, reads=2) == 5 * e + 4 + 5 * 16 * 32 + 4


def _forward_section(**variant: float) -> dict:
    return {"m_n_k": [8, 8, 8], "median_s": {"scaled_mm_raw": 8.45e-4}, "copy_GBps": 4000.0, "variants": {
        "fp8_current_forward_cached_weight": {"target_vs_scaled_mm": 0.95, "floor_two_reads_s": 8e-5,
                                              "bound_two_reads": 0.913, "bound_one_read": 0.946, **variant}}}


def test_the_forward_bound_table_judges_the_target_against_the_two_read_bound() -> None:
    from tetrt_support.report.training import forward_bound_table

    result = {"machine": {"gpu": "NVIDIA H200"}, "suites": {"step_bounds": {
        "forward": _forward_section(vs_scaled_mm=0.9)}}}
    (row,) = forward_bound_table(result).rows
    assert list(row) == ["FP8 fwd, cached W / _scaled_mm", "0.900", "80.0", "0.913", "0.946", "0.95", "above"]
    result["machine"] = {"device": "cpu"}
    assert forward_bound_table(result).rows[0][-1] == ""
    assert "failed" in forward_bound_table({"machine": {}, "suites": {"step_bounds": {
        "forward": _forward_section()}}}).rows[0]
    with pytest.raises(KeyError, match="no forward section"):
        forward_bound_table({"machine": {}, "suites": {"step_bounds": {"sizes": {}}}})


def test_the_gemm_split_table_gives_each_call_and_says_what_was_not_timed() -> None:
    from tetrt_support.report.training import gemm_split_table

    result = {"suites": {"step_bounds": {"sizes": {"8x8x8": {"recipes": {
        "fp8_block": {"gemm_s": {"fprop": 2.5e-4, "dgrad": 2.5e-4, "wgrad": 3.0e-4}},
        "mxfp8": {"error": "RuntimeError: boom"}}}}}}}
    rows = {row[1]: row for row in gemm_split_table(result).rows}
    assert list(rows["fp8_block"]) == ["8x8x8", "fp8_block", "0.250", "0.250", "0.300", "1.20"]
    assert rows["mxfp8"][2] == "not timed"


def test_each_target_missed_in_every_way_is_judged_against_its_measured_bound() -> None:
    from tetrt_support.report import results
    from tetrt_support.report.training import missed_against_bounds

    steps = results.load(results.RESULTS_DIR / "train_step_cuda.json", "train_step")
    bounds = results.load(results.RESULTS_DIR / "step_bounds_cuda.json", "step_bounds")
    section = bounds["suites"]["step_bounds"]
    lines = {line.split(" at ")[0]: line for line in missed_against_bounds(steps, bounds)}
    assert lines and all(" aimed; " in line for line in lines.values())
    for name, line in lines.items():
        size, needed = line.split(" at ")[1].split(":")[0], float(re.search(r"([\d.]+)x aimed", line)[1])
        if name.endswith(" / bf16"):
            bound = section["sizes"][size]["recipes"][name.removesuffix(" / bf16")]["bound_speedup_vs_bf16"]
        else:
            key = "fp8_current_forward_cached_weight" if "cached" in name else "fp8_current_forward"
            bound = section["forward"]["variants"][key]["bound_two_reads"]
        assert ("ABOVE the bound" in line) == (needed > bound), line
    # a target met in some way (fp8_current at the small size, as one graph) gets no line
    assert not any(name.startswith("fp8_current / bf16") for name in lines)


def test_the_bound_verdicts_need_two_gpu_files() -> None:
    from tetrt_support.report.training import missed_against_bounds

    cpu = {"machine": {"device": "cpu"}, "suites": {}}
    assert missed_against_bounds(cpu, cpu) == [
        "no verdicts: the targets were set for an H200 and these files are not both from a GPU"]
