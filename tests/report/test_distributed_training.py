"""Notebook 09's helpers (tetrt_support.report.distributed_training) and its abstract's
figures. The spawned run itself is replayed by the notebook; the checks it shows are the
tests of tests/quant/test_distributed_training.py."""

from __future__ import annotations

import pytest
import torch

from tetrt_support.report import abstract
from tetrt_support.report.abstract import ABSTRACTS
from tetrt_support.report.distributed_training import (demo_batch, differing_bytes, fp32_ulps,
                                                        run_across_ranks, shards_against_whole)


def test_differing_bytes_counts_bytes_and_refuses_unlike_tensors() -> None:
    a = torch.zeros(4)
    b = a.clone()
    b[1] = 1.0  # 0x3f800000: two of its four bytes are non-zero
    assert differing_bytes(a, a) == 0 and differing_bytes(a, b) == 2
    with pytest.raises(ValueError, match="float32"):
        differing_bytes(a, torch.zeros(4, dtype=torch.float64))


def test_fp32_ulps() -> None:
    b = 5.5
    next_up = float(torch.nextafter(torch.tensor(b), torch.tensor(6.0)))
    assert fp32_ulps(b, b) == 0 and fp32_ulps(next_up, b) == 1


def test_only_the_global_amax_gives_the_whole_batch_bytes() -> None:
    x, _ = demo_batch()
    rows = shards_against_whole(x, shards=2)
    assert [r["differ_global"] for r in rows] == [0, 0]
    assert rows[0]["amax"] < rows[0]["global_amax"] and rows[0]["differ_own"] > 0
    assert rows[1]["amax"] == rows[1]["global_amax"] and rows[1]["differ_own"] == 0
    with pytest.raises(ValueError, match="do not split into 3 shards"):
        shards_against_whole(x, shards=3)


def test_run_across_ranks_refuses_a_world_size_that_does_not_split_the_batch() -> None:
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        run_across_ranks(world_size=3)
    with pytest.raises(ValueError, match=r"unknown demonstration\(s\) \['fsdp3'\]"):
        run_across_ranks(world_size=2, names=("fsdp3",))


def test_share_is_exact_at_none_and_all_and_a_whole_percent_between() -> None:
    assert [abstract.share(n, 2048) for n in (0, 773, 774, 2048)] == ["0", "≈38%", "≈38%", "all"]


def test_figures_09_fill_the_abstract() -> None:
    lines = ["all_reduce = torch.ops._c10d_functional.all_reduce.default(amax, 'max', '0')",
             "wait_tensor = torch.ops._c10d_functional.wait_tensor.default(all_reduce)"]
    step = {"alone_out_differ": 3, "alone_dgrad_differ": 4, "bytes_out": 8, "bytes_dgrad": 16,
            "grouped_out_differ": 0, "grouped_dgrad_differ": 0}
    summary = {
        "world_size": 2, "data_parallel": {"custom_ops": step},
        "compiled": {"custom_ops": {"graphs": 1, "graph_breaks": 0, "forward": lines, "backward": lines}},
        "tensor_parallel": {"colwise": {"output": {"rel": 0.0}}, "rowwise": {"output": {"rel": 3e-7}}},
        "fsdp2": {"losses": [1.0, 2.0], "rel": 5e-8},
        "fsdp2_float8": {"decoder": {"bf16": {"bytes": 200, "equal": True},
                                     "fp8": {"bytes": 110, "equal": True},
                                     "fp8 precomputed": {"bytes": 110, "equal": True}}},
    }
    figures = abstract.figures_09(summary)
    assert figures == {"ranks": 2, "bytes": 24, "differ": "≈29%", "differ_grouped": "0", "graphs": 1, "breaks": 0,
                       "reduces": 2, "steps": 2, "fsdp": "≤ 1e-7", "tp": "≤ 1e-6",
                       "fp8_bytes": 110, "bf16_bytes": 200, "fp8_equal": "bit for bit"}
    text = abstract.show("09", **figures)._repr_markdown_()
    assert ABSTRACTS["09"].figures_in(text) == {k: str(v) for k, v in figures.items()}
