"""The quantized Linear across ranks against one process: notebook 09's demonstrations and
the per-rank logic that ``tests/quant/test_distributed_training.py`` checks (one definition).

:func:`shards_against_whole` quantizes the shards of a batch in one process, each with its
own amax or with the whole batch's. :func:`run_across_ranks` starts the gloo ranks once
(:func:`tetrt_support.quant.distributed.run_gloo`), runs the multi-rank demonstrations in
that one start and returns rank 0's summary: plain numbers, flags (each a check, true on
every rank) and graph lines, nothing that varies from run to run (no timings, ports or
process ids).
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import traceback
import warnings
from typing import Any

import torch

TOKENS, IN, OUT = 16, 64, 32
FSDP_STEPS = 3
#: the relative tolerance of the FSDP2 losses (see :func:`_fsdp2`)
FSDP_RTOL = 1e-5
#: (rtol, atol as a fraction of the reference's largest magnitude) of the results that the
#: ranks sum in another order than one process: data parallelism's weight and bias gradients
#: (all-reduced), tensor parallelism's partial sums
DP_TOLERANCE = (1e-6, 1e-5)
TP_TOLERANCE = (1e-6, 1e-6)
#: the tensor-parallel results no rank's contraction splits (bit-identical); the others sum
#: partial results across ranks (within TP_TOLERANCE)
TP_EXACT = {"colwise": ("output", "weight grad"), "rowwise": ("input grad", "weight grad")}


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


# ------------------------------------------------------------------ in the ranks


def _step(fn: Any, layer: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    layer.zero_grad()
    x = x.clone().requires_grad_(True)
    out = fn(x)
    out.backward(grad)
    return out.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _close(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """torch.testing.assert_close's verdict, as a flag."""
    try:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    except AssertionError:
        return False
    return True


