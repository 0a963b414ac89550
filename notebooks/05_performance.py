# %% [markdown]
# # 05 · Performance on a 2-core CPU and on Hopper GPUs
#
# **Question.** What does lowering complex RoPE to real arithmetic cost at run time, how
# close does the lowered graph get to the memory roofline once compiled, what does a
# quantized Linear cost around an FP8 GEMM once quantization is counted, how fast is a
# quantized training step against bf16 and torchao, and do the recipes train as well as bf16?
#
# This notebook **measures nothing**: it reads the files that the one benchmark entry
# point wrote, so a replay shows the same numbers until someone re-measures:
#
# ```bash
# python -m benchmarks.perf --device cpu --suites rope,attention,linear  # results/perf_cpu.json (this 2-core machine)
# python -m benchmarks.perf --device cuda --suites rope,attention,linear # results/perf_cuda.json (an H200, torch 2.11)
# python -m benchmarks.perf --device cuda --suites train_step --modes default,reduce-overhead,cuda-graph-step \
#     --profile prof                                                     # results/train_step_cuda.json
# python -m benchmarks.perf --device cuda --suites step_bounds           # results/step_bounds_cuda.json
# python -m benchmarks.perf --device cuda --suites llama4                # results/llama4_cuda.json
# python -m benchmarks.perf --device cuda --suites loss_study            # results/loss_curves_cuda.json
# python -m benchmarks.perf --device cpu --suites loss_study             # results/loss_curves_cpu.json
# python -m benchmarks.perf --device cuda --suites model_step --sizes 8b_2048 --recipes \
#     bf16,torchao_float8_tensorwise,fp8_current,fp8_current_inline,te_fp8_current,te_fp8_delayed,\
#     te_fp8_block    # model_step_cuda.json (TransformerEngine built on the machine first)
# python -m benchmarks.perf --device cuda --suites model_step --sizes 8b_2048 --recipes \
#     bf16,torchao_float8_tensorwise,fp8_current,fp8_block,fp8_current+custom_ops,fp8_block+custom_ops
#                     # model_step_cuda.json, stored as model_step_recipes_cuda.json
# python scripts/gpu_check.py --only quantizers,linear,inline,inline_decoder,inline_cases
#                     # gpu_check_inline_cuda.json (stopped at the inline check's 1000 tokens)
# python scripts/gpu_check.py --only inline_decoder,inline_cases  # gpu_check_inline_decoder_cuda.json
# python scripts/gpu_check.py --device cpu   # under torch 2.11, both inline recipes:
#                                            # gpu_check_inline_torch211_cpu.json
# python -m benchmarks.perf --device cpu --suites host_cost  # results/host_cost_cpu.json
# # on an H100, later (four files):
# python scripts/gpu_check.py --only linear,inline,inline_decoder,inline_cases
#                     # gpu_check_inline_cuda.json, stored as gpu_check_inline_cuda_h100_stopped.json
# python scripts/gpu_check.py --only inline,inline_decoder,inline_cases  # after the block GEMM
#                     # change: gpu_check_inline_cuda.json, stored as gpu_check_inline_cuda_h100.json
# python -m benchmarks.perf --device cuda --suites host_cost   # results/host_cost_cuda.json
# python -m benchmarks.perf --device cuda --suites model_step --sizes 8b_2048 --recipes \
#     bf16,torchao_float8_tensorwise,fp8_current,fp8_block,fp8_current+custom_ops,fp8_block+custom_ops
#                     # model_step_cuda.json, stored as model_step_recipes_cuda_h100.json
# ```
#
# Every figure below is a median; every claim is a **ratio of two figures from one
# run** — absolute times on shared machines do not compare across runs. TensorRT was not
# run anywhere (the H200 box has none); TransformerEngine 2.20.2, built on the H200 from
# its published wheels, is a peer in section 5 only.

# %%
from tetrt_support.notebook import setup, wrap_lines; setup()

import matplotlib.pyplot as plt
from IPython.display import display

from tetrt_support import optional
from tetrt_support.report import model_step, perf, results, training

RESULTS = "../benchmarks/results"
cuda = results.load(f"{RESULTS}/perf_cuda.json", "perf")
cpu = results.load(f"{RESULTS}/perf_cpu.json", "perf")
print(*wrap_lines("GPU file: " + perf.machine_line(cuda)), sep="\n")
print(*wrap_lines("CPU file: " + perf.machine_line(cpu)), sep="\n")
print(optional.availability_line())

# %% [markdown]
# **Abstract.** The answer, its figures computed by the cell below from the stored H200 files
# (`perf_cuda.json`, `train_step_cuda.json`, `model_step_cuda.json`) and the H100 one
# (`model_step_recipes_cuda_h100.json`), and where each part is:

# %%
from tetrt_support.report import abstract

abstract.show("05", **abstract.figures_05(
    cuda, results.load(f"{RESULTS}/train_step_cuda.json", "train_step"),
    results.load(f"{RESULTS}/model_step_cuda.json", "model_step"),
    results.load(f"{RESULTS}/model_step_recipes_cuda_h100.json", "model_step")))

