"""TransformerEngine itself against tetrt (``benchmarks/te_conformance.py``).

Where ``transformer_engine.pytorch`` imports and CUDA is available, a subset of the suite's
own cases runs and must be identical to TE byte for byte. Everywhere else those tests are
skipped, and the parts that need no TE are tested on the CPU: the case list, the
valid-region scale comparison, the known data-layout rule, the per-case error handling
(with tetrt standing in for TE), the recipe variants and the summary.
"""

from __future__ import annotations

import types

import pytest
import torch

from benchmarks import te_conformance as T

REASON = "needs transformer_engine.pytorch (importable) and a CUDA device"


def _te_and_cuda() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import TE means: not here
        return False
    return True


needs_te = pytest.mark.skipif(not _te_and_cuda(), reason=REASON)
SMOKE = T.smoke_cases()


def _label(case: T.QuantCase) -> str:
    opts = ",".join(f"{k}={v}" for k, v in case.config.options)
    return f"{case.config.format}[{opts}]-{case.dtype}-{'x'.join(map(str, case.shape))}-{case.usage}-{case.family}"


# ==================================================================== on the GPU, with TE
@needs_te
@pytest.mark.parametrize("case", SMOKE, ids=[_label(c) for c in SMOKE])
def test_quantizer_case_is_identical_to_te(case: T.QuantCase) -> None:
    result = T.run_quant_case(case, device="cuda")
    assert result["outcome"] == "identical", result


@needs_te
@pytest.mark.parametrize("recipe", T.LINEAR_RECIPES)
def test_linear_case_runs_against_te_linear(recipe: str) -> None:
    result = T.run_linear_case(1024, 2048, 4096, False, recipe)
    assert "te" not in result, result  # TE accepted the shape
    outcomes = {v["variant"]: v["outcome"] for v in result["variants"]}
    assert outcomes["tetrt default recipe"] in ("identical", "differs"), result
    for variant in result["variants"]:
        if variant["outcome"] in ("identical", "differs"):
            for name, entry in variant["details"].items():  # GEMM-order differences at most
                assert entry["equal"] or entry["max_abs_diff_rel"] < 0.1, (variant["variant"], name, entry)


@needs_te
def test_linear_te_refuses_m_not_a_multiple_of_8() -> None:
    result = T.run_linear_case(1004, 2048, 4096, False, "fp8_current")
    assert result["te"].startswith("TE refuses:"), result


@needs_te
def test_hopper_probe_reports_mxfp8_and_nvfp4() -> None:
    result = T.run_probe_subprocess()
    assert "error" not in result, result
    for fmt in ("mxfp8", "nvfp4"):
        assert "te_quantize" in result[fmt], result


# ============================================================================== CPU only
def test_case_list_covers_every_format_dtype_rank_usage_and_family() -> None:
    cases = T.build_cases()
    assert len(cases) == 990 and len(set(cases)) == len(cases)
    assert {c.config.format for c in cases} == {"fp8_delayed", "fp8_current", "fp8_block_1x128", "fp8_block_128x128"}
    assert {c.dtype for c in cases} == {"bf16", "fp16", "fp32"}
    assert {len(c.shape) for c in cases} == {2, 3, 4}
    assert {c.usage for c in cases} == {"both", "rowwise", "columnwise"}
    assert {c.family for c in cases} == set(T.FAMILIES)
    current = [c.config.opts for c in cases if c.config.format == "fp8_current"]
    assert {(o["fp8_dtype"], o["force_pow_2_scales"], o["amax_epsilon"] > 0) for o in current} == {
        (d, p, e) for d in ("e4m3", "e5m2") for p in (False, True) for e in (False, True)}
    for fmt in T.BLOCK_FORMATS:
        assert {c.config.opts["force_pow_2_scales"] for c in cases if c.config.format == fmt} == {False, True}
    for rank in (2, 3, 4):  # each rank has a shape of multiples of 128 and one that is not
        multiples = {all(d % 128 == 0 for d in T.rows_cols(c.shape)) for c in cases if len(c.shape) == rank}
        assert multiples == {True, False}, rank
    # every (config, dtype, shape) runs with both usages on normal input
    assert len({(c.config, c.dtype, c.shape) for c in cases if c.usage == "both" and c.family == "normal"}) == (
        len(T.CONFIGS) * len(T.DTYPES) * len(T.SHAPES))
    assert SMOKE and {c.config.format for c in SMOKE} == {c.config.format for c in cases}