def _close_to(a: torch.Tensor, b: torch.Tensor, tolerance: tuple[float, float]) -> bool:
    rtol, atol_fraction = tolerance
    return _close(a, b, rtol, atol_fraction * b.abs().max().item())


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
    Linear on the whole batch (both steps: custom ops and inline).

    Bitwise (``out_equal``, ``dgrad_equal``): the input and the gradient are quantized with
    the global amaxes, and each output row and input-gradient row contracts over dimensions
    no rank splits. The weight and bias gradients sum over the tokens, which the ranks split:
    the all-reduced sum adds the same (exact) fp8 products in another order, so they agree
    to fp32 rounding of that order (``*_close``: :data:`DP_TOLERANCE`). Without the group each
    rank scales with its own amaxes (rank 0's input amax, rank 1's gradient amax are below
    the global ones): not the one-process bytes (``alone_differs``)."""
    import torch.distributed as dist

    from tetrt_support.quant import Linear

    x, grad = demo_batch()
    rows = slice(rank * TOKENS // world_size, (rank + 1) * TOKENS // world_size)
    result = {}
    for compile_as in ("custom_ops", "inline"):
        torch.manual_seed(0)
        reference = Linear(IN, OUT, compile_as=compile_as)  # one process, the whole batch
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
            "wgrad_close": _all_true(_close_to(wgrad, ref[2], DP_TOLERANCE)),
            "dbias_close": _all_true(_close_to(dbias, ref[3], DP_TOLERANCE)),
            "alone_differs": _all_true(not (torch.equal(a_out, ref[0][rows])
                                            and torch.equal(a_dgrad, ref[1][rows]))),
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
    """torch.compile(fullgraph=True) on aot_eager of the Linear with the group, each rank on
    its rows: frames (``graphs``), graph breaks, the graphs AOTAutograd compiled (forward and
    backward), their all-reduce and wait nodes (the input's amax forward, the gradient's
    backward), the collective lines, and whether the compiled step gives the eager bytes.
    compile_as="auto" takes the inline step under compile on CPU, "custom_ops" the ops with
    the reduced amaxes as inputs."""
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
            "aot_graphs": len(graphs),
            "all_reduces": [code.count("torch.ops._c10d_functional.all_reduce.default(")
                            for code in graphs],
            "waits": ["torch.ops._c10d_functional.wait_tensor.default(" in code for code in graphs],
            "forward": _collective_lines(graphs[0]), "backward": _collective_lines(graphs[-1]),
        }
    return result


def _tensor_parallel(rank: int, world_size: int) -> dict[str, Any]:
    """The Linear under parallelize_module, column-wise and row-wise, against the unsharded
    Linear on one process. The amaxes of the input and the output gradient are reduced over
    the mesh's group, so both are quantized as one process quantizes them; the weight is
    quantized per shard (as TransformerEngine's tensor parallelism does), so the weight holds
    its largest magnitude in every shard (then each shard's scale is the global one).
    Bitwise: :data:`TP_EXACT`, whose contraction no rank splits; within :data:`TP_TOLERANCE`:
    the results summed across ranks (column-wise input gradient, row-wise output) and the
    bias gradient, whose column slice sums its tokens in another order."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from tetrt_support.quant import Linear
    from tetrt_support.quant.tensor_parallel import colwise_parallel, rowwise_parallel

    mesh = init_device_mesh("cpu", (world_size,))
    x, grad = demo_batch()
    torch.manual_seed(0)  # the same weights on every rank (distribute_tensor scatters rank 0's)
    reference = Linear(IN, OUT)
    with torch.no_grad():
        top = 1.5 * reference.weight.abs().max()
        for r in range(world_size):  # the largest magnitude in every row block and column block
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
        result[style] = {name: {"equal": _all_true(torch.equal(a, b)), "rel": _max(_rel(a, b)),
                                "close": _all_true(_close_to(a, b, TP_TOLERANCE))}
                         for name, (a, b) in pairs.items()}
    return result


def _tokens(step: int, batch: int = 4, seq: int = 32, vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _train(model: torch.nn.Module, rank: int, world_size: int) -> tuple[list[float], torch.Tensor]:
    """FSDP_STEPS AdamW steps, each rank on its sequences of the global batch: the mean
    losses, and this rank's own loss of the first step."""
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
    """A tiny decoder converted with the group and sharded with fully_shard (every block and
    the root) trains as one process trains it on the whole batch (each rank takes its part).

    Bitwise (``first_equal``): each rank's loss of the first step (the mean over its
    sequences), as one process computes it for those sequences, since every quantized Linear
    sees the global amaxes and every other op is row-wise or per sequence. (Computed before
    sharding: a no_grad forward through the fully_shard model before training changes the
    next steps' losses by about 1e-3 in this torch, unquantized too.) Within
    :data:`FSDP_RTOL` (``losses_close``; seen: one or two fp32 ulps, up to 1e-6 at a loss of
    5.6): the losses of FSDP_STEPS steps. A weight gradient sums over tokens, which the
    ranks split (FSDP2's reduce-scatter adds the halves; the loss scales 1/64 per rank then
    1/2 are powers of two, exact), so after the first update the weights differ from one
    process's by fp32 rounding of that order."""
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
    with torch.no_grad():  # the whole batch's logits, then the loss of this rank's rows
        logits = reference(ids)[mine]
        ref_first = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                                      labels[mine].reshape(-1), ignore_index=-100)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    ref_losses, _ = _train(reference, 0, 1)
    losses, first = _train(model, rank, world_size)
    return {"losses": losses, "reference": ref_losses, "first_equal": _all_true(torch.equal(first, ref_first)),
            "losses_close": _all_true(_close(losses, ref_losses, FSDP_RTOL, 0.0)),
            "rel": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))}


# ----------------------------------------------------------- FSDP2's FP8 weight all-gather