# %% [markdown]
# ## 1. RoPE against the roofline (H200)
#
# Llama RoPE on q and k of shape `[8, 4096, 32, 128]` fp32 reads 1 GiB and writes 1 GiB:
# it is purely memory-bound, so the practical roofline is a `clone` of the same bytes.
# The variants: the complex original (eager and `torch.compile`), the lowered graph of
# both strategies (eager and compiled; "frozen" adds inductor's inference freezing, which
# folds the packed `[..., 2]` frequency buffer into contiguous real and imaginary
# planes, as an engine build folds constants; "folded" runs the same folding as a lowering
# pass instead, `tetrt_support.compiler.fold_constants`, and compiles without freezing;
# `tetrt_compile_inductor_*` is the exported program through
# `tetrt_support.compile(..., backend="inductor")`, the shipped pipeline, which runs that
# pass), and a hand-written real RoPE compiled as two graphs (q, k separately) or one.
# Variants are timed round-robin, each round in a new order, and each sample of 10 calls
# starts with the device already busy (`report/timing.py` says why), so drift hits all of
# them alike and no variant is charged its host time to first launch.

# %%
perf.rope_table(cuda)

# %%
names, fractions = perf.bandwidth_series(cuda)
fig, ax = plt.subplots(figsize=(7.5, 3.6))
colors = ["tab:gray" if n == "clone" else "tab:blue" if n.startswith("lowered") else "tab:orange"
          for n in names]
ax.barh(names, fractions, color=colors)
ax.axvline(perf.ROPE_TARGET, color="k", linestyle="--", linewidth=1)
ax.set_xlabel("fraction of a clone's bandwidth (H200)")
ax.set_title(f"dashed: target {perf.ROPE_TARGET}; blue: lowered; orange: reference", fontsize=9)
ax.invert_yaxis()
plt.tight_layout()
plt.show()
print("\n".join(perf.rope_claims(cuda)))

# %% [markdown]
# **Reading.** Every compiled lowered variant reaches the hand-written one-graph version
# here: 1.000 through `tetrt_support.compile` and after the folding pass, 1.003 compiled
# straight from the lowering, against the 0.99 aim (the two hand-written variants differ
# by 0.010 of the clone). The stored run before this one put the unfolded graph at 0.91
# and the folded one at 0.985 of the one-graph version. Most of that gap was the timer:
# each sample started on an idle device, so a variant behind more Python (a `GraphModule`'s
# pytree handling, the compiled module's input check) paid its host time to first launch
# once per sample. In a probe on the H200 (script not stored), with samples started cold,
# the folded graph was 0.990 and the pipeline 0.982 of the hand-written version; with the
# device busy at the start of each sample, both were 1.000. What remains between the
# kernels is one load: unfolded, inductor reads the frequencies interleaved from the
# packed buffer (seen in its generated code in that probe), folded, from contiguous
# planes; at this size the two cost the same. The complex original, compiled or not,
# stays near 88%: inductor does not generate code for complex ops and falls back to
# eager kernels. Eager lowered code is slow (each real op is its own kernel and its own
# pass over the data): lowering is meant to be compiled.

# %% [markdown]
# ## 2. The RoPE attention block (H200)
#
# With projections and attention around it (batch 8, sequence 2048, hidden 2048, 16 heads),
# RoPE is a small part of the time, and the lowered graph costs what the complex one does.

# %%
perf.attention_table(cuda)

# %% [markdown]
# ### A mid-size Llama 4 through `compile(backend="inductor")` (H200)
#
# Hugging Face's Llama 4 text model (random weights): 4 layers, hidden 2048, 16 heads of
# 128, dense MLP, batch 4 × 2048 tokens, bf16, one forward pass. Its rotary embedding is
# complex. Eager and `torch.compile` of that complex original against the exported program
# through `tetrt_support.compile(..., backend="inductor")`, lowered by each strategy
# (`python -m benchmarks.perf --device cuda --suites llama4` writes `results/llama4_cuda.json`).
# Target: at least as fast as `torch.compile` ("vs torch.compile" is its time over the
# variant's). `torch_compile_again` is the same compiled model timed as a variant of its
# own: an A/A control, whose ratio is the spread this run's ratios carry. The errors are
# the largest logit error relative to the largest logit, against eager bf16 and against
# an fp32 run of the same weights.

# %%
import pathlib

llama4_path = pathlib.Path(RESULTS) / "llama4_cuda.json"
if llama4_path.exists():
    llama4 = results.load(llama4_path, "llama4")
    print(*wrap_lines(perf.machine_line(llama4)), sep="\n")
    display(perf.llama4_table(llama4))
    print(*wrap_lines("\n".join(perf.llama4_claims(llama4))), sep="\n")
else:
    print("No stored run: `python -m benchmarks.perf --device cuda --suites llama4` writes "
          "results/llama4_cuda.json.")

# %% [markdown]
# **Reading.** Both strategies are faster than `torch.compile` of the complex original: 1.039 and
# 1.042, well outside the A/A control's 1.005. The stored run before this one gave 0.976,
# with rounds in one fixed order, samples started on an idle device and no constant
# folding in the pipeline; this run changed all three, and one run cannot apportion the
# gain among them. A profile of both variants taken before the folding (a probe on the
# H200, not stored) found the same GEMM and attention calls in each; the lowered graph's
# elementwise kernels took 1.32 ms per forward against 1.39 ms for `torch.compile`, whose
# complex multiplies run as eager ATen kernels. Now the causal mask and the rotary tables,
# which depend on constants alone at a fixed shape, are computed once when compiling.