@pytest.mark.parametrize("config", T.CONFIGS, ids=[f"{c.format}{c.options}" for c in T.CONFIGS])
@pytest.mark.parametrize("usage", list(T.USAGES))
def test_every_config_builds_a_tetrt_quantizer_with_the_usage(config: T.Config, usage: str) -> None:
    x = T.make_input("normal", (2, 3, 272), "bf16", device="cpu")
    t = T.make_tetrt_quantizer(config, usage, "cpu").quantize(x)
    row, col = T.USAGES[usage]
    per_tensor = config.format in T.PER_TENSOR_FORMATS
    row_name, col_name = ("_data", "_transpose") if per_tensor else ("_rowwise_data", "_columnwise_data")
    assert (getattr(t, row_name) is not None) == row and (getattr(t, col_name) is not None) == col
    assert set(t.inner_buffers()) <= set(T.buffer_names(config.format))


@pytest.mark.parametrize("dtype", list(T.DTYPES))
@pytest.mark.parametrize("shape", T.SHAPES)
def test_input_families(dtype: str, shape: tuple[int, ...]) -> None:
    dt = T.DTYPES[dtype]
    for fam in T.FAMILIES:
        x = T.make_input(fam, shape, dtype, device="cpu")
        assert x.shape == shape and x.dtype == dt
        again = T.make_input(fam, shape, dtype, device="cpu")
        assert torch.equal(x.view(torch.uint8), again.view(torch.uint8))  # deterministic, bit for bit
    blocks = T.make_input("zero_and_denormal_blocks", shape, dtype, device="cpu").float()
    assert (blocks == 0).any()
    subnormal = (blocks != 0) & (blocks.abs() < torch.finfo(dt).tiny)
    assert subnormal.any()
    assert torch.isinf(T.make_input("inf", shape, dtype, device="cpu")).any()
    assert torch.isnan(T.make_input("nan", shape, dtype, device="cpu")).any()


def test_valid_region_scale_comparison_ignores_padding_only() -> None:
    config = T.find_config("fp8_block_128x128", force_pow_2_scales=True)
    shape = (200, 136)
    t = T.make_tetrt_quantizer(config, "both", "cpu").quantize(T.make_input("normal", shape, "bf16", device="cpu"))
    buffer = t._columnwise_scale_inv  # (ceil(136/128), roundup(ceil(200/128), 4)) = (2, 4): valid (2, 2)
    valid = T.scale_valid_shape(config.format, "_columnwise_scale_inv", shape)
    assert tuple(buffer.shape) == (2, 4) and valid == (2, 2)
    padded = buffer.clone()
    padded[:, 2:] = float("nan")  # garbage where TE leaves its at::empty padding
    same = T.compare_buffer(padded, buffer, valid=valid)
    assert same["equal"] and same["padding_equal"] is False
    spoiled = padded.clone()
    spoiled[1, 1] = 12345.0  # garbage in the valid region
    differs = T.compare_buffer(spoiled, buffer, valid=valid)
    assert not differs["equal"] and differs["mismatched_bytes"] > 0
    assert not T.compare_buffer(padded, buffer)["equal"]  # without the valid region, the padding counts
    # 1x128: scales stored transposed, (ceil(K/128), roundup(M, 4)); valid (ceil(K/128), M)
    assert T.scale_valid_shape("fp8_block_1x128", "_rowwise_scale_inv", (2, 3, 272)) == (3, 6)
    assert T.scale_valid_shape("fp8_block_1x128", "_columnwise_scale_inv", (2, 3, 272)) == (1, 272)
    assert T.scale_valid_shape("fp8_current", "_scale_inv", shape) is None