def _recording_all_gather() -> Any:
    """FSDP2's default all-gather (``torch.distributed.all_gather_single``), set on an FSDP
    module with ``set_custom_all_gather``, that also records each call's input (the bytes
    this rank sends): ``calls`` lists (dtype, bytes)."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    class Recording(DefaultAllGather):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, int]] = []

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                     async_op: bool = False) -> Any:
            self.calls.append((str(input_tensor.dtype).removeprefix("torch."),
                               input_tensor.numel() * input_tensor.element_size()))
            return super().__call__(output_tensor, input_tensor, group, async_op)

    return Recording()


def _record_all_gathers(model: torch.nn.Module) -> Any:
    from torch.distributed.fsdp import FSDPModule

    recorder = _recording_all_gather()
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_custom_all_gather(recorder)
    return recorder


#: the output features of the FP8 all-gather's unevenly sharded Linear: FSDP2 pads the last
#: shards (2 ranks: 13 + 12 rows; 4 ranks: 7 + 7 + 7 + 4)
UNEVEN_OUT = 25


def _fsdp_float8_linear(rank: int, world_size: int) -> dict[str, Any]:
    """A bf16 Linear sharded by fully_shard on ``world_size`` ranks, with the high-precision
    all-gather ("bf16") and with ``enable_fsdp_float8_all_gather`` ("fp8"; "fp8 uneven": a
    Linear of :data:`UNEVEN_OUT` output features, whose shards FSDP2 pads), against the
    unsharded Linear in one process on the whole batch.

    The weight's largest magnitude is in rank 0's rows only, so every other shard's own amax
    is below the weight's (``own_amax_below``): the gathered bytes are the unsharded
    quantization only because the shards' amaxes are all-reduced (MAX, exact in any order)
    before each rank quantizes its shard. Every rank runs the whole batch (the all-gather
    alone is under test, not data parallelism's sum order); rank 0 back-propagates
    ``world_size`` x the output gradient and the others 0 x, so FSDP2's averaging
    reduce-scatter adds exact zeros and divides by a power of two: the sharded gradients are
    one process's, bit for bit (scaling by a power of two commutes with every rounding,
    current scaling's scale included). Checks: the gathered FP8 bytes and scale_inv equal the
    unsharded weight quantizer's (seen in a forward pre-hook, after FSDP2's unshard), the
    output (every rank), the input gradient (rank 0: ``world_size`` x one process's, exact),
    the weight and bias gradients (gathered from the shards); and what was all-gathered:
    each call's dtype and bytes."""
    import math

    from torch.distributed.fsdp import fully_shard

    from tetrt_support.quant import Linear

    x, grad = demo_batch()
    x = x.bfloat16()
    scale = float(world_size) if rank == 0 else 0.0
    result: dict[str, Any] = {}
    for name, out_features in (("bf16", OUT), ("fp8", OUT), ("fp8 uneven", UNEVEN_OUT)):
        torch.manual_seed(0)
        reference = Linear(IN, out_features, dtype=torch.bfloat16)
        with torch.no_grad():
            reference.weight[0, 0] = 1.5 * reference.weight.abs().max()  # in rank 0's rows only
        g = grad[:, :out_features].bfloat16()
        ref = _step(reference, reference, x, g)
        ref_w = reference.weight_quantizer.quantize(reference.weight.detach())
        shard = math.ceil(out_features / world_size)  # torch.chunk's rows per rank
        mine = reference.weight[rank * shard:(rank + 1) * shard]
        result.setdefault("own_amax_below", []).append(
            _all_true(rank == 0 or mine.abs().max() < reference.weight.abs().max()))
        layer = Linear(IN, out_features, dtype=torch.bfloat16,
                       enable_fsdp_float8_all_gather=name != "bf16")
        layer.load_state_dict(reference.state_dict())
        fully_shard(layer)
        recorder = _record_all_gathers(layer)
        seen: dict[str, Any] = {}

        def look(module: torch.nn.Module, _args: Any, seen: dict = seen,
                 ref_w: Any = ref_w) -> None:
            w = module.weight
            seen["weight"] = type(w).__name__
            if hasattr(w, "_data"):
                seen["fp8"] = str(w._data.dtype).removeprefix("torch.")
                seen["bytes_equal"] = (w.shape == ref_w.shape and torch.equal(
                    w._data.view(torch.uint8), ref_w._data.view(torch.uint8))
                    and torch.equal(w._scale_inv, ref_w._scale_inv))

        layer.register_forward_pre_hook(look)
        xl = x.clone().requires_grad_(True)
        with warnings.catch_warnings():  # the root's output is a view (a reshape), not modified
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
            out = layer(xl)
        out.backward(g * scale)
        result[name] = {
            "out_features": out_features,
            "unsharded_weight": seen["weight"], "gathered_fp8_dtype": seen.get("fp8"),
            "gathered_bytes_equal": (_all_true(seen["bytes_equal"]) if "bytes_equal" in seen
                                     else None),  # None: no FP8 bytes were gathered
            "out_equal": _all_true(torch.equal(out, ref[0])),
            "dgrad_equal": _all_true(rank != 0 or torch.equal(xl.grad, ref[1] * world_size)),
            "wgrad_equal": _all_true(torch.equal(layer.weight.grad.full_tensor(), ref[2])),
            "dbias_equal": _all_true(torch.equal(layer.bias.grad.full_tensor(), ref[3])),
            "all_gathers": recorder.calls,
        }
    result["own_amax_below"] = all(result["own_amax_below"])
    return result


def _float8_decoder(rank: int, world_size: int, *, gather: str, split: bool,
                    precompute: bool = False) -> dict[str, Any]:
    """The tiny decoder in bf16, converted (fp8_current) and sharded by fully_shard (each block
    and the root), FSDP_STEPS AdamW steps. ``gather``: "bf16" or "fp8" (the option).
    ``split``: each rank on its sequences, the amaxes reduced over the group (data
    parallelism); else every rank the whole batch, rank 0's loss scaled by ``world_size``
    and the others' by 0 (as :func:`_fsdp_float8_linear`). ``precompute``: the weights'
    amaxes in one all-reduce after each optimizer step. Returns rank 0's losses (unscaled;
    split: the mean over the ranks) and the all-gathers of the first step."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from tetrt_support.quant import convert_to_quantized_training
    from tetrt_support.quant.fsdp_float8 import precompute_float8_dynamic_scale_for_fsdp
    from tetrt_support.zoo.decoder import Decoder, decoder_config

    options: dict[str, Any] = {"enable_fsdp_float8_all_gather": gather == "fp8"}
    if split:
        options["amax_reduction_group"] = dist.group.WORLD
    decoder = Decoder(decoder_config("tiny"), seed=0, dtype=torch.bfloat16)
    model = convert_to_quantized_training(decoder, "fp8_current", **options)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    recorder = _record_all_gathers(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, first_step_gathers = [], []
    for step in range(FSDP_STEPS):
        ids, labels = _tokens(step)
        if split:
            mine = slice(rank * len(ids) // world_size, (rank + 1) * len(ids) // world_size)
            ids, labels = ids[mine], labels[mine]
        loss = model(ids, labels)
        (loss if split else loss * (float(world_size) if rank == 0 else 0.0)).backward()
        optimizer.step()
        optimizer.zero_grad()
        if precompute:
            precompute_float8_dynamic_scale_for_fsdp(model)
        loss = loss.detach().clone()
        if split:
            dist.all_reduce(loss)
            loss /= world_size
        else:
            dist.broadcast(loss, src=0)
        losses.append(loss)
        if step == 0:
            first_step_gathers = list(recorder.calls)
    return {"losses": torch.stack(losses), "all_gathers": first_step_gathers}


def _gathered_bytes(calls: list[tuple[str, int]]) -> int:
    return sum(size for _, size in calls)


def _fsdp2_float8(rank: int, world_size: int) -> dict[str, Any]:
    """FSDP2's FP8 weight all-gather: :func:`_fsdp_float8_linear`, then the bf16 decoder
    trained FSDP_STEPS steps by one process and on ``world_size`` ranks with each all-gather
    (fp8: with and without the amax precompute). Whole batch on every rank (as the Linear):
    every variant's losses equal one process's bit for bit. Data parallelism (``split``):
    the fp8 all-gather's losses equal the bf16 all-gather's bit for bit (both differ from
    one process's by the gradient sum order, :func:`_fsdp2`). Bytes: what this rank sent
    to the all-gathers of the first step (forward and backward)."""
    from tetrt_support.quant import convert_to_quantized_training
    from tetrt_support.zoo.decoder import Decoder, decoder_config

    result: dict[str, Any] = {"linear": _fsdp_float8_linear(rank, world_size)}
    decoder = Decoder(decoder_config("tiny"), seed=0, dtype=torch.bfloat16)
    reference = convert_to_quantized_training(decoder, "fp8_current")
    optimizer = torch.optim.AdamW(reference.parameters(), lr=3e-3)
    ref_losses = []
    for step in range(FSDP_STEPS):
        ids, labels = _tokens(step)
        loss = reference(ids, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        ref_losses.append(loss.detach().clone())
    ref_losses = torch.stack(ref_losses)
    runs = {"bf16": _float8_decoder(rank, world_size, gather="bf16", split=False),
            "fp8": _float8_decoder(rank, world_size, gather="fp8", split=False),
            "fp8 precomputed": _float8_decoder(rank, world_size, gather="fp8", split=False,
                                               precompute=True)}
    split = {gather: _float8_decoder(rank, world_size, gather=gather, split=True)
             for gather in ("bf16", "fp8")}
    result["decoder"] = {
        "reference": [float(v) for v in ref_losses],
        **{name: {"losses": [float(v) for v in run["losses"]],
                  "equal": _all_true(torch.equal(run["losses"], ref_losses)),
                  "all_gathers": run["all_gathers"], "bytes": _gathered_bytes(run["all_gathers"])}
           for name, run in runs.items()},
        "split": {"bf16": [float(v) for v in split["bf16"]["losses"]],
                  "fp8": [float(v) for v in split["fp8"]["losses"]],
                  "equal": _all_true(torch.equal(split["bf16"]["losses"], split["fp8"]["losses"])),
                  "reference_rel": max(abs(float(a) - float(b)) / abs(float(b))
                                       for a, b in zip(split["fp8"]["losses"], ref_losses))},
    }
    return result


DEMONSTRATIONS = (("data_parallel", _data_parallel), ("compiled", _compiled),
                  ("tensor_parallel", _tensor_parallel), ("fsdp2", _fsdp2),
                  ("fsdp2_float8", _fsdp2_float8))


def _run_all(rank: int, world_size: int, directory: str, names: tuple[str, ...]) -> None:
    """The demonstrations ``names`` in order; rank 0 writes the summary, a failing rank its
    traceback."""
    summary: dict[str, Any] = {"world_size": world_size}
    try:
        for name, fn in DEMONSTRATIONS:
            if name in names:
                summary[name] = fn(rank, world_size)
    except BaseException:
        (pathlib.Path(directory) / f"failed.{rank}").write_text(traceback.format_exc())
        raise
    if rank == 0:
        (pathlib.Path(directory) / "summary.json").write_text(json.dumps(summary))


#: what every rank imports on its first compiled step and DTensor check: imported once before
#: the ranks fork (``run_gloo``'s ``preload``) instead of once in each
RANK_IMPORTS = ("torch._dynamo", "torch._dynamo.backends.common", "torch.distributed.tensor")


def run_across_ranks(world_size: int = 2, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Start ``world_size`` gloo ranks on loopback once, run the demonstrations ``names``
    (default: all of :data:`DEMONSTRATIONS`) there and return rank 0's summary (keys: those
    names, and ``world_size``)."""
    from tetrt_support.quant.distributed import run_gloo

    known = tuple(name for name, _ in DEMONSTRATIONS)
    names = known if names is None else tuple(names)
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"run_across_ranks: unknown demonstration(s) {unknown}; known: {known}")
    if world_size < 2 or TOKENS % world_size or OUT % world_size or IN % world_size:
        raise ValueError(f"run_across_ranks: world_size must be >= 2 and divide {TOKENS}, {IN} and {OUT}, "
                         f"got {world_size}")
    with tempfile.TemporaryDirectory(prefix="tetrt-ranks-") as directory:
        try:
            run_gloo(_run_all, world_size, directory, names, preload=RANK_IMPORTS)
        except Exception as error:
            failures = sorted(pathlib.Path(directory).glob("failed.*"))
            detail = "\n".join(f"rank {f.suffix[1:]}:\n{f.read_text()}" for f in failures)
            raise RuntimeError(f"run_across_ranks: a rank failed\n{detail or error}") from None
        return json.loads((pathlib.Path(directory) / "summary.json").read_text())
