# %% [markdown]
# # 09 · Quantized training across ranks: one scale for the whole batch
#
# **Question.** FP8 current scaling quantizes a tensor with the scale `448 / amax`, the
# amax being the largest magnitude of *that* tensor. Spread a batch over ranks (data
# parallelism, FSDP2) or a layer over ranks (tensor parallelism), and each rank sees only
# its part: does the quantized Linear still compute what one process computes on the whole
# batch — the same bytes, compiled into one graph — and what must the ranks share for that?
#
# Everything below runs on a CPU: the ranks are processes on this machine joined by a
# gloo group on loopback. No GPU and no NCCL were used.

# %%
from tetrt_support.notebook import setup; setup()

import inspect

import torch

from tetrt_support.quant.base import functional_all_reduce_max
from tetrt_support.report import Table, distributed_training
from tetrt_support.report.abstract import bound

print("torch", torch.__version__.split("+")[0])
# The ranks are spawned once, here: each imports torch and this package, and runs every
# demonstration of sections 3-6 in that one spawn; the sections read rank 0's summary.
summary = distributed_training.run_across_ranks(world_size=2)
print("ranks:", summary["world_size"], "| demonstrations:",
      ", ".join(k for k in summary if k != "world_size"))

# %% [markdown]
# **Abstract.** The answer, its figures computed by the cell below from the two ranks'
# summary, and where each part is:

# %%
from tetrt_support.report import abstract

abstract.show("09", **abstract.figures_09(summary))

# %% [markdown]
# ## 1. The amax a shard sees
#
# One process, no group yet. The batch (16 tokens × 64 features; the rows' magnitudes rise
# down the batch) is split into two halves, as two data-parallel ranks would hold it. Each
# half is FP8-quantized (E4M3, current scaling) twice — with its own amax, and with the
# whole batch's — and its data bytes are compared with the same rows of the whole batch
# quantized at once.

# %%
x, grad = distributed_training.demo_batch()
shards = distributed_training.shards_against_whole(x, shards=2)
Table([(s["rows"], f"{s['amax']:.4f}", f"{s['global_amax']:.4f}", f"{s['scale_inv_own']:.6f}",
        f"{s['scale_inv_global']:.6f}", f"{s['differ_own']} / {s['bytes']}",
        f"{s['differ_global']} / {s['bytes']}") for s in shards],
      ["rows", "own amax", "global amax", "own 1/scale", "global 1/scale",
       "bytes differ (own)", "bytes differ (global)"])

# %% [markdown]
# The first half's own amax is smaller than the batch's, so its scale is larger and every
# one of its bytes encodes a different value than one process would write; the second half
# holds the batch's largest element, so its own amax *is* the global one. Only the
# global amax gives the whole batch's bytes for every half.
#
# Why the ranks must agree: a quantized GEMM computes `scale_x · scale_w · Σ q_x q_w`.
# With per-rank scales each rank rounds its rows on its own grid, so the model that is
# trained depends on how the batch was split (another world size, another model), the
# data-parallel gradients that are summed come from differently quantized activations, and
# nothing can be checked against a one-process run. With one scale per tensor for the
# whole batch, every rank's rows are exactly the rows one process would quantize.
#
# ## 2. The fix: the Linear's `amax_reduction_group`
#
# `Linear(..., amax_reduction_group=group)` (FP8 current scaling only; other recipes
# refuse a group) all-reduces (MAX) the input's amax before its forward op and the output
# gradient's amax before its backward op, and the ops take the reduced amax as an input.
# The reduction is a *functional* collective, so under `torch.compile` it is a node of the
# graph, not a side effect that breaks it. The group stays on the Linear, never in a value
# quantizer (notebook 03, section 4c: a group would be invisible to the quantizer's
# equality). The weight's amax stays its own: under FSDP2 each rank holds the whole
# weight when it computes; under tensor parallelism a weight shard is quantized with its
# shard's scale, as TransformerEngine's tensor parallelism does.

# %%
print(inspect.getsource(functional_all_reduce_max))

# %% [markdown]
# ## 3. Two ranks against one process
#
# Each rank runs its 8 rows through a Linear (64 → 32) with the group, and through one
# without it; rank 0 also runs one process's Linear (the same weights) on all 16 rows.
# The output and the input gradient are per row, so they are compared byte for byte (fp32
# bytes, both ranks summed); the weight and bias gradients sum over the tokens, which the
# ranks split, so their all-reduced sum adds the same products in another order and is
# compared relatively. Both steps of the Linear are shown: the custom ops and the inline step.

# %%
rows = []
for step, r in summary["data_parallel"].items():
    rows += [(step, "without", f"{r['alone_out_differ']} / {r['bytes_out']}",
              f"{r['alone_dgrad_differ']} / {r['bytes_dgrad']}", "-", "-"),
             (step, "with", f"{r['grouped_out_differ']} / {r['bytes_out']}",
              f"{r['grouped_dgrad_differ']} / {r['bytes_dgrad']}", bound(r["wgrad_rel"]),
              bound(r["dbias_rel"]))]
Table(rows, ["step", "group", "output bytes differ", "input grad bytes differ",
             "weight grad rel err", "bias grad rel err"], key_columns=2)

