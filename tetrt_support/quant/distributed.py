"""Real torch.distributed process groups on loopback (gloo), for the amax reduction.

FP8 current scaling can all-reduce its amax over a process group passed PER CALL
(``quantize(x, amax_reduction_group=group)``), so every rank uses the same scale. These
helpers start real groups on 127.0.0.1 -- several spawned processes, or one process for a
group that only needs to exist (e.g. to show that a value quantizer refuses to hold one).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple) -> None:
    os.environ["MASTER_ADDR"] = LOOPBACK
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_gloo(fn: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes sharing a gloo group.

    ``fn`` must be importable by name (a module-level function). Exceptions in a worker
    re-raise here (torch.multiprocessing.spawn's ProcessRaisedException).
    """
    mp.spawn(_worker, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True)


@contextlib.contextmanager
def single_process_group() -> Iterator[dist.ProcessGroup]:
    """A real one-rank gloo group in this process (initialised here, destroyed on exit)."""
    if dist.is_initialized():
        raise RuntimeError("single_process_group: torch.distributed is already initialized in this process")
    store = dist.TCPStore(LOOPBACK, free_port(), world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def all_gather_tensor(t: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Every rank's copy of ``t`` (same shape on all ranks)."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out