# %% [markdown]
# ## 3. The quantized Linear against bf16 and raw FP8 (H200)
#
# `tetrt_support.quant.Linear` at m = n = k = 8192 with bf16 input. "forward" quantizes
# input and weight on every call (quantization included); "cached_weight" reuses the
# quantized weight as TransformerEngine does across micro-batches; "forward_backward"
# counts three GEMMs. `fp8_scaled_mm_raw` is `torch._scaled_mm` on operands quantized
# beforehand: the ceiling for FP8. The quantizers run the Triton kernels of
# `tetrt_support.quant.kernels` (one amax pass and one cast pass for FP8 current scaling,
# one pass for the block formats, both layouts from one read), checked byte for byte against
# the CPU reference by `scripts/gpu_check.py` on an H200 (its stored run is printed below;
# "What remains open" says what it found), and the FP8 GEMM writes bf16 directly. MXFP8 and NVFP4 have no
# tensor-core GEMM on Hopper: here they are emulated: each operand is dequantized into
# bf16 (which holds its values exactly) by a Triton kernel and multiplied by cuBLAS's bf16
# GEMM.

# %%
gpu_check = results.load(f"{RESULTS}/gpu_check_cuda.json", "gpu_check")
print(*perf.gpu_check_claims(gpu_check), sep="\n")
display(perf.gpu_check_kernel_table(gpu_check))

# %%
perf.linear_table(cuda)

# %%
names, tflops = perf.tflops_series(cuda)
fig, ax = plt.subplots(figsize=(7.5, 3.8))
colors = ["tab:green" if n.startswith("fp8") else "tab:gray" if "bf16" in n else "tab:purple"
          for n in names]
ax.barh(names, tflops, color=colors)
ax.set_xscale("log")
ax.set_xlabel("TFLOP/s (H200, log scale)")
ax.set_title("quantized Linear throughput per case, m = n = k = 8192\n"
             "green: FP8; gray: bf16; purple: MXFP8 and NVFP4 (emulated GEMMs)")
ax.invert_yaxis()
plt.tight_layout()
plt.show()
print(*wrap_lines("\n".join(perf.linear_claims(cuda))), sep="\n")

# %% [markdown]
# ## 4. The training step against bf16 and torchao (H200)
#
# One `Linear` without bias (bf16 weight and activations), `torch.compile`d, forward and
# backward: `y = layer(x); y.backward(dy)`, at two sizes T x K x N (tokens, in-features,
# out-features). The peer is torchao's float8 training with its tensorwise recipe, installed
# for the benchmark only (the `bench` extra). fp8_current and fp8_block run FP8 tensor-core
# GEMMs (fp8_block the native blockwise GEMM, 1 x 128 by 128 x 128 scales, for forward,
# dgrad and wgrad); MXFP8 and NVFP4 have no GEMM on Hopper and run emulated (bf16 operands
# that are exact in bf16, fp32 accumulation). All variants of a size were timed round-robin
# in one process (each round in a new order, each sample started with the device busy),
# three ways, every variant alike: torch.compile's default mode; its `reduce-overhead` mode
# (CUDA graphs, one for the forward and one for the backward, each replay checked by the
# host); and the default-mode step captured whole, forward and backward, into ONE CUDA graph
# (`torch.cuda.graph`, as PyTorch's whole-network capture recipe) and replayed: one launch
# per step, so that column is the GPU's work with the host out of the way. The code that ran
# is this notebook's commit.

# %%
steps = results.load(f"{RESULTS}/train_step_cuda.json", "train_step")
print(*wrap_lines("file: " + perf.machine_line(steps)), sep="\n")

# %%
suites = training.step_suites(steps)
# one panel per way of running the step, stacked so the figure keeps to the page column
fig, axes = plt.subplots(len(suites), 1, figsize=(8.0, 2.6 * len(suites) + 0.9), sharex=True)
for ax, suite in zip(axes, suites):
    training.plot_step_speedups(ax, steps, suite)
axes[-1].set_xlabel("step size: T tokens, K in-features, N out-features")
fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3)
fig.suptitle("Training step speedup over bf16 per recipe, three ways of running it (H200)\n"
             "black ticks: targets; dotted line: bf16")
plt.tight_layout(rect=(0, 0.07, 1, 1))
plt.show()
display(*(training.step_table(steps, suite) for suite in suites))

# %% [markdown]
# **Targets.** The ratios this work set out to reach, judged on this one run in each of the
# three ways, and the FP8 forward against raw `torch._scaled_mm` on operands quantized
# beforehand (measured once):

# %%
display(training.step_target_table(steps), training.forward_table(steps))
print(*wrap_lines("\n".join(training.missed_targets(steps))), sep="\n")

# %% [markdown]
# **Where the time goes.** The kernel profile of the fp8_current step from the same run (the
# torch profiler over 5 steps, per step; the host time is of steps issued back to back),
# then the host's side of that step at the small size, layer by layer
# (`benchmarks/host_breakdown.py`: each callable issued back to back, device waits left
# out, so each row is what the host spends to issue it):

