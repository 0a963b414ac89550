"""Shared test set-up: a private inductor cache and the hypothesis profiles.

Profiles (``TETRT_HYPOTHESIS_PROFILE``):

- ``ci`` (default): few, derandomized examples, the same on every run;
- ``fuzz``: random examples, at least 1000 per property (``TETRT_HYPOTHESIS_EXAMPLES``
  raises it), for a long local hunt.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Before torch is imported anywhere: a warm shared inductor cache once crashed a compile
# (SIGFPE on a graph whose subclass input carried a value-opaque quantizer), so every
# test session gets its own, removed at exit.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="tetrt-test-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

_COMMON = dict(
    deadline=None,  # tracing and exporting are slow and noisy on shared 2-core machines
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "ci", max_examples=int(os.environ.get("TETRT_HYPOTHESIS_EXAMPLES", "25")), derandomize=True, **_COMMON
)
settings.register_profile(
    "fuzz", max_examples=max(1000, int(os.environ.get("TETRT_HYPOTHESIS_EXAMPLES", "1000"))), **_COMMON
)
settings.load_profile(os.environ.get("TETRT_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
