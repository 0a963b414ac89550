"""benchmarks/host_cost.py: its counts are real and show what the inline step removes."""

from __future__ import annotations

import pytest

from benchmarks import host_cost


def test_the_inline_step_makes_fewer_python_calls_than_its_custom_ops() -> None:
    section = host_cost.run(quick=True, variants=["fp8_current", "fp8_current+custom_ops"])["host_cost"]
    rows = section["variants"]
    assert set(rows) == {"fp8_current", "fp8_current+custom_ops"}
    for row in rows.values():
        assert row["python_calls_per_step"] > 0 and row["aten_ops_per_step"] > 0 and row["wall_us_per_step"] > 0
    assert rows["fp8_current"]["compiled_step"] == "inline"  # verified on the CPU
    assert rows["fp8_current+custom_ops"]["compiled_step"] == "custom_ops"
    assert rows["fp8_current"]["python_calls_per_step"] < rows["fp8_current+custom_ops"]["python_calls_per_step"]


def test_an_unknown_variant_is_named() -> None:
    with pytest.raises(ValueError, match="unknown variant.*fp8_fast"):
        host_cost.run(quick=True, variants=["fp8_fast"])
