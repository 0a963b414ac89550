"""Quantized training across gloo ranks (separate processes), against one process:

- the quantized Linear with ``amax_reduction_group``: each rank's rows of a batch give the
  bytes one process gives for the whole batch, eager and compiled (the all-reduce in the graph);
- tensor parallelism: the Linear sharded column-wise and row-wise by ``parallelize_module``;
- FSDP2: a converted decoder sharded with ``fully_shard`` trains as one process does;
- FSDP2's FP8 weight all-gather (``enable_fsdp_float8_all_gather``), on 2 and 4 ranks.

The per-rank logic is :mod:`tetrt_support.report.distributed_training`'s (notebook 09 shows
the same runs); each rank reduces every check to a flag that is true on all ranks, and the
tests read rank 0's summary. Starting the ranks costs more than most checks (a launcher
imports torch and this package, then forks them), so one start per world size runs every check.
"""

from __future__ import annotations

import pytest
import torch

from tetrt_support.quant import Linear, MXFP8Quantizer, convert_to_quantized_training
from tetrt_support.quant.distributed import single_process_group
from tetrt_support.quant.fsdp_float8 import Float8AllGatherWeight, Float8GatheredWeight
from tetrt_support.report.distributed_training import (IN, OUT, TP_EXACT, UNEVEN_OUT,
                                                        run_across_ranks)
from tetrt_support.zoo.decoder import Decoder, decoder_config


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    return run_across_ranks(2)  # every demonstration


@pytest.fixture(scope="module", params=(2, 4), ids=("2_ranks", "4_ranks"))
def float8(request: pytest.FixtureRequest) -> tuple[int, dict]:
    """(world size, the FP8 all-gather summary): 2 ranks from the run of every check, 4 ranks
    from a run of the FP8 all-gather alone."""
    if request.param == 2:
        return 2, request.getfixturevalue("two_ranks")["fsdp2_float8"]
    return 4, run_across_ranks(4, names=("fsdp2_float8",))["fsdp2_float8"]


def test_linear_over_a_group_gives_the_one_process_bytes(two_ranks: dict) -> None:
    for compile_as, r in two_ranks["data_parallel"].items():
        assert r["out_equal"] and r["dgrad_equal"], (compile_as, r)  # bitwise
        assert r["wgrad_close"] and r["dbias_close"], (compile_as, r)  # the ranks' sum order
        assert r["alone_differs"], (compile_as, r)  # without the group: not one process's bytes


def test_compiled_linear_keeps_the_all_reduce_in_one_graph(two_ranks: dict) -> None:
    for compile_as, r in two_ranks["compiled"].items():
        assert r["matches_eager"], (compile_as, r)
        assert r["graphs"] == 1 and r["graph_breaks"] == 0, (compile_as, r)  # one frame, no break
        assert r["aot_graphs"] == 2, (compile_as, r)  # forward, backward
        assert r["all_reduces"] == [1, 1] and all(r["waits"]), (compile_as, r)


def test_tensor_parallel_linear_matches_the_unsharded_linear(two_ranks: dict) -> None:
    for style, results in two_ranks["tensor_parallel"].items():
        for name, r in results.items():
            assert r["equal"] if name in TP_EXACT[style] else r["close"], (style, name, r)


def test_fsdp2_decoder_trains_as_one_process(two_ranks: dict) -> None:
    r = two_ranks["fsdp2"]
    assert r["first_equal"], r
    assert r["losses_close"], r


# ----------------------------------------------------------- FSDP2's FP8 weight all-gather