# %%
display(*(training.profile_table(steps, key) for key in steps["suites"]["profiles"]))
display(training.host_breakdown_table(steps))

# %% [markdown]
# **The GPU's clock.** nvidia-smi was sampled every 100 ms while each size was timed
# (`benchmarks/gpu_clocks.py`). The H200 spends most of these steps at its 700 W power cap
# (clock event reason "SW power cap"), with its SM clock below the 1980 MHz it reaches
# uncapped:

# %%
display(training.clock_table(steps))

# %% [markdown]
# **Reading.** At the large size every step target is met in this run, in all three ways.
# fp8_current is 1.780x bf16 in the default mode, 1.726x with `reduce-overhead` and 1.767x
# as one graph, ahead of torchao each time (1.108x, 1.086x and 1.097x its speed). fp8_block,
# on the native blockwise GEMM, is 1.499-1.523x; MXFP8 and NVFP4, emulated, are
# 0.954-0.971x and 0.812-0.820x. That size ran at the power cap in 96-100% of the samples.
#
# At the small size the three ways differ by the host. In the default mode every recipe of
# this project is bound by it: the fp8_current profile shows 0.72 ms of kernels under
# 2.19 ms of host time (the breakdown: the forward custom op costs 0.76 ms of host time and
# the backward 0.67 ms when called directly). Captured as one graph the host is out of the
# way, and the ratios are the GPU's: fp8_current 1.439x bf16 (three FP8 GEMMs of
# 0.18-0.20 ms each, 0.13 ms of amax and cast kernels), ahead of torchao's 1.301x. That
# meets the 1.35x aim, which the host hides in the default mode (0.479x) and, in this run,
# just misses with `reduce-overhead` (1.326x). fp8_block meets its 1.2x as one graph
# (1.233x; 1.183x in the previous stored run, before the column-wise quantize program was
# rewritten, section "What bounds the step") and misses it with `reduce-overhead` (1.180x).
# MXFP8 meets its 0.75x in both graph ways (0.801x and 0.771x).
#
# Missed at the small size in all three ways: NVFP4, 0.556x at best (0.75x aimed). Its
# emulated GEMMs alone take longer than 0.75x allows (below).
#
# The clock table says how far these ratios carry: most samples of every graph run were
# taken at the power cap, with the SM clock well under its 1980 MHz, so each step's time
# depends on the power its variant draws and a ratio near its aim can fall either side of
# it in another run.

# %% [markdown]
# ### What bounds the step (H200)
#
# Is a missed aim a matter of slow quantization kernels, or of the GEMMs? A second run
# (`--suites step_bounds`, `benchmarks/step_bounds.py`) takes each recipe's one-graph step
# apart: its three GEMM calls alone, on operands quantized beforehand (the same
# `quantized_matmul` calls with the same layouts; for MXFP8 and NVFP4 their emulation), its
# three quantize calls alone, and a copy of the T x K bf16 input for the memory bandwidth.
# Each is one CUDA graph, all timed round-robin with the bf16 step. The quantization's
# floor is the bytes it must move (each input read once, twice where a per-tensor amax must
# come before the cast; each quantized buffer written once) at the copy's speed. The bound,
# bf16 step / (GEMMs + floor), is the best speedup these GEMMs allow with quantization as
# fast as a copy. A CPU test checks that the GEMM calls alone give the layer's `y`, `dx`
# and `dw` bit for bit; on the GPU each GEMM graph was replayed once more after all the
# others and compared with an eager call (`replay`).

# %%
bounds = results.load(f"{RESULTS}/step_bounds_cuda.json", "step_bounds")
print(*wrap_lines("file: " + perf.machine_line(bounds)), sep="\n")
print(*training.bound_baselines(bounds), sep="\n")
display(training.bound_table(bounds))

# %% [markdown]
# **Reading.** In this run each step takes its GEMMs plus its quantization to within 5%,
# so the parts account for the whole (fp8_block at the small size: 0.769 + 0.134 =
# 0.903 ms of parts, and 1.063 ms / 1.236 = 0.860 ms for its step).
#
# - **NVFP4 at the small size: its aim is above its bound** (0.75x against 0.685x). The
#   emulated GEMMs alone take 1.439 ms, more than the 1.417 ms that 0.75x allows (this
#   run's 1.063 ms bf16 step / 0.75). No quantization kernel can close that; only other
#   GEMMs would move the bound: Blackwell's native FP4 GEMM, or an emulation that reads the
#   FP4 operands itself and applies the per-tensor factors in its epilogue (not attempted).
# - **fp8_block at the small size is at its bound** (1.236x against 1.239x, 1.2x aimed).
#   Its three quantize calls took 0.134 ms against a floor of 0.088 ms: 66% of the copy's
#   speed, where the previous stored run's took 0.152 ms (58%). What changed is the
#   column-wise 1 x 128 program: it stored its cast tile transposed, which Triton lowered
#   to single-byte stores into shared memory, 64 per thread and slab; it now loads the tile
#   as eight parts of one row in eight, so each thread holds eight consecutive rows of its
#   columns, packs them in registers (`tl.join`) and moves 8-byte words (the PTX, which
#   `tests/quant/test_kernel_codegen.py` compiles on the CPU and checks). The bytes are the
#   same (section 3's check), and the kernel that quantizes both layouts of an 8192 x 4096
#   input takes 51.0 us there ("blockwise 1x128 both"; 57.6 us in the previous stored run).
# - fp8_current's quantization runs at 90% (small) and 91% (large) of the copy's speed:
#   its step is within 1% of its bound at the small size and within 2% at the large one
#   (1.440x against 1.451x, 1.780x against 1.804x).
# - Every other aim is within its bound, and every GEMM graph replayed last gave the
#   eager call's bytes.
#
# **The three GEMMs one at a time.** The same run timed each GEMM call alone. fprop,
# dgrad and wgrad do the same FLOPs; for every recipe but one they take the same time to
# within 8%:

