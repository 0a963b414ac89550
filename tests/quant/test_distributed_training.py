"""Quantized training across 2 gloo ranks (spawned processes), against one process:

- the quantized Linear with ``amax_reduction_group``: each rank's rows of a batch give the
  bytes one process gives for the whole batch, eager and compiled (the all-reduce in the graph);
- tensor parallelism: the Linear sharded column-wise and row-wise by ``parallelize_module``;
- FSDP2: a converted decoder sharded with ``fully_shard`` trains as one process does.

Starting the processes dominates (each imports torch and this package, about 20 s on two
cores), so one spawn runs every check; each test reports its own check.
"""

from __future__ import annotations

import pathlib
import traceback

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

from tetrt_support.quant import Linear, MXFP8Quantizer, convert_to_quantized_training
from tetrt_support.quant.distributed import run_gloo, single_process_group
from tetrt_support.quant.tensor_parallel import colwise_parallel, rowwise_parallel
from tetrt_support.zoo.decoder import Decoder, decoder_config

WORLD_SIZE = 2

TOKENS, IN, OUT = 16, 64, 32


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The global input and output gradient; row magnitudes rise (input) and fall (gradient),
    so every rank's own amax differs from the global one."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(TOKENS, IN, generator=g) * torch.linspace(0.5, 4.0, TOKENS)[:, None]
    grad = torch.randn(TOKENS, OUT, generator=g) * torch.linspace(4.0, 0.5, TOKENS)[:, None]
    return x, grad