def test_fp8_all_gather_linear_is_the_unsharded_linear_bitwise(float8: tuple[int, dict]) -> None:
    """The gathered FP8 bytes and scale are the unsharded weight quantizer's (though every
    shard but rank 0's has a smaller amax of its own), and so are the output, the input
    gradient and the weight and bias gradients; the high-precision all-gather too, and a
    Linear whose rows FSDP2 shards unevenly (padded)."""
    world_size, r = float8
    linear = r["linear"]
    assert linear["own_amax_below"], world_size
    assert linear["fp8"]["unsharded_weight"] == "Float8GatheredWeight"
    assert linear["fp8"]["gathered_fp8_dtype"] == "float8_e4m3fn"
    assert linear["bf16"]["unsharded_weight"] == "Parameter"
    assert linear["bf16"]["gathered_bytes_equal"] is None  # it gathers no FP8 bytes
    assert linear["fp8 uneven"]["unsharded_weight"] == "Float8GatheredWeight"
    for gather, count in (("bf16", 4), ("fp8", 5), ("fp8 uneven", 5)):
        checks = {k: v for k, v in linear[gather].items() if k.endswith("_equal") and v is not None}
        assert len(checks) == count and all(checks.values()), (world_size, gather, checks)


def test_fp8_all_gather_decoder_trains_as_one_process_bitwise(float8: tuple[int, dict]) -> None:
    """3 AdamW steps: the losses equal one process's bit for bit with either all-gather (and
    with the amaxes precomputed after each step); split across the ranks (data parallelism),
    the fp8 all-gather's losses are the bf16 all-gather's bit for bit."""
    world_size, r = float8
    decoder = r["decoder"]
    for name in ("bf16", "fp8", "fp8 precomputed"):
        assert decoder[name]["equal"], (world_size, name, decoder[name]["losses"],
                                        decoder["reference"])
    assert decoder["split"]["equal"], (world_size, decoder["split"])


def _unit_bytes(params: list[tuple[str, torch.nn.Parameter]], world_size: int, fp8: bool) -> int:
    """What one rank sends to an FSDP unit's all-gather: its 1/world_size of every parameter,
    2 bytes an element (bf16), 1 for a quantized Linear's weight when gathered in FP8."""
    linear = ("attn.", "mlp.", "lm_head.")
    return sum(p.numel() // world_size * (1 if fp8 and name.startswith(linear) else 2)
               for name, p in params)