# %%
display(training.gemm_split_table(bounds))

# %% [markdown]
# fp8_block's wgrad is the exception: 1.29x its fprop at the small size, 1.39x at the
# large. It is the one GEMM of that step with 1 x 128 scales on both operands (the output
# gradient and the input, both scaled along the token dim, as TransformerEngine's blockwise
# recipe defines it); the fprop and dgrad have a 128 x 128-scaled weight on one side. At
# the small size the wgrad's 0.066 ms over the fprop is 40% of the 0.167 ms by which
# fp8_block's three GEMMs (0.769 ms) exceed fp8_current's (0.602 ms), the gap between their
# bounds (1.239x and 1.451x). That time is inside cuBLASLt's GEMM, which this collection
# calls and does not write.
#
# **The FP8 forward, bounded the same way.** The same run also timed, as CUDA graphs
# round-robin at m = n = k = 8192, raw `torch._scaled_mm` on operands quantized
# beforehand, the fp8_current Linear's forward (the weight quantized per call, or cached)
# and a copy of the input. The bound is scaled_mm / (scaled_mm + floor), the floor being
# the quantization's bytes at copy speed: each bf16 input read twice (current scaling's
# amax pass, then its cast) and its FP8 copy written once; "bound, 1 read" counts one read,
# the floor of any quantizer of those tensors:

# %%
display(training.forward_bound_table(bounds))

# %% [markdown]
# Both forwards are within 1% of current scaling's bound (0.827 of 0.835, 0.906 of
# 0.910), and both aims are above even the one-read bound (0.90 against 0.894, 0.95 against
# 0.944). At this GEMM's speed and this copy bandwidth no quantization of `x` and `W`
# before the GEMM, however it finds its scale, leaves room for them.
#
# **Every target section 4's run missed in all three ways, against its bound** (the step
# bounds and the forward's two-read bound from this run, the forward's one-read bound too):

# %%
print(*wrap_lines("\n".join(training.missed_against_bounds(steps, bounds))), sep="\n")

# %% [markdown]
# ## 5. A whole model under plain `torch.compile(model)`
#
# Users train whole models with `torch.compile(model)` in the default mode, usually without
# CUDA graphs. The model benchmark trains a Llama-3-style decoder at Llama 3 8B widths
# (4 layers, 2048 tokens a step, bf16, fused AdamW) with every Linear but `lm_head`
# converted by `quant.convert_to_quantized_training`, 20 steps on the same batches, then
# times the steps round-robin. TransformerEngine 2.20.2 is the second peer: `te.Linear`
# with the same weights under `te.autocast` with each Hopper recipe (`te_*` rows), compiled
# the same way. One H200, one run:

# %%
model_run = results.load(f"{RESULTS}/model_step_cuda.json", "model_step")
print(*wrap_lines("model_step file: " + perf.machine_line(model_run)), sep="\n")
display(model_step.model_step_table(model_run, "8b_2048"))
print(*wrap_lines("\n".join(model_step.model_step_claims(model_run, "8b_2048"))), sep="\n")

# %% [markdown]
# At 2048 tokens a step the GPU no longer hides the host. The custom-op Linear
# (`fp8_current`) spends more than twice torchao's host time a step and runs at about half
# of bf16's speed, where torchao's runs faster than bf16; TransformerEngine's own Linear,
# compiled the same way, lands between the two. `fp8_current_inline` is the step written
# as one `autograd.Function` over plain tensors, which inductor fuses and launches from its
# own code: in this run it was faster than torchao, with less host time and bf16's peak
# memory, but its loss after 20 steps is far from bf16's. The check of a tiny converted
# decoder, run on the same machine, says why:

# %%
inline_check = results.load(f"{RESULTS}/gpu_check_inline_decoder_cuda.json", "gpu_check")
print(*wrap_lines("\n".join(model_step.inline_decoder_lines(inline_check))), sep="\n")
print(*wrap_lines("\n".join(model_step.inline_case_lines(inline_check))), sep="\n")

# %% [markdown]
# Run eagerly, the inline step equals the custom ops; compiled, every parameter inside the
# blocks gets a zero gradient, and so does a single Linear under `aot_eager`. The cause is
# not the GPU but the torch version: the device machine runs torch 2.11, the CPU tests
# torch 2.14. The compiled backward graph shows it: the inline step's backward is handed
# `aten.zeros` where its output's gradient should be. Under torch 2.11's Dynamo, the
# forward's last `.to(dtype)`, a no-op that returns its input when the GEMM already wrote
# that dtype, left the function's output without a gradient path. torch 2.11's CPU build
# reproduces the zeros exactly. The forward now returns the GEMM's output itself. The inline
# step now also covers FP8 block scaling (1x128 input and gradient, 128x128 weight; on CUDA
# through the same cuBLASLt blockwise GEMM as the custom ops). The same check on torch 2.11's
# CPU build, for both recipes, finds every gradient equal to the custom ops' (aot_eager bit
# for bit; inductor and the math attention kernel round the bf16 parts of the model
# differently, so their gradient norms move by up to 1.3%):

