"""Real torch.distributed process groups on loopback (gloo), for the amax reduction.

FP8 current scaling can all-reduce its amax over a process group passed PER CALL
(``quantize(x, amax_reduction_group=group)``), so every rank uses the same scale. These
helpers start real groups on 127.0.0.1 -- several processes, or one process for a
group that only needs to exist (e.g. to show that a value quantizer refuses to hold one).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import threading
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


def run_gloo(fn: Callable[..., Any], world_size: int, *args: Any, preload: tuple[str, ...] = ()) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes sharing a gloo group.

    ``fn`` must be importable by name (a module-level function). One spawned launcher
    process imports ``fn``'s module and the modules named in ``preload`` (what the ranks
    would import later, e.g. ``torch._dynamo``), then forks the ranks, which share those
    imports instead of each making them (seconds of CPU per rank). The launcher only
    imports before it forks, so no OpenMP pool or Python thread is copied (if an import
    started a thread, the ranks are spawned instead). A rank's exception
    re-raises here as torch.multiprocessing's ProcessRaisedException, its traceback in
    the message.
    """
    mp.start_processes(_launch_ranks, args=(world_size, fn, args, preload), nprocs=1, join=True,
                       start_method="spawn")


def _launch_ranks(_index: int, world_size: int, fn: Callable[..., Any], args: tuple, preload: tuple[str, ...]) -> None:
    for name in preload:
        importlib.import_module(name)
    # an import that started a Python thread would leave its locks to the ranks: spawn them then
    method = "fork" if threading.active_count() == 1 else "spawn"
    mp.start_processes(_worker, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True,
                       start_method=method)


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
