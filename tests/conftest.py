"""Shared test set-up: a private inductor cache and a CI-sized hypothesis profile."""

from __future__ import annotations

import os
import tempfile

# Before torch is imported anywhere: a warm shared inductor cache once crashed a compile
# here (DESIGN.md §4), so every test session gets its own.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="tetrt-test-inductor-"))

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "tetrt",
    max_examples=int(os.environ.get("TETRT_HYPOTHESIS_EXAMPLES", "25")),
    deadline=None,  # tracing and exporting are slow and noisy on shared 2-core machines
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # same examples on every CI run
)
settings.load_profile("tetrt")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