def test_nd_data_must_have_tes_shape_to_compare_equal() -> None:
    """Both sides keep TE's N-D data shapes ((*lead, K) row-wise, (K, *lead) column-wise for
    FP8 block), so a buffer of another shape -- the 2-D (M, K) tetrt once stored -- differs."""
    config = T.find_config("fp8_block_1x128", force_pow_2_scales=True, amax_epsilon=0.0)
    shape = (2, 128, 512)
    t = T.make_tetrt_quantizer(config, "both", "cpu").quantize(T.make_input("normal", shape, "bf16", device="cpu"))
    te_like = types.SimpleNamespace(
        _rowwise_data=t._rowwise_data.view(torch.uint8).reshape(2, 128, 512),
        _columnwise_data=t._columnwise_data.view(torch.uint8).reshape(512, 2, 128),
        _rowwise_scale_inv=t._rowwise_scale_inv.clone(), _columnwise_scale_inv=t._columnwise_scale_inv.clone())
    result = T.compare_quantized(te_like, t, config.format, shape)
    assert all(b["equal"] and "shape_difference" not in b for b in result.values()), result
    te_like._rowwise_data = t._rowwise_data.view(torch.uint8).reshape(256, 512)  # the old 2-D layout
    flat = T.compare_quantized(te_like, t, config.format, shape)["_rowwise_data"]
    assert flat["shape_difference"] == "unexpected" and not flat["equal"]
    missing = T.compare_buffer(None, t._rowwise_data)
    assert not missing["equal"] and missing["present"] == {"te": False, "tetrt": True}


