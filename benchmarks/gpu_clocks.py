"""The GPU's clock and power while a benchmark runs, sampled with ``nvidia-smi``.

Why: on the H200 the training steps run at the card's power cap. nvidia-smi reports the
clock event reason "SW power cap" and the SM clock falls from 1980 MHz to about
1500-1700 MHz. So a step's time depends on the power that this step and the one before
it draw. Ratios from two runs can differ by more than the noise within one run. A results
file that records the clock and the cap says which case it was.

    with ClockSampler() as clocks:
        ...                        # the timed work
    record["gpu_clocks"] = clocks.summary
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
from typing import Any

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"

# NVML's clock event reasons (nvmlClocksEventReasons), the bits nvidia-smi prints in hex.
REASONS = {
    0x1: "gpu idle",
    0x2: "applications clocks setting",
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x20: "sw thermal slowdown",
    0x40: "hw thermal slowdown",
    0x80: "hw power brake slowdown",
}


def summarize(text: str) -> dict[str, Any]:
    """Summary of ``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`` lines.

    Only samples taken under load count (reason "gpu idle" not set). Lines that do not
    parse (a driver that lacks a field prints "[N/A]") are counted, not guessed."""
    clocks: list[float] = []
    power: list[float] = []
    reasons: dict[str, int] = {}
    unparsed = idle = 0
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            if line.strip():
                unparsed += 1
            continue
        try:
            clock, watts, bits = float(fields[0]), float(fields[1]), int(fields[2], 16)
        except ValueError:
            unparsed += 1
            continue
        if bits & 0x1:
            idle += 1
            continue
        clocks.append(clock)
        power.append(watts)
        for bit, name in REASONS.items():
            if bits & bit:
                reasons[name] = reasons.get(name, 0) + 1
    out: dict[str, Any] = {"samples_under_load": len(clocks), "samples_idle": idle, "samples_unparsed": unparsed}
    if clocks:
        out["sm_clock_mhz"] = {"min": min(clocks), "median": statistics.median(clocks), "max": max(clocks)}
        out["power_w"] = {"median": statistics.median(power), "max": max(power)}
        out["clock_event_reasons_fraction"] = {name: round(n / len(clocks), 3) for name, n in sorted(reasons.items())}
    return out


class ClockSampler:
    """Samples every ``interval_ms`` in a background ``nvidia-smi`` between enter and exit.

    ``summary`` is :func:`summarize`'s dict, or ``{"error": ...}`` where nvidia-smi is
    missing or fails: a benchmark never fails for want of it."""

    def __init__(self, interval_ms: int = 100):
        self.interval_ms = interval_ms
        self.summary: dict[str, Any] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._path = ""

    def __enter__(self) -> ClockSampler:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            self.summary = {"error": "nvidia-smi not found"}
            return self
        fd, self._path = tempfile.mkstemp(prefix="tetrt-clocks-", suffix=".csv")
        with os.fdopen(fd, "w") as sink:
            self._process = subprocess.Popen(
                [exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", str(self.interval_ms)],
                stdout=sink, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
        with open(self._path) as f:
            text = f.read()
        os.unlink(self._path)
        self.summary = summarize(text)
        if not self.summary["samples_under_load"] and text.strip():
            self.summary["error"] = text.strip().splitlines()[0][:200]
