"""benchmarks.model_step: its plans, its data, and a CPU smoke run through benchmarks.perf end to end."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch

from benchmarks import model_step
from benchmarks.model_step import CASES, PLAN, WHOLE_STEP_GRAPH, Data, plan


def test_the_default_plan_puts_the_headline_first() -> None:
    phases = plan("cuda", False, None, None, None)
    assert [p.case for p in phases] == ["8b_2048", "1b_8192", "8b_8192"]
    first = phases[0].modes["default"]
    assert first[:4] == ("bf16", "torchao_float8_tensorwise", "fp8_current", "fp8_block")
    assert set(phases[0].modes[WHOLE_STEP_GRAPH]) <= set(first)  # the graph mode reuses the compiled models
    assert all(WHOLE_STEP_GRAPH not in p.modes for p in phases[1:])
    assert phases == list(PLAN)
    case = CASES["8b_8192"]
    assert (case.preset, case.layers, case.tokens) == ("llama3_8b_width", 4, 8192)


def test_named_options_make_a_grid() -> None:
    phases = plan("cuda", False, ["8b_2048"], ["bf16", "fp8_current_eager"], [WHOLE_STEP_GRAPH])
    assert len(phases) == 1
    assert phases[0].modes == {"default": ("bf16", "fp8_current_eager"), WHOLE_STEP_GRAPH: ("bf16", "fp8_current_eager")}
    with pytest.raises(ValueError, match="unknown variant"):
        plan("cuda", False, None, ["fp9"], None)
    with pytest.raises(ValueError, match="unknown case"):
        plan("cuda", False, ["70b"], None, None)
    with pytest.raises(ValueError, match="needs --device cuda"):
        plan("cpu", True, None, None, [WHOLE_STEP_GRAPH])


def test_sizes_alone_pick_phases_of_the_plan() -> None:
    phases = plan("cuda", False, ["8b_8192", "8b_2048"], None, None)
    assert [p.case for p in phases] == ["8b_2048", "8b_8192"]  # the plan's order
    assert phases[0] == model_step.PLAN[0]
    with pytest.raises(ValueError, match="no phase of the plan"):
        plan("cuda", False, ["tiny"], None, None)


def test_missing_peers_leave_the_default_plan_not_a_named_grid() -> None:
    phases = plan("cuda", False, None, None, None)
    kept, skipped = model_step._available(phases, explicit=False)
    te_variants = {*model_step.TE_RECIPES, *(f"{v}_eager" for v in model_step.TE_RECIPES)}
    if model_step.te_module() is None:
        assert te_variants <= set(skipped)
        assert "mxfp8" in kept[0].modes["default"]
    else:  # the emulated formats fill TE's time at 2048 tokens only
        time_fill = {f"{model_step.TE_TIME_FILL_CASE}:{v}" for v in model_step.TE_TIME_FILL}
        assert time_fill <= set(skipped)
        assert "mxfp8" in kept[-1].modes["default"] and "mxfp8" not in kept[0].modes["default"]
    torchao_missing = not torch.cuda.is_available() and not model_step.torchao_available()
    assert ("torchao_float8_tensorwise" in skipped) == torchao_missing  # on cuda its failure is a result
    assert set(skipped) <= {*te_variants, *(f"{model_step.TE_TIME_FILL_CASE}:{v}" for v in model_step.TE_TIME_FILL),
                            "torchao_float8_tensorwise"}
    assert not any(v in skipped or f"{p.case}:{v}" in skipped for p in kept for vs in p.modes.values() for v in vs)
    assert model_step._available(phases, explicit=True) == (phases, {})


def test_data_is_the_same_for_every_call_and_learnable() -> None:
    a = Data.draw(256, 2, 64, 3, "cpu", data_vocab=64)
    b = Data.draw(256, 2, 64, 3, "cpu", data_vocab=64)
    assert all(torch.equal(x, y) for (xa, ya), (xb, yb) in zip(a.batches, b.batches) for x, y in ((xa, xb), (ya, yb)))
    ids, labels = a.batches[0]
    assert ids.shape == labels.shape == (2, 64) and int(ids.max()) < 64 and int(labels.max()) < 64
    assert 0 < a.entropy_floor < math.log(64)
    assert not torch.equal(a.batches[0][0], a.batches[1][0])  # a fresh batch per step


def test_the_model_step_suite_refuses_a_full_cpu_run() -> None:
    with pytest.raises(RuntimeError, match="--quick"):
        model_step.run("cpu", False)


def test_cpu_smoke_run_through_perf_writes_every_field(tmp_path: pathlib.Path) -> None:
    from benchmarks import perf

    perf.main(["--device", "cpu", "--suites", "model_step", "--quick", "--recipes", "bf16,fp8_current,bf16_eager",
               "--steps", "4", "--rounds", "1", "--out-dir", str(tmp_path)])
    result = json.loads((tmp_path / "model_step_cpu.json").read_text())
    assert result["benchmark"] == "model_step" and result["smoke_run"] is True
    assert result["setup"]["loss_steps"] == 4
    case = result["suites"]["model_step"]["cases"]["tiny"]
    assert case["config"]["layers"] == 2 and case["tokens"] == 128
    variants = case["variants"]
    assert set(variants) == {"bf16", "fp8_current", "bf16_eager"}
    for name, v in variants.items():
        assert "error" not in v, (name, v)
        for key in ("median_ms", "best_ms", "tokens_per_s", "host_ms_per_step", "first_step_s", "loss_after_steps",
                    "bf16_loss_after_steps", "loss_rel_diff_vs_bf16", "speedup_vs_bf16"):
            assert isinstance(v[key], float), (name, key)
        assert "peak_memory_gib" in v  # None on a CPU
        assert len(v["losses"]) == 5 and v["loss_finite"] and v["loss_decreased"], (name, v["losses"])
        assert abs(v["loss_rel_diff_vs_bf16"]) < 0.05
    assert variants["bf16"]["speedup_vs_bf16"] == 1.0
    # what compile_as="auto" took is recorded: the inline step is verified on the CPU
    assert variants["fp8_current"]["compiled_step"] == "inline"
    assert "compiled_step" not in variants["bf16"] and "compiled_step" not in variants["bf16_eager"]
    assert variants["bf16_eager"]["losses"] == variants["bf16"]["losses"]  # aot_eager computes what eager does
    lines = model_step.summary(result)
    assert lines["default.tiny.fp8_current"].count(" ms") >= 1 and "vs bf16" in lines["default.tiny.fp8_current"]


def test_merge_runs_keeps_each_case_of_its_own_run() -> None:
    def part(case: str, wall: float) -> dict:
        return {"benchmark": "model_step", "machine": {"wall": wall}, "setup": {"rounds": 8},
                "suites": {"model_step": {"step": "s", "cases": {case: {"variants": {"bf16": {"median_ms": wall}}}}}}}

    merged = model_step.merge_runs([part("8b_2048", 1.0), part("8b_8192", 2.0)])
    assert merged["machine"] == {"wall": 1.0}
    assert merged["suites"]["model_step"]["cases"]["8b_8192"]["variants"]["bf16"]["median_ms"] == 2.0
    assert [r["cases"] for r in merged["runs"]] == [["8b_2048"], ["8b_8192"]]
    with pytest.raises(ValueError, match="case '8b_2048' is in run 0 and run 1"):
        model_step.merge_runs([part("8b_2048", 1.0), part("8b_2048", 2.0)])
