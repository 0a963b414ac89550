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


def test_a_claim_names_the_step_the_file_records() -> None:
    result = _result()
    result["suites"]["model_step"]["cases"]["c"]["variants"]["fp8_current"]["compiled_step"] = "custom_ops"
    (line,) = model_step.model_step_claims(result, "c")
    assert line.startswith("fp8_current (custom_ops): 0.500x bf16;")


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


def test_inline_case_lines_name_the_unequal_norms() -> None:
    check = {"inline_fp8_current_cases": {
        "ok": {"eager": [1.0, 2.0], "aot_eager": [1.0, 2.0], "equal": True},
        "zeros": {"eager": [4108.5, 151.5], "aot_eager": [0.0, 0.0], "equal": False},
        "broke": {"eager": [1.0, 2.0], "aot_eager": "RuntimeError: x", "equal": False}}}
    assert model_step.inline_case_lines(check) == [
        "ok: aot_eager gradients equal eager's",
        "zeros: aot_eager (weight, input) gradient norms (0, 0), eager (4108, 151.5)",
        "broke: aot_eager (weight, input) gradient norms failed (RuntimeError: x), eager (1, 2)"]


def test_the_inline_fix_is_stored_as_checked_under_torch_2_11() -> None:
    """The inline step's zero gradients came from torch 2.11's Dynamo (the device's torch);
    the stored run of the same check under torch 2.11's CPU build, after the fix, finds no
    zero gradient and every compiled case equal to eager (CI's torch 2.14 never showed it)."""
    fixed = results.load(results.RESULTS_DIR / "gpu_check_inline_torch211_cpu.json", "gpu_check")
    assert fixed["torch"].startswith("2.11")
    runs = fixed["inline_fp8_current_decoder"]
    assert runs and all(run["zero_or_missing_grads"] == [] for run in runs.values())
    assert all(row["equal"] for row in fixed["inline_fp8_current_cases"].values())
    before = results.load(results.RESULTS_DIR / "gpu_check_inline_decoder_cuda.json", "gpu_check")
    assert before["torch"].startswith("2.11") and not any(r["equal"] for r in before["inline_fp8_current_cases"].values())


def test_the_stored_cuda_inline_check_names_the_gemm_that_stopped_it() -> None:
    """The H200 run after the fast-path tables: the quantizers equal the CPU reference byte for
    byte, and the inline check stopped in the custom ops' wgrad, where ``torch._scaled_mm``
    refused 1000 tokens (the tensorwise GEMM now leaves such shapes to the reference)."""
    check = results.load(results.RESULTS_DIR / "gpu_check_inline_cuda.json", "gpu_check")
    assert all(case["ok"] for case in check["bit_identity"])
    lines = model_step.inline_error_lines(check)
    assert "divisible by 16" in lines[0] and lines[-1].strip().startswith("at tetrt_support/quant/float8_tensor.py")
    assert model_step.inline_error_lines({"inline_fp8_current": []}) == []


def test_inline_linear_lines_name_the_unequal_outputs() -> None:
    check = {"inline_fp8_block": [
        {"shape": [256, 128, 128], "bias": False, "equal": {"y": True, "dgrad": True, "wgrad": True},
         "mismatches": {"y": 0, "dgrad": 0, "wgrad": 0}},
        {"shape": [256, 128, 384], "bias": True, "equal": {"y": True, "dgrad": False, "wgrad": True, "dbias": True},
         "mismatches": {"y": 0, "dgrad": 7, "wgrad": 0, "dbias": 0}}]}
    assert model_step.inline_linear_lines(check, "fp8_block") == [
        "256 x 128 -> 128: equal bytes: y, dgrad, wgrad",
        "256 x 128 -> 384, bias: equal bytes: y, wgrad, dbias; differ: dgrad (7 elements)"]
    assert model_step.inline_linear_lines(check) == []  # no fp8_current rows in this file


def test_the_plot_draws_every_compiled_variant_per_case() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1)
    model_step.plot_model_step(axes, _result())
    labels = axes[0].get_legend_handles_labels()[1]
    assert labels == ["bf16", "torchao float8", "fp8_current"]  # the failed fp8_block is left out
    assert [ax.get_ylabel() for ax in axes] == [label for _, label in model_step.PLOTTED]
    plt.close(fig)


def test_host_cost_claims_come_from_the_stored_file() -> None:
    stored = results.load(results.RESULTS_DIR / "host_cost_cpu.json", "host_cost")
    table = model_step.host_cost_table(stored)
    assert [row[0] for row in table.rows][:2] == ["bf16", "torchao_float8_tensorwise"]
    lines = model_step.host_cost_claims(stored)
    assert [line.split(":")[0] for line in lines] == ["fp8_current", "fp8_block"]
    rows = stored["host_cost"]["variants"]
    for recipe in ("fp8_current", "fp8_block"):  # the property the claims state
        assert rows[recipe]["python_calls_per_step"] < rows[f"{recipe}+custom_ops"]["python_calls_per_step"]


def test_host_cost_claims_say_which_step_auto_took() -> None:
    def row(calls: float, step: str | None) -> dict:
        return {"python_calls_per_step": calls, "aten_ops_per_step": 1.0, "wall_us_per_step": calls,
                **({"compiled_step": step} if step else {})}

    result = {"machine": {"device": "cuda"},
              "host_cost": {"size": {"tokens": 128, "in_features": 128, "out_features": 128}, "torch": "2.11",
                            "variants": {"fp8_current": row(1561, "custom_ops"), "fp8_current+custom_ops": row(1561, "custom_ops"),
                                         "fp8_block": row(1991, None), "fp8_block+custom_ops": row(1991, None)}}}
    table = model_step.host_cost_table(result)
    assert table.title.endswith("CUDA") and table.headers[-1] == "step"
    current, block = model_step.host_cost_claims(result)
    assert "took the custom_ops here" in current and "inline step makes" not in current
    assert "does not record which step" in block and "inline step makes" not in block