# %% [markdown]
# With the group, both ranks' outputs and input gradients are one process's bytes; without
# it, rank 0's input (its amax below the batch's) and rank 1's output gradient (its amax
# below the gradient's) are quantized on their own grids, and over a third of the bytes
# differ. The weight and bias gradients agree to fp32 rounding of the summation order.
#
# ## 4. One compiled step
#
# The same Linear with the group under `torch.compile(fullgraph=True)` (AOTAutograd, eager
# kernels), each rank on its rows: frames compiled, graph breaks, whether forward and
# backward give the eager bytes, and the collective nodes of the forward and backward graphs.

# %%
Table([(step, r["graphs"], r["graph_breaks"], r["matches_eager"])
       for step, r in summary["compiled"].items()],
      ["compile_as", "graphs", "graph breaks", "eager bytes"])

# %%
for part in ("forward", "backward"):
    print(f"{part} graph (compile_as='custom_ops'), its collective nodes:")
    print(*(f"    {line}" for line in summary["compiled"]["custom_ops"][part]), sep="\n")

# %% [markdown]
# One graph and no break for both paths (`"auto"` takes the inline step under compile on
# the CPU, `"custom_ops"` the ops): the forward graph all-reduces the input's amax, the
# backward graph the output gradient's, each followed by its `wait_tensor`; `'0'` is the
# default group's name.
#
# ## 5. FSDP2: a decoder, trained on two ranks
#
# The collection's tiny decoder, converted to quantized Linears (`fp8_current`) with the
# group and sharded by `fully_shard` (each block and the root), trains 3 AdamW steps, each
# rank on its half of the batch; one process trains the same decoder on the whole batch.

# %%
fsdp = summary["fsdp2"]
Table([(step + 1, f"{a:.7f}", f"{b:.7f}", distributed_training.fp32_ulps(a, b))
       for step, (a, b) in enumerate(zip(fsdp["losses"], fsdp["reference"]))],
      ["step", "2 ranks (mean loss)", "1 process", "difference (fp32 ulps)"])

# %%
print("each rank's first loss bit-identical to one process's loss on its rows:",
      fsdp["first_equal"])
print(f"losses within rtol {distributed_training.FSDP_RTOL:g}:",
      fsdp["rel"] <= distributed_training.FSDP_RTOL)

# %% [markdown]
# Before the first update each rank's loss is one process's loss on that rank's sequences,
# bit for bit: every quantized Linear sees the global amaxes and every other op works per
# row or per sequence. The mean of the two ranks' losses is rounded in another order than
# one process's mean over the whole batch, hence the first step's ulp. After the first
# update the weight gradients add to that: each sums over tokens that the ranks
# split, and FSDP2's reduce-scatter adds the two halves, so the sum is rounded in another
# order than one process's (the loss scalings, 1/64 per rank then 1/2, are powers of two
# and exact). The weights after an update then differ by fp32 rounding, and the losses by
# an fp32 ulp or so; the test (`tests/quant/test_distributed_training.py`) allows a
# relative 1e-5.
#
# ## 6. Tensor parallelism: column-wise and row-wise
#
# The Linear sharded by `parallelize_module` with `colwise_parallel()` (weight rows split,
# output `Shard(-1)`) and `rowwise_parallel()` (weight columns split, input `Shard(-1)`,
# output summed across ranks), against the unsharded Linear. The input's and the output
# gradient's amaxes reduce over the mesh's group; the weight is quantized per shard, so
# the test weight puts its largest magnitude in every shard (each shard's scale is then the
# global one: otherwise the sharded layer quantizes its weight more finely than one process).

# %%
Table([(style, name, r["equal"], bound(r["rel"]))
       for style, results in summary["tensor_parallel"].items() for name, r in results.items()],
      ["style", "result", "bit-identical", "rel err"], key_columns=2)

# %% [markdown]
# Bit-identical wherever no rank splits the contraction (column-wise: the output and the
# weight gradient; row-wise: the input and weight gradients, and the bias gradient, summed
# over the whole batch on each rank). Summed across ranks — the column-wise input gradient,
# the row-wise output — and the column-wise bias gradient, added in another order, agree
# to fp32 rounding.
#
# ## 7. What remains open
#
# - The FP8 weight all-gather under FSDP2 is not built: `fully_shard` gathers the
#   high-precision weight and each rank quantizes it after the gather (TransformerEngine
#   and torchao can all-gather the FP8 bytes instead: one byte per element on the wire).
# - No multi-GPU (NCCL) run: only single-GPU machines were lent, so everything here is gloo
#   on a CPU. The collective is the same functional all-reduce on NCCL, but that path,
#   its overlap with compute and the CUDA kernels across ranks were not exercised.
# - Speed and bytes-on-the-wire figures (the cost of the extra amax all-reduce per Linear,
#   FSDP2's and tensor parallelism's step time against one GPU) need 2 or more GPUs and
#   were not measured.
# - The weight's amax stays per shard under tensor parallelism (as TE's); a weight whose
#   shards have different amaxes is quantized more finely than one process would, so
#   bit-identity with the unsharded layer holds only for weights like section 6's.