def _step(fn, layer: Linear, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    layer.zero_grad()
    x = x.clone().requires_grad_(True)
    out = fn(x)
    out.backward(grad)
    return out.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone()


def check_data_parallel_linear(rank: int, world_size: int) -> None:
    """Each rank's rows through a Linear with the group, eager, on both steps (custom ops and
    inline), against one process's Linear on the whole batch."""
    x, grad = _batch()
    rows = slice(rank * TOKENS // world_size, (rank + 1) * TOKENS // world_size)
    for compile_as in ("custom_ops", "inline"):
        reference = Linear(IN, OUT, compile_as=compile_as)  # one process, the whole batch
        layer = Linear(IN, OUT, compile_as=compile_as, amax_reduction_group=dist.group.WORLD)
        layer.load_state_dict(reference.state_dict())
        ref_out, ref_dgrad, ref_wgrad, ref_dbias = _step(reference, reference, x, grad)
        out, dgrad, wgrad, dbias = _step(layer, layer, x[rows], grad[rows])
        # Bitwise: the input and the gradient are quantized with the global amaxes, and each
        # output row and input-gradient row contracts over dimensions no rank splits.
        assert torch.equal(out, ref_out[rows]), compile_as
        assert torch.equal(dgrad, ref_dgrad[rows]), compile_as
        # The weight and bias gradients sum over the tokens, which the ranks split: the
        # all-reduced sum adds the same (exact) fp8 products in another order, so they agree
        # to fp32 rounding of that order, not bitwise.
        for local, ref in ((wgrad, ref_wgrad), (dbias, ref_dbias)):
            dist.all_reduce(local)
            torch.testing.assert_close(local, ref, rtol=1e-6, atol=1e-5 * ref.abs().max().item())
        # Without the group each rank scales with its own amaxes (rank 0's input amax, rank 1's
        # gradient amax are below the global ones): not the one-process bytes.
        alone = Linear(IN, OUT, compile_as=compile_as)
        alone.load_state_dict(reference.state_dict())
        out, dgrad, _, _ = _step(alone, alone, x[rows], grad[rows])
        assert not (torch.equal(out, ref_out[rows]) and torch.equal(dgrad, ref_dgrad[rows])), compile_as


def check_compiled_linear(rank: int, world_size: int) -> None:
    """torch.compile(fullgraph=True) on aot_eager: one frame, no graph break, the all-reduce
    (a functional collective) in the forward graph (input amax) and the backward graph
    (gradient amax), and the eager bytes. compile_as="auto" takes the inline step under
    compile on CPU, "custom_ops" the ops with the reduced amaxes as inputs."""
    x, grad = _batch()
    rows = slice(rank * TOKENS // world_size, (rank + 1) * TOKENS // world_size)
    x, grad = x[rows], grad[rows]
    for compile_as in ("auto", "custom_ops"):
        layer = Linear(IN, OUT, compile_as=compile_as, amax_reduction_group=dist.group.WORLD)
        eager = _step(layer, layer, x, grad)
        graphs: list[str] = []

        def keep(gm: torch.fx.GraphModule, _inputs: object) -> torch.fx.GraphModule:
            graphs.append(gm.code)
            return gm

        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(layer, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
        assert all(torch.equal(a, b) for a, b in zip(_step(compiled, layer, x, grad), eager)), compile_as
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])  # one frame, one graph
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert len(graphs) == 2, compile_as  # forward, backward
        for code in graphs:
            assert code.count("torch.ops._c10d_functional.all_reduce.default(") == 1, (compile_as, code)
            assert "torch.ops._c10d_functional.wait_tensor.default(" in code, (compile_as, code)


def check_tensor_parallel_linear(rank: int, world_size: int) -> None:
    """The Linear under parallelize_module, column-wise and row-wise, against the unsharded
    Linear on one process. The amaxes of the input and the output gradient are reduced over
    the mesh's group, so both are quantized as one process quantizes them; the weight is
    quantized per shard (as TransformerEngine's tensor parallelism does), so the test weight
    holds its largest magnitude in every shard (then each shard's scale is the global one).
    Bitwise: every result whose contraction no rank splits (column-wise: the output and the
    weight gradient; row-wise: the input and weight gradients). To fp32 rounding: the
    results summed across ranks (column-wise input gradient, row-wise output), and the bias
    gradient, whose column slice sums its tokens in another order."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    x, grad = _batch()
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
            exact = ((out, ref[0][:, cols_out]), (wgrad, ref[2][cols_out]))
            close = ((xl.grad, ref[1]), (dbias, ref[3][cols_out]))
        else:
            exact = ((xl.grad, ref[1][:, cols_in]), (wgrad, ref[2][:, cols_in]))
            close = ((out, ref[0]), (dbias, ref[3]))
        for i, (a, b) in enumerate(exact):
            assert torch.equal(a, b), (style, i, (a - b).abs().max())
        for a, b in close:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * b.abs().max().item())


STEPS = 3


def _tokens(step: int, batch: int = 4, seq: int = 32, vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def _train(model: torch.nn.Module, rank: int, world_size: int) -> tuple[list[float], torch.Tensor]:
    """STEPS AdamW steps, each rank on its sequences of the global batch: the mean losses,
    and this rank's own loss of the first step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, first = [], None
    for step in range(STEPS):
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


def check_fsdp2_decoder(rank: int, world_size: int) -> None:
    """A tiny decoder converted with the group and sharded with fully_shard (every block and
    the root) trains as one process trains it on the whole batch (each rank takes its half).

    Bitwise: each rank's loss of the first step (the mean over its sequences), as one process
    computes it for those sequences, since every quantized Linear sees the global amaxes and
    every other op is row-wise or per sequence. (Checked inside training: a no_grad forward
    through the fully_shard model before training changes the next steps' losses by about
    1e-3 in this torch, unquantized too.) To a reduction-order
    tolerance (rtol 1e-5; seen: one fp32 ulp, 5e-7 at a loss of 5.6): the losses of STEPS
    steps. A weight gradient sums over tokens, which the ranks split (FSDP2's reduce-scatter
    adds the two halves; the loss scales 1/64 per rank then 1/2 are powers of two, exact),
    so after the first update the weights differ from one process's by fp32 rounding of that order."""
    from torch.distributed.fsdp import fully_shard

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
    assert torch.equal(first, ref_first), (first, ref_first)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=0.0)


CHECKS = ("check_data_parallel_linear", "check_compiled_linear", "check_tensor_parallel_linear", "check_fsdp2_decoder")


def _run_checks(rank: int, world_size: int, directory: str) -> None:
    """Every check in order; a file per passed check and rank. The first failure raises (and
    torch.multiprocessing.spawn ends the other ranks, which may wait in a collective)."""
    for name in CHECKS:
        try:
            globals()[name](rank, world_size)
        except BaseException:
            (pathlib.Path(directory) / f"{name}.failed.{rank}").write_text(traceback.format_exc())
            raise
        (pathlib.Path(directory) / f"{name}.ok.{rank}").touch()


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("distributed_training")
    try:
        run_gloo(_run_checks, WORLD_SIZE, str(directory))
    except Exception:  # reported by the check that failed; the ones after it did not run
        pass
    return directory


def _report(directory: pathlib.Path, name: str) -> None:
    if all((directory / f"{name}.ok.{rank}").exists() for rank in range(WORLD_SIZE)):
        return
    failures = sorted(directory.glob(f"{name}.failed.*"))
    if failures:
        pytest.fail("\n".join(f"rank {f.name.rsplit('.', 1)[1]}:\n{f.read_text()}" for f in failures), pytrace=False)
    pytest.fail(f"{name} did not run: an earlier check failed, or a rank ended without a report", pytrace=False)


def test_linear_over_a_group_gives_the_one_process_bytes(spawned: pathlib.Path) -> None:
    _report(spawned, "check_data_parallel_linear")


def test_compiled_linear_keeps_the_all_reduce_in_one_graph(spawned: pathlib.Path) -> None:
    _report(spawned, "check_compiled_linear")


def test_tensor_parallel_linear_matches_the_unsharded_linear(spawned: pathlib.Path) -> None:
    _report(spawned, "check_tensor_parallel_linear")


def test_fsdp2_decoder_trains_as_one_process(spawned: pathlib.Path) -> None:
    _report(spawned, "check_fsdp2_decoder")


def test_linear_group_needs_current_scaling_and_is_no_quantizer_state() -> None:
    with single_process_group() as group:
        with pytest.raises(ValueError, match=r"input_quantizer is a MXFP8Quantizer; the group's amax reduction"):
            Linear(64, 32, recipe="mxfp8", amax_reduction_group=group)
        layer = Linear(64, 32, amax_reduction_group=group)
        assert layer.amax_reduction_group is group
        assert all("amax_reduction_group" not in vars(q)  # value quantizers: the group is per call
                   for q in (layer.input_quantizer, layer.weight_quantizer, layer.grad_quantizer))
        with pytest.raises(ValueError, match=r"grad_quantizer is a MXFP8Quantizer"):
            layer.grad_quantizer = MXFP8Quantizer()
        x = torch.randn(8, 64)
        reference = Linear(64, 32)
        reference.load_state_dict(layer.state_dict())
        assert torch.equal(layer(x), reference(x))  # a group of one: the process's own amax