def test_fp8_all_gather_moves_one_byte_per_weight_element(float8: tuple[int, dict]) -> None:
    """The all-gather inputs FSDP2 sent (seen by a pass-through all-gather set with
    set_custom_all_gather): bf16 for the high-precision all-gather; uint8 for the FP8 one (the
    FP8 weight bytes next to the bf16 bytes of the other parameters), one byte per weight
    element. A step all-gathers the root once and each block twice (forward, backward)."""
    world_size, r = float8
    linear = r["linear"]
    shard = OUT // world_size
    assert linear["bf16"]["all_gathers"] == [["bfloat16", 2 * (shard * IN + shard)]]
    assert linear["fp8"]["all_gathers"] == [["uint8", shard * IN + 2 * shard]]
    padded = -(-UNEVEN_OUT // world_size)  # every rank sends the padded shard
    assert linear["fp8 uneven"]["all_gathers"] == [["uint8", padded * IN + 2 * padded]]
    model = Decoder(decoder_config("tiny"), seed=0)
    root = [(n, p) for n, p in model.named_parameters() if not n.startswith("layers.")]
    block = list(model.layers[0].named_parameters())
    layers = len(model.layers)
    for name, fp8, dtype in (("bf16", False, "bfloat16"), ("fp8", True, "uint8"),
                             ("fp8 precomputed", True, "uint8")):
        sizes = [_unit_bytes(root, world_size, fp8)] + [_unit_bytes(block, world_size, fp8)] * (
            2 * layers)
        assert r["decoder"][name]["all_gathers"] == [[dtype, size] for size in sizes], (
            world_size, name)
    assert r["decoder"]["fp8"]["bytes"] < 0.55 * r["decoder"]["bf16"]["bytes"]


# ------------------------------------------------------------------------ in one process


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


@pytest.mark.parametrize("recipe", ["fp8_block", "mxfp8", "nvfp4"])
def test_fp8_all_gather_refuses_other_recipes(recipe: str) -> None:
    why = rf"weight_quantizer is a \w+Quantizer; the FP8 weight all-gather is implemented for " \
          r"Float8CurrentScalingQuantizer \(recipe 'fp8_current'\) only"
    with pytest.raises(ValueError, match=why):
        Linear(64, 32, recipe=recipe, enable_fsdp_float8_all_gather=True)
    model = Decoder(decoder_config("tiny"), seed=0, dtype=torch.bfloat16)  # nvfp4's RHT: bf16
    before = dict(model.named_modules())
    with pytest.raises(ValueError, match=why):
        convert_to_quantized_training(model, recipe, enable_fsdp_float8_all_gather=True)
    assert dict(model.named_modules()) == before  # nothing was converted


def test_fp8_all_gather_refuses_configurations_it_does_not_cover() -> None:
    with pytest.raises(ValueError, match=r"compile_as='inline'\): the FP8-gathered weight takes"):
        Linear(64, 32, compile_as="inline", enable_fsdp_float8_all_gather=True)
    layer = Linear(64, 32, enable_fsdp_float8_all_gather=True)
    with pytest.raises(ValueError, match=r"weight_quantizer is a MXFP8Quantizer"):
        layer.weight_quantizer = MXFP8Quantizer()
    with pytest.raises(ValueError, match=r"built without enable_fsdp_float8_all_gather=True"):
        Linear(64, 32).wrap_weight_for_fsdp()


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")  # the root's output: a view (reshape)
def test_fp8_all_gather_on_one_rank_and_its_refusals() -> None:
    """fully_shard on a one-rank gloo group: the Linear computes with the gathered FP8 weight
    and gives the unsharded Linear's bytes; weight caching, and a weight quantizer changed
    after the gather, are refused."""
    from torch.distributed.fsdp import fully_shard

    from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer

    torch.manual_seed(0)
    reference = Linear(64, 32)
    x = torch.randn(16, 64)
    with single_process_group():
        layer = Linear(64, 32, enable_fsdp_float8_all_gather=True)
        layer.load_state_dict(reference.state_dict())
        assert isinstance(layer.weight, Float8AllGatherWeight)
        assert torch.equal(layer.weight, reference.weight)  # it behaves as the tensor it wraps
        fully_shard(layer)
        seen = []
        layer.register_forward_pre_hook(lambda m, _: seen.append(type(m.weight)))
        assert torch.equal(layer(x), reference(x))
        assert seen == [Float8GatheredWeight]
        with pytest.raises(ValueError, match=r"is_first_microbatch \(weight caching\) does not"):
            layer(x, is_first_microbatch=True)
        layer.weight_quantizer = Float8CurrentScalingQuantizer(force_pow_2_scales=True)
        with pytest.raises(ValueError, match=r"the gathered bytes would not be its own"):
            layer(x)


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")
def test_precomputed_amaxes_are_used_until_the_weight_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a one-rank group, the all-reduces the FP8 all-gather issues (a pass-through spy on
    torch.distributed.all_reduce): one per weight and all-gather without the precompute, one
    for all weights by the precompute and none at the gathers after it; after the optimizer
    step changes the weights, the gathers reduce their amaxes again (no stale scale)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from tetrt_support.quant.fsdp_float8 import precompute_float8_dynamic_scale_for_fsdp

    reduced: list[tuple[int, ...]] = []
    all_reduce = dist.all_reduce

    def spy(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        reduced.append(tuple(tensor.shape))
        return all_reduce(tensor, *args, **kwargs)

    torch.manual_seed(0)
    reference = torch.nn.Sequential(Linear(64, 32), Linear(32, 16))
    x = torch.randn(16, 64)
    with single_process_group():
        model = torch.nn.Sequential(*(Linear(m.in_features, m.out_features,
                                             enable_fsdp_float8_all_gather=True)
                                      for m in reference))
        model.load_state_dict(reference.state_dict())
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters())
        monkeypatch.setattr(dist, "all_reduce", spy)
        model(x).sum().backward()
        assert reduced == [()] * 4  # 2 weights, gathered in forward and again in backward
        optimizer.step()
        reduced.clear()
        assert precompute_float8_dynamic_scale_for_fsdp(model) == 2 and reduced == [(2,)]
        reduced.clear()
        model(x).sum().backward()
        assert reduced == []
        optimizer.step()
        model(x).sum().backward()
        assert reduced == [()] * 4
