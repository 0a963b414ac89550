"""The clock-and-power record of the GPU benchmarks (parsed from nvidia-smi's CSV)."""

from __future__ import annotations

import shutil

import pytest

from benchmarks.gpu_clocks import ClockSampler, summarize

# As nvidia-smi prints --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active with
# --format=csv,noheader,nounits: an idle sample, three under the power cap, one free.
SAMPLE = """345, 76.79, 0x0000000000000001
1605, 279.41, 0x0000000000000004
1545, 690.62, 0x0000000000000004
1680, 688.01, 0x0000000000000004
1980, 243.50, 0x0000000000000000
[N/A], 80.0, 0x0000000000000000
"""


def test_summary_counts_load_samples_only_and_names_the_cap() -> None:
    s = summarize(SAMPLE)
    assert (s["samples_under_load"], s["samples_idle"], s["samples_unparsed"]) == (4, 1, 1)
    assert s["sm_clock_mhz"] == {"min": 1545.0, "median": 1642.5, "max": 1980.0}
    assert s["power_w"]["max"] == 690.62
    assert s["clock_event_reasons_fraction"] == {"sw power cap": 0.75}


def test_summary_of_nothing_has_no_figures() -> None:
    assert summarize("") == {"samples_under_load": 0, "samples_idle": 0, "samples_unparsed": 0}


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this checks the machine without nvidia-smi")
def test_sampler_without_nvidia_smi_reports_it_instead_of_failing() -> None:
    with ClockSampler() as clocks:
        pass
    assert clocks.summary == {"error": "nvidia-smi not found"}