def test_dequantize_comparison_treats_nan_as_nan() -> None:
    a = torch.tensor([1.0, float("nan"), 3.0], dtype=torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[1] = -1  # another NaN payload
    assert T.compare_values(a, b)["equal"]
    b[2] = 2.0
    differs = T.compare_values(a, b)
    assert not differs["equal"] and differs["differing_elements"] == 1 and differs["max_abs_diff"] == 1.0


class _StandIn:
    """tetrt's quantizer called the way the suite calls TE's (``q(x)``)."""

    def __init__(self, quantizer) -> None:
        self.quantizer = quantizer

    def __call__(self, x: torch.Tensor):
        return self.quantizer.quantize(x)


def _tetrt_stands_in_for_te(monkeypatch: pytest.MonkeyPatch) -> None:
    make = T.make_tetrt_quantizer
    monkeypatch.setattr(T, "make_te_quantizer", lambda config, usage, device: _StandIn(make(config, usage, device)))


@pytest.mark.parametrize("case", SMOKE[::5], ids=[_label(c) for c in SMOKE[::5]])
def test_case_function_end_to_end_with_tetrt_standing_in_for_te(case: T.QuantCase, monkeypatch) -> None:
    _tetrt_stands_in_for_te(monkeypatch)
    result = T.run_quant_case(case, device="cpu")
    assert result["outcome"] == "identical", result
    assert set(result) == {"format", "dtype", "shape", "usage", "options", "family", "outcome", "details"}


def test_a_failing_side_is_an_outcome_not_an_exception(monkeypatch) -> None:
    case = SMOKE[0]

    def raises(*args, **kwargs):
        raise RuntimeError("create_2D_tensor_map: CUDA Error: invalid argument")

    monkeypatch.setattr(T, "make_te_quantizer", raises)
    refused = T.run_quant_case(case, device="cpu")
    assert refused["outcome"] == "te_refuses"
    assert refused["details"]["te"] == "TE refuses: RuntimeError: create_2D_tensor_map: CUDA Error: invalid argument"
    _tetrt_stands_in_for_te(monkeypatch)
    monkeypatch.setattr(T, "make_tetrt_quantizer", raises)
    assert T.run_quant_case(case, device="cpu")["outcome"] == "tetrt_refuses"
    monkeypatch.setattr(T, "make_input", raises)
    assert T.run_quant_case(case, device="cpu")["outcome"] == "error"


def test_summary_counts_outcomes_and_flags() -> None:
    rows = [
        {"format": "fp8_current", "dtype": "bf16", "shape": [4, 4], "usage": "both", "options": {}, "outcome": "identical",
         "details": {"buffers": {"_data": {"equal": True}}}},
        {"format": "fp8_block_128x128", "dtype": "fp32", "shape": [2, 128, 512], "usage": "both", "options": {},
         "outcome": "identical", "details": {"buffers": {"_columnwise_scale_inv": {"equal": True, "padding_equal": False}}}},
        {"format": "fp8_current", "dtype": "fp16", "shape": [4, 4], "usage": "rowwise", "options": {}, "outcome": "differs",
         "details": {"buffers": {"_data": {"equal": False, "nan_encoding_only": True}}}},
        {"format": "fp8_block_1x128", "dtype": "bf16", "shape": [4, 4], "usage": "both", "options": {},
         "outcome": "te_refuses", "details": {"te": "TE refuses: ..."}},
    ]
    s = T.summarize(rows)
    assert s["total"] == 4
    assert s["by_outcome"] == {"identical": 2, "differs": 1, "te_refuses": 1, "tetrt_refuses": 0, "error": 0}
    assert s["by_format"]["fp8_current"] == {"differs": 1, "identical": 1}
    assert s["differing_only_in_fp8_nan_encodings"] == 1
    assert s["scale_padding_differs_valid_region_compared"] == 1
    assert len(s["not_identical"]) == 2
    assert T.summarize([])["total"] == 0
    assert T.summary({"error": "x"})["error"] == "x"


def test_recipe_variants_follow_what_tetrt_recipes_accept() -> None:
    variants = T.tetrt_recipe_variants("fp8_current", (False, True, True))
    by_name = {v["variant"]: v for v in variants}
    assert "recipe" in by_name["tetrt default recipe"]
    te_settings = by_name["tetrt with TE's GEMM accumulation settings"]
    if "fp8_gemm_fprop" in T._gemm_parameters("fp8_current"):
        assert "recipe" in te_settings, te_settings
        if hasattr(te_settings["recipe"], "fast_accum"):
            assert tuple(te_settings["recipe"].fast_accum) == (True, False, False)
    else:
        assert te_settings["not_available"].startswith("not available"), te_settings
    inline = by_name.get("tetrt with TE's GEMM accumulation settings, inline step")
    if inline is not None and "recipe" in inline:
        assert inline["linear_kwargs"] == {"compile_as": "inline"}
    block = {v["variant"]: v for v in T.tetrt_recipe_variants("fp8_block", (True, True, True))}
    assert set(block) == {"tetrt default recipe", "tetrt with TE's GEMM accumulation settings"}
    assert all(v.get("linear_kwargs", {}) == {} for v in block.values())
    assert "not_available" in {v["variant"]: v for v in T.tetrt_recipe_variants("fp8_current", None)}[
        "tetrt with TE's GEMM accumulation settings"]


def test_linear_output_comparison() -> None:
    a = torch.tensor([[1.0, 2.0], [4.0, -8.0]], dtype=torch.bfloat16)
    assert T.compare_outputs(a, a.clone()) == {"equal": True}
    b = a.clone()
    b[0, 0] = 1.5
    c = T.compare_outputs(a, b)
    assert not c["equal"] and c["fraction_differing"] == 0.25 and c["max_abs_diff_rel"] == 0.5 / 8


def test_suite_is_registered_in_benchmarks_perf() -> None:
    from benchmarks import perf

    assert perf.FILES["te_conformance"] == "te_conformance_{device}"
    assert perf.BENCHMARK_OF_FILE["te_conformance_{device}"] == "te_conformance"
    assert "te_conformance" in perf.CUDA_SUITES