# %%
fixed_check = results.load(f"{RESULTS}/gpu_check_inline_torch211_cpu.json", "gpu_check")
print(*wrap_lines("gpu_check file: " + perf.machine_line(fixed_check)), sep="\n")
for recipe in ("fp8_current", "fp8_block"):
    print(f"-- {recipe}")
    print(*wrap_lines("\n".join(model_step.inline_decoder_lines(fixed_check, recipe))), sep="\n")
    print(*wrap_lines("\n".join(model_step.inline_case_lines(fixed_check, recipe))), sep="\n")

# %% [markdown]
# The same check on a GPU came later (the H100 subsection below says how it went); until it
# passed, `compile_as="auto"` kept the custom ops on CUDA, and the inline row of the table
# above is the run before the fix: its speed and memory are those of the same kernels, its
# loss is not.
#
# ### The recipes re-run after the fast-path change
#
# Since that run, each quantized format registers its own GPU fast paths, so every FP8 row
# above runs through changed code. A later H200 run took the same model step for bf16,
# torchao and both recipes (TransformerEngine was not rebuilt for it: its rows stay those of
# the run above). The inline step was not yet trusted on CUDA, so `fp8_current` and
# `fp8_block` under `compile_as="auto"` took the custom ops, as the `+custom_ops` rows do:

# %%
recheck = results.load(f"{RESULTS}/model_step_recipes_cuda.json", "model_step")
print(*wrap_lines("model_step file: " + perf.machine_line(recheck)), sep="\n")
display(model_step.model_step_table(recheck, "8b_2048"))
print(*wrap_lines("\n".join(model_step.model_step_claims(recheck, "8b_2048"))), sep="\n")

# %% [markdown]
# Nothing moved: the four custom-op rows run at about half of bf16's speed, spend 2.8 to
# 3.4 times torchao's host time a step, and end within 1% of bf16's loss, as `fp8_current`
# did before. The same session ran `scripts/gpu_check.py` on the quantizers and the inline
# step:

# %%
inline_run = results.load(f"{RESULTS}/gpu_check_inline_cuda.json", "gpu_check")
print(*wrap_lines("gpu_check file: " + perf.machine_line(inline_run)), sep="\n")
inline_lines = perf.gpu_check_claims(inline_run) + model_step.inline_error_lines(inline_run)
print(*wrap_lines("\n".join(inline_lines)), sep="\n")

# %% [markdown]
# Every quantizer's fast path still equals the CPU reference byte for byte. The inline check
# never reached the inline step: its reference, the custom ops run eagerly, failed in the
# weight gradient of its 1000-token case. The tensorwise fast path handed `torch._scaled_mm`
# a GEMM that reduces over the 1000 tokens, and CUDA's FP8 GEMM takes only multiples of 16.
# Any FP8 current-scaling Linear fed a token count off that multiple would have failed the
# same way in `backward` on a GPU; the CPU's `_scaled_mm` has no such limit, so no test here
# could see it. The tensorwise fast path now leaves such a GEMM to the reference, and the
# inline step names the dims it cannot take on CUDA (`compile_as="auto"` then takes the
# custom ops); the check's case is now 1008 tokens.

# %% [markdown]
# ### The inline check on an H100, and the whole model with it
#
# A later session got an H100, not the H200, so its figures compare only with each other.
# Its first run of the inline check went one step further:

# %%
stopped = results.load(f"{RESULTS}/gpu_check_inline_cuda_h100_stopped.json", "gpu_check")
print(*wrap_lines("gpu_check file: " + perf.machine_line(stopped)), sep="\n")
for recipe in ("fp8_current", "fp8_block"):
    shapes = model_step.inline_linear_lines(stopped, recipe) or ["no shape ran"]
    print(f"-- {recipe}", *shapes, sep="\n")
print(*wrap_lines("\n".join(model_step.inline_error_lines(stopped))), sep="\n")

# %% [markdown]
# The FP8 current-scaling inline step, compiled by inductor, equals the custom ops byte for
# byte in every output of every shape, the 1008-token case included: the multiple-of-16
# fix holds on CUDA. FP8 block scaling stopped before its first shape. Dynamo refuses to
# trace `torch._scaled_mm_v2`, the Python binding that `torch.nn.functional.scaled_mm`
# calls; the CPU tests never met it because there the block GEMM is not cuBLASLt's. The
# block GEMM now calls the ATen operator `aten._scaled_mm_v2` itself, which Dynamo records
# as a graph node (a test traces it on meta tensors). With that change the whole check
# ran again on the same kind of machine: each Linear shape, a tiny decoder run six ways
# against the custom ops run eagerly, and seven uses of one Linear under `aot_eager`:

# %%
h100_check = results.load(f"{RESULTS}/gpu_check_inline_cuda_h100.json", "gpu_check")
print(*wrap_lines("gpu_check file: " + perf.machine_line(h100_check)), sep="\n")
for recipe in ("fp8_current", "fp8_block"):
    lines = (model_step.inline_linear_lines(h100_check, recipe)
             + model_step.inline_decoder_lines(h100_check, recipe)
             + model_step.inline_case_lines(h100_check, recipe))
    print(f"-- {recipe}", *wrap_lines("\n".join(lines)), sep="\n")

# %% [markdown]
# Both recipes pass. Every Linear output is equal to the custom ops' byte for byte. No
# parameter of the decoder gets a zero gradient. `aot_eager` gives eager's gradients
# exactly; inductor and the math attention kernel round the bf16 parts of the model
# differently and move a gradient norm by at most 0.6% (the custom ops under inductor: 0.4%).
# So CUDA joined `inline_linear.VERIFIED_DEVICE_TYPES` for both recipes, and
# `compile_as="auto"` now takes the inline step there. The same session then timed the whole model and counted the host's
# work per step. Each `fp8_*` variant is named with the step its Linears compiled to:

# %%
h100_step = results.load(f"{RESULTS}/model_step_recipes_cuda_h100.json", "model_step")
print(*wrap_lines("model_step file: " + perf.machine_line(h100_step)), sep="\n")
display(model_step.model_step_table(h100_step, "8b_2048"))
print(*wrap_lines("\n".join(model_step.model_step_claims(h100_step, "8b_2048"))), sep="\n")
h100_host = results.load(f"{RESULTS}/host_cost_cuda.json", "host_cost")
display(model_step.host_cost_table(h100_host))
print(*wrap_lines("\n".join(model_step.host_cost_claims(h100_host))), sep="\n")

# %% [markdown]
# **Reading.** Under a plain `torch.compile(model)`, the inline fp8_current step runs the
# 8B-width decoder at 1.077x bf16, level with torchao's 1.073x, with torchao's host time
# and bf16's peak memory. Its loss after 20 steps is within 0.4% of bf16's. The same
# recipe through its custom ops runs at 0.824x: its host time a step (31.6 ms) is nearly
# its whole step (33.12 ms) and longer than bf16's whole step, so the ops' Python sets the
# pace. The one-Linear count shows the same. The inline step makes 507 Python calls a step,
# torchao 501, the custom ops 1561. Block scaling gains too, from 0.776x to 0.930x, but
# stays below bf16 with 1.67x torchao's host time a step; where that host time goes was
# not measured. The H200 run above had the same custom ops at 0.547x on a slower host:
# bf16's host time a step was 11.5 ms there and 6.9 ms here, and a host-bound step follows
# its host.

# %% [markdown]
# ### What the host does per step, counted on the CPU
#
# The same count on the 2-core CPU machine, the first place the inline step was verified. `benchmarks/host_cost.py`
# compiles one Linear's training step (default mode, `fullgraph=True`) at a size whose
# arithmetic takes microseconds and counts what the host does per step: the Python function
# calls (cProfile) and the ATen operators dispatched (torch.profiler). These are counts, not
# times: the same on any machine with the same versions. The wall time beside them is
# measured on the shared 2-core machine. One caveat: on the CPU the custom ops quantize
# through the eager reference, not CUDA's Triton kernels, so their counts are not the GPU's.
# The inline step compiles the same way on both devices.

# %%
host_run = results.load(f"{RESULTS}/host_cost_cpu.json", "host_cost")
print(*wrap_lines("host_cost file: " + perf.machine_line(host_run)), sep="\n")
display(model_step.host_cost_table(host_run))
print(*wrap_lines("\n".join(model_step.host_cost_claims(host_run))), sep="\n")

# %% [markdown]
# The inline step leaves a step with about as much Python work as torchao's, a few
# dozen calls more than bf16's compiled step. The custom ops make several times that, because
# each of the two ops quantizes through Python. The ATen count says where the GEMM runs.
# For bf16 and both inline steps, inductor lowers it into its own kernels and an fp32 GEMM
# (on the CPU the FP8 GEMM is `numerics.tensorwise_fp8_mm`, the FP8 GEMM's definition on
# torch's fp32 GEMM). torchao calls torch's `_scaled_mm`, which dispatches about a hundred
# operators of its own on the CPU and, on a CPU without an FP8 kernel in oneDNN (this
# file's machine), runs oneDNN's reference matmul: hence its wall time here, which says
# nothing about torchao on a GPU. On the H100 above, the fewer Python calls became less
# host time per step and a faster whole model.

# %% [markdown]
# ## 6. Do the recipes train as well as bf16?
#
# The loss study (`benchmarks/loss_study.py`) trains one small transformer from the same
# initial weights on the same batches with bf16 and with every recipe, eagerly, and stores
# each step's loss. The data is an order-1 Markov chain, so its entropy rate is the lowest
# loss any model can reach. Two runs: a small model on this 2-core CPU and a larger one on
# the H200 (each file's setup is printed below). The curves are running means over 20
# steps; the table compares the mean of the last 20 losses with bf16's. The wall times are
# eager steps with emulated kernels on the CPU: they are not the speeds of section 4.

# %%
losses = {device: results.load(f"{RESULTS}/loss_curves_{device}.json", "loss_study")
          for device in ("cpu", "cuda")}
