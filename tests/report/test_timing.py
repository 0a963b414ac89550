"""report.timing: what the one timer measures, on the CPU (no speed targets here)."""

from __future__ import annotations

import gc

import pytest

from tetrt_support.report import timing


def test_time_calls_takes_samples_of_calls_after_a_warmup() -> None:
    calls = []
    result = timing.time_calls(lambda: calls.append(1), calls=12, calls_per_sample=4, warmup=2)
    assert len(calls) == 2 + 12 and len(result.samples_s) == 3 and result.calls_per_sample == 4
    assert result.best_s <= result.median_s
    assert result.protocol() == {"samples": 3, "calls_per_sample": 4, "clock": "wall"}
    assert len(timing.time_calls(lambda: None, calls=1, warmup=0).samples_s) == 3  # at least 3 samples


def test_round_robin_interleaves_and_records_failures_when_asked() -> None:
    order: list[str] = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    out = timing.time_round_robin(fns, rounds=3, warmup=0, order="fixed")
    assert order == ["a", "b"] * 3 and {k: len(v.samples_s) for k, v in out.items()} == {"a": 3, "b": 3}

    def broken() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        timing.time_round_robin({"broken": broken}, rounds=1)
    errors: dict[str, BaseException] = {}
    out = timing.time_round_robin({"ok": lambda: None, "broken": broken}, rounds=2, errors=errors)
    assert list(out) == ["ok"] and str(errors["broken"]) == "boom"


def test_shuffled_rounds_take_each_function_once_in_a_new_order_drawn_from_the_seed() -> None:
    def run(seed: int) -> list[str]:
        order: list[str] = []
        fns = {name: (lambda name=name: order.append(name)) for name in "abcd"}
        timing.time_round_robin(fns, rounds=12, warmup=0, seed=seed)
        return order

    order = run(0)
    rounds = [order[i : i + 4] for i in range(0, len(order), 4)]
    assert all(sorted(r) == list("abcd") for r in rounds)  # every function once per round
    followers = {r[r.index("a") + 1] for r in rounds if r[-1] != "a"}
    assert len(followers) > 1  # "a" is not always followed by the same function
    assert run(0) == order and run(1) != order  # the seed fixes the orders
    with pytest.raises(ValueError, match="order must be 'shuffled' or 'fixed', got 'random'"):
        timing.time_round_robin(fns={}, rounds=1, order="random")  # type: ignore[arg-type]


def test_cpu_clock_counts_work_not_sleep() -> None:
    import time

    slept = timing.time_calls(lambda: time.sleep(0.02), calls=3, warmup=0, clock="cpu")
    assert slept.median_s < 0.01 and slept.clock == "cpu"
    with timing.Stopwatch() as watch:
        time.sleep(0.02)
    assert watch.wall_s >= 0.02 and watch.cpu_s < 0.01


def test_gc_off_holds_the_collector_and_restores_it() -> None:
    seen = []
    timing.time_calls(lambda: seen.append(gc.isenabled()), calls=3, warmup=0, gc_off=True)
    assert seen == [False] * 3 and gc.isenabled()


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="clock must be 'wall' or 'cpu', got 'gpu'"):
        timing.time_calls(lambda: None, calls=1, clock="gpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clock='cpu' on a CUDA device"):
        timing.time_calls(lambda: None, calls=1, device="cuda", clock="cpu")
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        timing.time_round_robin({}, rounds=0)
