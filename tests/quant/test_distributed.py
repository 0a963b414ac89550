"""The per-call amax reduction over a real 2-process gloo group on loopback, and how
``run_gloo`` starts the ranks (forked from one launcher that made the imports once)."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest
import torch
import torch.distributed as dist

from tetrt_support.quant import Float8CurrentScalingQuantizer, Float8Quantizer
from tetrt_support.quant.distributed import all_gather_tensor, run_gloo, single_process_group


def _rank_input(rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 32, generator=generator) * (1.0 + 3.0 * rank)  # rank 1 has the larger amax


def _check_reduced_amax(rank: int, world_size: int) -> None:
    x = _rank_input(rank)
    global_amax = max(_rank_input(r).abs().max() for r in range(world_size))
    q = Float8CurrentScalingQuantizer()
    amax, scale = q.compute_scale(x, amax_reduction_group=dist.group.WORLD)
    assert amax.item() == global_amax.item(), (rank, amax, global_amax)
    t = q.quantize(x, amax_reduction_group=dist.group.WORLD)
    scales = all_gather_tensor(t._scale_inv)
    assert all(torch.equal(s, scales[0]) for s in scales), scales  # identical scales on every rank
    assert t._scale_inv.item() == (1.0 / scale).item() == (global_amax / 448.0).item()
    local = q.quantize(x)  # without the group: this rank's own amax
    assert local._scale_inv.item() == (x.abs().max() / 448.0).item()
    # Delayed scaling reduces the amax history's max at update time.
    delayed = Float8Quantizer()
    delayed.quantize(x)
    delayed.update_scale(amax_reduction_group=dist.group.WORLD)
    gathered = all_gather_tensor(delayed.scale)
    assert all(torch.equal(g, gathered[0]) for g in gathered)
    assert delayed.scale.item() == (448.0 / global_amax).item()


def test_amax_reduction_gives_identical_scales_on_two_ranks() -> None:
    run_gloo(_check_reduced_amax, 2)


def test_single_process_group_is_a_real_process_group() -> None:
    with single_process_group() as group:
        assert isinstance(group, dist.ProcessGroup) and dist.get_world_size(group) == 1
        x = torch.randn(4, 16)
        t = Float8CurrentScalingQuantizer().quantize(x, amax_reduction_group=group)
        assert torch.equal(t.dequantize(), Float8CurrentScalingQuantizer().quantize(x).dequantize())
    assert not dist.is_initialized()


def _record_start(rank: int, world_size: int, directory: str) -> None:
    preloaded = "torch._dynamo" in sys.modules  # before anything in this rank imports it
    (pathlib.Path(directory) / str(rank)).write_text(f"{os.getppid()} {preloaded}")


def _refuse_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 refuses")


def test_ranks_are_forked_from_one_launcher_with_the_preloaded_imports(tmp_path: pathlib.Path) -> None:
    run_gloo(_record_start, 3, str(tmp_path), preload=("torch._dynamo",))
    starts = [(tmp_path / str(rank)).read_text().split() for rank in range(3)]
    parents = {parent for parent, _ in starts}
    assert len(parents) == 1 and parents != {str(os.getpid())}  # one launcher, not this process
    assert all(preloaded == "True" for _, preloaded in starts)


def test_a_rank_error_reaches_the_caller_with_its_message() -> None:
    from torch.multiprocessing import ProcessRaisedException

    with pytest.raises(ProcessRaisedException, match="rank 1 refuses"):
        run_gloo(_refuse_on_rank_one, 2)