for study in losses.values():
    print(*wrap_lines("file: " + perf.machine_line(study)), sep="\n")
    print(*wrap_lines("\n".join(training.loss_file_contents(study))), sep="\n")
training.plot_loss_studies([losses["cpu"], losses["cuda"]])
plt.show()
display(*(training.final_loss_table(study) for study in losses.values()))
print(*wrap_lines("\n".join(training.loss_claim(study) for study in losses.values())), sep="\n")

# %% [markdown]
# **Reading.** Every recipe follows bf16's curve on both machines: on the left the five
# curves lie on one another (NVFP4's, drawn last, hides the rest). Over the last 20 steps
# the FP8 recipes and MXFP8 end within 0.0013 nats of bf16 on the CPU and 0.0002 on the
# H200; NVFP4, with 4-bit values, is the furthest, 0.0041 and 0.0017 nats above (on the
# CPU it ran up to 0.012 above in the first 100 steps). Those gaps are at most 1.5% of the
# distance every recipe still has to the entropy rate (0.27 and 0.14 nats), so at these
# sizes and step counts no recipe trains measurably worse than bf16; the study does not
# say how the gaps grow over a long run.
#
# ## What remains open
#
# - **TensorRT.** The H200 box has no TensorRT or torch-tensorrt, so no TensorRT engine was
#   built or timed; ONNX Runtime (CPU) is the engine the tests run, and inductor is the
#   compiler whose bandwidth is measured above.
# - **Block-scaled GEMMs.** In section 3's run, MXFP8, FP8 blockwise and NVFP4 GEMMs were
#   emulated; section 4's run has the native FP8 blockwise GEMM. MXFP8 and NVFP4 GEMMs need
#   Blackwell hardware, which was not available: on Hopper they stay emulated.
# - **A Triton miscompile, fenced off.** Without an explicit clamp before the FP8
#   conversion, the kernels that store one cast tile both as it is and transposed wrote
#   wrong transposed bytes from fp32 inputs on the H200 (bf16 was right). Those kernels
#   keep the clamp for every input but bf16, and the stored `gpu_check` run (printed in
#   section 3) finds every case equal with it. A newer Triton may not need the clamp; that
#   was not tried.
# - **The whole model in the default mode** (section 5): the custom-op Linear is
#   host-bound at 2048 tokens; the inline step, checked and timed on an H100, takes
#   fp8_current to torchao's speed. On the H200 the inline step was checked
#   (`gpu_check_inline_cuda_h200.json`: every Linear equal to the custom ops byte for byte,
#   no zero gradient, every per-use case equal) but not timed in the whole model. Not run:
#   TransformerEngine after the fast-path change, the 8B-width
#   8192-token and 1B-width cases, the CUDA-graph mode of this model, and where
#   fp8_block's remaining host time goes.
# - **Training-step targets.** Section 4 lists the ones this run missed. All are at the
#   small size except the FP8 forward. In the default mode the small step is bound by the
#   host: custom ops with Python implementations (the design this collection studies, as
#   TransformerEngine's torch.compile path uses them) cost about 0.7 ms of host time each
#   here. Run as one CUDA graph the host is out of the way, and fp8_current meets its aim.
#   What is left is GPU time, and the bounds table says how much of it faster kernels
#   could win:
#   - NVFP4's 0.75x at the small size is above its bound (0.685x in the bounds run): the
#     emulated GEMMs alone take longer than the whole step may. A GEMM that reads the FP4
#     operands itself, or Blackwell's FP4 GEMM, would move that bound.
#   - fp8_block's 1.2x is met as one graph (1.233x) and missed with `reduce-overhead`
#     (1.180x); the bounds run puts its step at its bound (1.236x of 1.239x), and its wgrad
#     GEMM, with 1 x 128 scales on both operands, is the part of that bound inside cuBLASLt.
#   - The GPU runs these steps at its power cap (the clock table above), so a ratio near
#     its aim can fall either side of it from run to run.
# - **The FP8 forward against raw `_scaled_mm`** misses its aims (0.90, and 0.95 with a
#   cached weight) by a margin no quantizer can close on this machine: the bounds run puts
#   both aims above the ratio that quantizing the inputs with ONE read at copy speed would
#   allow (0.894 and 0.944), and the forwards at 99-100% of current scaling's own two-read
#   bound. Even TransformerEngine's delayed scaling, whose cast needs no amax pass first,
#   reads its input once.
# - **Complex side.** Both aims are met in this run: the lowered RoPE compiled without
#   freezing is 1.000-1.003 of the hand-written one-graph version (0.99 aimed), and the
#   mid-size Llama 4 through `compile(backend="inductor")` is 1.039-1.042 of `torch.compile`
#   (1.0 aimed; A/A control 1.005). One run each; the previous stored runs, timed with
#   samples started on an idle device, gave 0.985 and 0.976.
# - **Noise.** The ratios carry the spread of their run: the two hand-written RoPE
#   variants differ by 0.010 of the clone, the Llama 4 A/A control is 1.005, and the
#   small-size `reduce-overhead` ratios move with the host's speed between machines.
#   A tighter claim needs hardware counters (ncu) rather than more repeats.
# - **Versions.** The GPU figures were measured with torch 2.11 (the box's version), the CPU
#   ones with torch 2.14.1.
