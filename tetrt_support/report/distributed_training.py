"""Notebook 09's demonstrations: the quantized Linear across ranks, against one process.

:func:`shards_against_whole` quantizes the shards of a batch in one process, each with its
own amax or with the whole batch's. :func:`run_across_ranks` spawns the gloo ranks once
(:func:`tetrt_support.quant.distributed.run_gloo`), runs every multi-rank demonstration in
that one spawn and returns rank 0's summary: plain numbers, flags and graph lines, nothing
that varies from run to run (no timings, ports or process ids).
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import traceback
from typing import Any

import torch

TOKENS, IN, OUT = 16, 64, 32
FSDP_STEPS = 3
#: the relative tolerance of the FSDP2 losses (see :func:`_fsdp2`)
FSDP_RTOL = 1e-5


def demo_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The global input (TOKENS x IN) and output gradient (TOKENS x OUT); row magnitudes rise
    (input) and fall (gradient), so each half's own amax differs from the global one."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(TOKENS, IN, generator=g) * torch.linspace(0.5, 4.0, TOKENS)[:, None]
    grad = torch.randn(TOKENS, OUT, generator=g) * torch.linspace(4.0, 0.5, TOKENS)[:, None]
    return x, grad


def differing_bytes(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many bytes of ``a`` and ``b`` (same shape and dtype) differ."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"differing_bytes: {a.dtype}{tuple(a.shape)} against {b.dtype}{tuple(b.shape)}")
    return int((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).sum())


def fp32_ulps(a: float, b: float) -> int:
    """How many fp32 ulps (at ``b``) apart ``a`` and ``b`` are, rounded to an integer."""
    import numpy as np

    return round(abs(a - b) / float(np.spacing(np.float32(abs(b)))))


def shards_against_whole(x: torch.Tensor, shards: int = 2) -> list[dict[str, Any]]:
    """Split ``x``'s rows into ``shards`` and FP8-quantize (current scaling) each one twice:
    with its own amax and with the whole batch's; count the data bytes that differ from the
    rows of the whole batch quantized at once. One dict per shard."""
    from tetrt_support.quant import Float8CurrentScalingQuantizer

    if x.shape[0] % shards:
        raise ValueError(f"shards_against_whole: {x.shape[0]} rows do not split into {shards} shards")
    q = Float8CurrentScalingQuantizer()
    whole = q.quantize(x)
    global_amax = x.abs().max()
    n = x.shape[0] // shards
    rows = []
    for s in range(shards):
        part = x[s * n:(s + 1) * n]
        own, shared = q.quantize(part), q.quantize(part, tensor_amax=global_amax)
        want = whole._data[s * n:(s + 1) * n]
        rows.append({"shard": s, "rows": f"{s * n}-{(s + 1) * n - 1}", "amax": part.abs().max().item(),
                     "global_amax": global_amax.item(), "scale_inv_own": own._scale_inv.item(),
                     "scale_inv_global": shared._scale_inv.item(), "bytes": want.numel(),
                     "differ_own": differing_bytes(own._data, want),
                     "differ_global": differing_bytes(shared._data, want)})
    return rows


# ------------------------------------------------------------------ in the spawned ranks


def _step(fn: Any, layer: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    layer.zero_grad()
    x = x.clone().requires_grad_(True)
    out = fn(x)
    out.backward(grad)
    return out.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _all_true(flag: bool) -> bool:
    import torch.distributed as dist

    t = torch.tensor(int(flag))
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _sum(value: int) -> int:
    import torch.distributed as dist

    t = torch.tensor(value)
    dist.all_reduce(t)
    return int(t.item())


def _max(value: float) -> float:
    import torch.distributed as dist

    t = torch.tensor(value)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _data_parallel(rank: int, world_size: int) -> dict[str, Any]:
    """Each rank's rows through a Linear with and without the group, against one process's
    Linear on the whole batch (both steps: custom ops and inline)."""
    import torch.distributed as dist

    from tetrt_support.quant import Linear

    x, grad = demo_batch()
    rows = slice(rank * TOKENS // world_size, (rank + 1) * TOKENS // world_size)
    result = {}
    for compile_as in ("custom_ops", "inline"):
        torch.manual_seed(0)
        reference = Linear(IN, OUT, compile_as=compile_as)
        grouped = Linear(IN, OUT, compile_as=compile_as, amax_reduction_group=dist.group.WORLD)
        alone = Linear(IN, OUT, compile_as=compile_as)
        grouped.load_state_dict(reference.state_dict())
        alone.load_state_dict(reference.state_dict())
        ref = _step(reference, reference, x, grad)
        out, dgrad, wgrad, dbias = _step(grouped, grouped, x[rows], grad[rows])
        a_out, a_dgrad, _, _ = _step(alone, alone, x[rows], grad[rows])
        dist.all_reduce(wgrad)
        dist.all_reduce(dbias)
        result[compile_as] = {
            "out_equal": _all_true(torch.equal(out, ref[0][rows])),
            "dgrad_equal": _all_true(torch.equal(dgrad, ref[1][rows])),
            "wgrad_rel": _max(_rel(wgrad, ref[2])), "dbias_rel": _max(_rel(dbias, ref[3])),
            "bytes_out": _sum(out.numel() * out.element_size()),
            "bytes_dgrad": _sum(dgrad.numel() * dgrad.element_size()),
            "alone_out_differ": _sum(differing_bytes(a_out, ref[0][rows])),
            "alone_dgrad_differ": _sum(differing_bytes(a_dgrad, ref[1][rows])),
            "grouped_out_differ": _sum(differing_bytes(out, ref[0][rows])),
            "grouped_dgrad_differ": _sum(differing_bytes(dgrad, ref[1][rows])),
        }
    return result


def _collective_lines(code: str) -> list[str]:
    return [line.strip().split(";")[0] for line in code.splitlines() if "_c10d_functional" in line]


def _compiled(rank: int, world_size: int) -> dict[str, Any]:
    """torch.compile(fullgraph=True) on aot_eager of the Linear with the group: frames, graph
    breaks, the collectives of the forward and backward graphs, and the eager bytes."""
    import torch.distributed as dist
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.utils import counters
    from torch._functorch.aot_autograd import make_boxed_func

    from tetrt_support.quant import Linear

    x, grad = demo_batch()
    rows = slice(rank * TOKENS // world_size, (rank + 1) * TOKENS // world_size)
    x, grad = x[rows], grad[rows]
    result = {}
    for compile_as in ("auto", "custom_ops"):
        torch.manual_seed(0)
        layer = Linear(IN, OUT, compile_as=compile_as, amax_reduction_group=dist.group.WORLD)
        eager = _step(layer, layer, x, grad)
        graphs: list[str] = []

        def keep(gm: torch.fx.GraphModule, _inputs: object) -> Any:
            graphs.append(gm.code)
            return make_boxed_func(gm)  # AOTAutograd calls a boxed compiler's result with a list

        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(layer, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
        same = all(torch.equal(a, b) for a, b in zip(_step(compiled, layer, x, grad), eager))
        result[compile_as] = {
            "graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "matches_eager": _all_true(same),
            "forward": _collective_lines(graphs[0]), "backward": _collective_lines(graphs[1]),
        }
    return result


def _tensor_parallel(rank: int, world_size: int) -> dict[str, Any]:
    """The Linear under parallelize_module, column-wise and row-wise, against the unsharded
    Linear; the weight holds its largest magnitude in every shard, so each shard's own weight
    scale is the global one (the weight's amax is per shard, as TE's)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from tetrt_support.quant import Linear
    from tetrt_support.quant.tensor_parallel import colwise_parallel, rowwise_parallel

    mesh = init_device_mesh("cpu", (world_size,))
    x, grad = demo_batch()
    torch.manual_seed(0)
    reference = Linear(IN, OUT)
    with torch.no_grad():
        top = 1.5 * reference.weight.abs().max()
        for r in range(world_size):
            reference.weight[r * OUT // world_size, 0] = top
            reference.weight[0, r * IN // world_size] = -top
    ref = _step(reference, reference, x, grad)
    cols_out = slice(rank * OUT // world_size, (rank + 1) * OUT // world_size)
    cols_in = slice(rank * IN // world_size, (rank + 1) * IN // world_size)
    result = {}
    for style, local_x, local_grad in (("colwise", x, grad[:, cols_out]), ("rowwise", x[:, cols_in], grad)):
        layer = Linear(IN, OUT)
        layer.load_state_dict(reference.state_dict())
        parallelize_module(layer, mesh, colwise_parallel() if style == "colwise" else rowwise_parallel())
        layer.zero_grad()
        xl = local_x.clone().requires_grad_(True)
        out = layer(xl)
        out.backward(local_grad)
        wgrad, dbias = layer.weight.grad.to_local(), layer.bias.grad
        dbias = dbias.to_local() if style == "colwise" else dbias.full_tensor()
        if style == "colwise":
            pairs = {"output": (out, ref[0][:, cols_out]), "weight grad": (wgrad, ref[2][cols_out]),
                     "input grad": (xl.grad, ref[1]), "bias grad": (dbias, ref[3][cols_out])}
        else:
            pairs = {"output": (out, ref[0]), "weight grad": (wgrad, ref[2][:, cols_in]),
                     "input grad": (xl.grad, ref[1][:, cols_in]), "bias grad": (dbias, ref[3])}
        result[style] = {name: {"equal": _all_true(torch.equal(a, b)), "rel": _max(_rel(a, b))}
                         for name, (a, b) in pairs.items()}
    return result


def _tokens(step: int, batch: int = 4, seq: int = 32, vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _train(model: torch.nn.Module, rank: int, world_size: int) -> tuple[list[float], torch.Tensor]:
    import torch.distributed as dist

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, first = [], None
    for step in range(FSDP_STEPS):
        ids, labels = _tokens(step)
        mine = slice(rank * len(ids) // world_size, (rank + 1) * len(ids) // world_size)
        loss = model(ids[mine], labels[mine])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = loss.detach().clone()
        first = loss.clone() if first is None else first
        if world_size > 1:
            dist.all_reduce(loss)
            loss /= world_size
        losses.append(loss.item())
    return losses, first


def _fsdp2(rank: int, world_size: int) -> dict[str, Any]:
    """A tiny decoder converted with the group and sharded by fully_shard (each block and the
    root), each rank on its half of the batch, against one process on the whole batch."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from tetrt_support.quant import convert_to_quantized_training
    from tetrt_support.zoo.decoder import Decoder, decoder_config

    config = decoder_config("tiny")
    reference = convert_to_quantized_training(Decoder(config, seed=0), "fp8_current")
    model = convert_to_quantized_training(Decoder(config, seed=0), "fp8_current",
                                          amax_reduction_group=dist.group.WORLD)
    ids, labels = _tokens(0)
    mine = slice(rank * len(ids) // world_size, (rank + 1) * len(ids) // world_size)
    with torch.no_grad():  # this rank's first loss as one process computes it, before training
        logits = reference(ids)[mine]
        ref_first = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                                      labels[mine].reshape(-1), ignore_index=-100)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    ref_losses, _ = _train(reference, 0, 1)
    losses, first = _train(model, rank, world_size)
    return {"losses": losses, "reference": ref_losses, "first_equal": _all_true(torch.equal(first, ref_first)),
            "rel": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))}


DEMONSTRATIONS = (("data_parallel", _data_parallel), ("compiled", _compiled),
                  ("tensor_parallel", _tensor_parallel), ("fsdp2", _fsdp2))


def _run_all(rank: int, world_size: int, directory: str) -> None:
    """Every demonstration in order; rank 0 writes the summary, a failing rank its traceback."""
    summary: dict[str, Any] = {"world_size": world_size}
    try:
        for name, fn in DEMONSTRATIONS:
            summary[name] = fn(rank, world_size)
    except BaseException:
        (pathlib.Path(directory) / f"failed.{rank}").write_text(traceback.format_exc())
        raise
    if rank == 0:
        (pathlib.Path(directory) / "summary.json").write_text(json.dumps(summary))


def run_across_ranks(world_size: int = 2) -> dict[str, Any]:
    """Spawn ``world_size`` gloo ranks on loopback once, run every demonstration there and
    return rank 0's summary (keys: the names of :data:`DEMONSTRATIONS`, and ``world_size``)."""
    from tetrt_support.quant.distributed import run_gloo

    if world_size < 2 or TOKENS % world_size or OUT % world_size or IN % world_size:
        raise ValueError(f"run_across_ranks: world_size must be >= 2 and divide {TOKENS}, {IN} and {OUT}, "
                         f"got {world_size}")
    with tempfile.TemporaryDirectory(prefix="tetrt-ranks-") as directory:
        try:
            run_gloo(_run_all, world_size, directory)
        except Exception as error:
            failures = sorted(pathlib.Path(directory).glob("failed.*"))
            detail = "\n".join(f"rank {f.suffix[1:]}:\n{f.read_text()}" for f in failures)
            raise RuntimeError(f"run_across_ranks: a rank failed\n{detail or error}") from None
        return json.loads((pathlib.Path(directory) / "summary.json").read_text())
