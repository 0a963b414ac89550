"""The llama4 benchmark suite runs from the entry point, and report.perf states its table and claims."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest

from tetrt_support.report import perf, results


@pytest.fixture(scope="module")
def smoke_file(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from benchmarks import perf as entry_point

    out = tmp_path_factory.mktemp("llama4")
    entry_point.main(["--device", "cpu", "--suites", "llama4", "--quick", "--out-dir", str(out)])
    return results.load(out / "llama4_cpu.json", "llama4")


def test_the_quick_run_measures_every_variant_in_one_engine_block(smoke_file: dict[str, Any]) -> None:
    section = smoke_file["llama4"]
    assert results.is_smoke_run(smoke_file) and smoke_file["machine"]["device"] == "cpu"
    assert section["config"]["dtype"] == "bfloat16" and section["config"]["mlp"].startswith("dense")
    variants = section["variants"]
    assert list(variants) == ["eager", "torch_compile", "torch_compile_again", "tetrt_compile_inductor_rewrite",
                              "tetrt_compile_inductor_retrace"]
    assert all("median_s" in v for v in variants.values()), {n: v.get("error") for n, v in variants.items()}
    assert variants["torch_compile"]["speed_vs_torch_compile"] == 1.0
    assert variants["torch_compile_again"]["speed_vs_torch_compile"] > 0  # the A/A control: the same compiled model
    for name in ("tetrt_compile_inductor_rewrite", "tetrt_compile_inductor_retrace"):
        v = variants[name]
        assert v["blocks_summary"] == "1 engine block, 0 fallback blocks"
        assert v["blocks"][0]["runs_on"] == "InductorBlock"
        # the engine block is one graph compiled by inductor directly: Dynamo sees no frame
        assert (v["dynamo_graphs"], v["inductor_graphs"], v["graph_breaks"]) == (0, 1, 0)
        assert v["pass_s"]["lower_complex"] == v["lower_complex_s"] > 0
        # bf16 rounding only: about as far from the fp32 run as eager bf16 is
        assert v["max_rel_error_vs_eager_fp32"] <= 2 * variants["eager"]["max_rel_error_vs_eager_fp32"] + 1e-3
        assert v["max_rel_error_vs_eager_bf16"] < 0.05


def test_the_smoke_file_gets_a_table_and_figures_without_verdicts(smoke_file: dict[str, Any]) -> None:
    table = perf.llama4_table(smoke_file)
    assert table.title == "Llama 4 text: 2 layers, hidden 64, 4 heads of 16 (2 KV), MLP 128, vocab 128; 1 x 16 tokens, bfloat16"
    assert table.column("variant")[-1] == "tetrt_compile_inductor_retrace"
    assert max(len(line) for line in str(table).splitlines()) <= 110
    claims = perf.llama4_claims(smoke_file)
    assert claims[0].startswith("SMOKE RUN")
    assert not any("target" in line for line in claims)


def _gpu_file(rewrite_speed: float, retrace_error: str | None = None) -> dict[str, Any]:
    config = {"layers": 4, "batch": 4, "seq": 2048, "dtype": "bfloat16", "mlp": "dense (moe_layers=[])", "vocab_size": 8192,
              "hidden_size": 2048, "intermediate_size_mlp": 8192, "num_attention_heads": 16, "num_key_value_heads": 8,
              "head_dim": 128}

    def measured(ms: float, speed: float, **extra: Any) -> dict[str, Any]:
        return {"median_s": ms / 1e3, "speed_vs_torch_compile": speed, "first_call_s": 1.0,
                "max_rel_error_vs_eager_bf16": 0.01, "max_rel_error_vs_eager_fp32": 0.005, **extra}

    tetrt = {"compile_s": 2.0, "blocks_summary": "1 engine block, 0 fallback blocks"}
    variants = {"eager": measured(13.66, 11.04 / 13.66), "torch_compile": measured(11.04, 1.0),
                "torch_compile_again": measured(11.10, 11.04 / 11.10),
                "tetrt_compile_inductor_rewrite": measured(11.04 / rewrite_speed, rewrite_speed, **tetrt),
                "tetrt_compile_inductor_retrace": {"error": retrace_error} if retrace_error else measured(10.77, 11.04 / 10.77, **tetrt)}
    return {"benchmark": "llama4", "machine": {"gpu": "NVIDIA H200", "torch": "2.11", "when_utc": "then"},
            "llama4": {"config": config, "export_s": 9.0, "variants": variants}}


def test_gpu_files_get_a_verdict_from_the_ratio() -> None:
    title = perf.llama4_title(_gpu_file(1.0))
    assert title == "Llama 4 text: 4 layers, hidden 2048, 16 heads of 128 (8 KV), MLP 8192, vocab 8192; 4 x 2048 tokens, bfloat16"
    assert len(title) <= 110
    claims = perf.llama4_claims(_gpu_file(0.98, retrace_error="RuntimeError: boom"))
    assert ("tetrt_compile_inductor_rewrite: torch.compile's time / its time = 0.980 (target >= 1.0): NOT met; "
            "1 engine block, 0 fallback blocks") in claims
    assert "tetrt_compile_inductor_retrace: failed: RuntimeError: boom" in claims
    assert ("A/A control: the same torch.compile'd model timed as a second variant = 0.995 (a ratio within 0.005 "
            "of 1 is within this run's spread)") in claims
    met = perf.llama4_claims(_gpu_file(1.0))
    assert any(line.startswith("tetrt_compile_inductor_rewrite") and "(target >= 1.0): met" in line for line in met)
    assert "failed" in str(perf.llama4_table(_gpu_file(1.0, retrace_error="RuntimeError: boom")))
    assert max(len(line) for line in str(perf.llama4_table(_gpu_file(1.0))).splitlines()) <= 110
    smoke = _gpu_file(1.2) | {"smoke_run": True}
    assert not any("target" in line for line in perf.llama4_claims(smoke))


def test_a_failed_suite_is_reported_not_tabulated(tmp_path: pathlib.Path) -> None:
    failed = copy.deepcopy(_gpu_file(1.0))
    failed["llama4"] = {"error": "OutOfMemoryError: CUDA out of memory"}
    with pytest.raises(KeyError, match="OutOfMemoryError"):
        perf.llama4_table(failed)
    with pytest.raises(FileNotFoundError, match="--suites llama4"):
        results.load(tmp_path / "llama4_cuda.json", "llama4")
