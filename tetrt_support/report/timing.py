"""The one timer of the benchmarks and of the measurement helpers.

A sample times ``calls_per_sample`` back-to-back calls and is reported as seconds per call;
the clock (``"wall"`` or ``"cpu"``), round-robin order (:func:`time_round_robin`) and
``gc_off`` are chosen here once. Why each: ``docs/architecture.md`` ("Module notes", the
timer). Quote the median for a typical call, ``best_s`` for micro-benchmarks.
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Clock", "Order", "Stopwatch", "Timing", "cpu_seconds", "quiet_gc", "time_calls", "time_round_robin"]

Clock = Literal["wall", "cpu"]
Order = Literal["shuffled", "fixed"]

_CUDA_CALLS_PER_SAMPLE = 10  # enough back-to-back calls to hide the host between kernels


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its finished child processes."""
    try:
        import resource
    except ImportError:  # not on Unix: this process only
        return time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect now, then keep the cyclic garbage collector off until the block ends."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Stopwatch:
    """Wall-clock and CPU seconds of one ``with`` block (both clocks, read once each).

    >>> with Stopwatch() as watch:
    ...     pass
    >>> watch.wall_s >= 0 and watch.cpu_s >= 0
    True
    """

    wall_s: float
    cpu_s: float

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = cpu_seconds() - self._cpu


@dataclass(frozen=True)
class Timing:
    """Samples of one function, each in seconds per call."""

    samples_s: tuple[float, ...]
    calls_per_sample: int
    clock: str  # "wall", "cpu" or "cuda events"

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def best_s(self) -> float:
        """The fastest sample: the least disturbed by other work on a shared machine."""
        return min(self.samples_s)

    def protocol(self) -> dict[str, Any]:
        """How the figures were taken, for a results file."""
        return {"samples": len(self.samples_s), "calls_per_sample": self.calls_per_sample, "clock": self.clock}


def _check(device: str, clock: Clock) -> None:
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    if device.startswith("cuda") and clock == "cpu":
        raise ValueError("clock='cpu' on a CUDA device would time the host only; use clock='wall' (CUDA events)")


def _calls_per_sample(device: str, calls_per_sample: int | None) -> int:
    n = calls_per_sample if calls_per_sample is not None else (_CUDA_CALLS_PER_SAMPLE if device.startswith("cuda") else 1)
    if n < 1:
        raise ValueError(f"calls_per_sample must be >= 1, got {n}")
    return n


def _clock_name(device: str, clock: Clock) -> str:
    return "cuda events" if device.startswith("cuda") else clock


def _sample(fn: Callable[[], Any], device: str, clock: Clock, calls: int, gc_off: bool) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn``."""
    with quiet_gc() if gc_off else contextlib.nullcontext():
        if device.startswith("cuda"):
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            fn()  # untimed: the device is busy when timing starts (see the module docstring)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / calls
        read = time.perf_counter if clock == "wall" else cpu_seconds
        t0 = read()
        for _ in range(calls):
            fn()
        return (read() - t0) / calls


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_calls(
    fn: Callable[[], Any],
    *,
    calls: int,
    device: str = "cpu",
    calls_per_sample: int | None = None,
    warmup: int = 3,
    clock: Clock = "wall",
    gc_off: bool = False,
) -> Timing:
    """Time about ``calls`` calls of ``fn`` after ``warmup`` untimed ones.

    The calls are split into samples of ``calls_per_sample`` (10 on a GPU, 1 on the CPU
    by default), with at least 3 samples so that a median means something.
    """
    _check(device, clock)
    per_sample = _calls_per_sample(device, calls_per_sample)
    for _ in range(warmup):
        fn()
    _synchronize(device)
    samples = tuple(_sample(fn, device, clock, per_sample, gc_off) for _ in range(max(3, calls // per_sample)))
    return Timing(samples, per_sample, _clock_name(device, clock))


def time_round_robin(
    fns: Mapping[str, Callable[[], Any]],
    *,
    rounds: int,
    device: str = "cpu",
    calls_per_sample: int | None = None,
    warmup: int = 1,
    clock: Clock = "wall",
    gc_off: bool = False,
    errors: dict[str, BaseException] | None = None,
    progress: Callable[[], None] | None = None,
    order: Order = "shuffled",
    seed: int = 0,
) -> dict[str, Timing]:
    """Time each of ``fns`` once per round, in turn, for ``rounds`` rounds.

    ``order="shuffled"`` (the default) takes each round in a new order drawn with
    ``seed``, so that no function always follows the same one; ``"fixed"`` keeps the
    order of ``fns`` in every round.

    A function that raises propagates its error, unless ``errors`` is a dict: then the
    exception is stored there under the function's name, the function is left out of
    the later rounds and of the result, and the others go on (one broken variant must not
    hide the figures of the rest). ``progress`` is called after every sample.
    """
    _check(device, clock)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if order not in ("shuffled", "fixed"):
        raise ValueError(f"order must be 'shuffled' or 'fixed', got {order!r}")
    shuffle = random.Random(seed).shuffle
    per_sample = _calls_per_sample(device, calls_per_sample)
    live = dict(fns)
    samples: dict[str, list[float]] = {name: [] for name in live}

    def attempt(name: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as e:
            if errors is None:
                raise
            errors[name] = e
            del live[name]
            return None

    for name, fn in list(live.items()):
        for _ in range(warmup):
            if name in live:
                attempt(name, fn)
    _synchronize(device)
    for _ in range(rounds):
        turn = list(live.items())
        if order == "shuffled":
            shuffle(turn)
        for name, fn in turn:
            value = attempt(name, lambda fn=fn: _sample(fn, device, clock, per_sample, gc_off))
            if name in live:
                samples[name].append(value)
            if progress is not None:
                progress()
    return {name: Timing(tuple(samples[name]), per_sample, _clock_name(device, clock)) for name in live}
