# %% [markdown]
# # 05 · Performance on a 2-core CPU and on an H200
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
# python -m benchmarks.perf --suites lowering                            # results/lowering.json (lowering time)
# python -m benchmarks.perf --device cuda --suites train_step --modes default,reduce-overhead --profile prof \
#     --profile-variant fp8_current,fp8_block@16384x8192x8192,nvfp4@16384x8192x8192
#                                                                        # results/train_step_cuda.json
# python -m benchmarks.perf --device cuda --suites llama4                # results/llama4_cuda.json
# python -m benchmarks.perf --device cuda --suites loss_study            # results/loss_curves_cuda.json
# python -m benchmarks.perf --device cpu --suites loss_study             # results/loss_curves_cpu.json
# ```
#
# Every figure below is a median; every claim is a **ratio of two figures from one
# run** — absolute times on shared machines do not compare across runs. TensorRT and
# TransformerEngine were not run anywhere: the H200 box has neither.

# %%
from tetrt_support.notebook import setup, wrap_lines; setup()

import matplotlib.pyplot as plt
from IPython.display import display

from tetrt_support import optional
from tetrt_support.report import perf, results, training

RESULTS = "../benchmarks/results"
cuda = results.load(f"{RESULTS}/perf_cuda.json", "perf")
cpu = results.load(f"{RESULTS}/perf_cpu.json", "perf")
print(*wrap_lines("GPU file: " + perf.machine_line(cuda)), sep="\n")
print(*wrap_lines("CPU file: " + perf.machine_line(cpu)), sep="\n")
print(optional.availability_line())

# %% [markdown]
# ## 1. RoPE against the roofline (H200)
#
# Llama RoPE on q and k of shape `[8, 4096, 32, 128]` fp32 reads 1 GiB and writes 1 GiB:
# it is purely memory-bound, so the practical roofline is a `clone` of the same bytes.
# The variants: the complex original (eager and `torch.compile`), the lowered graph of
# both strategies (eager and compiled; "frozen" adds inductor's inference freezing, which
# folds the packed `[..., 2]` frequency buffer into contiguous real and imaginary
# planes, as an engine build folds constants; "folded" runs the same folding as a lowering
# pass instead, `tetrt_support.compiler.fold_constants`, and compiles without freezing),
# and a hand-written real RoPE compiled as two graphs (q, k separately) or one. Variants
# are timed round-robin, so drift hits all of them alike.

# %%
perf.rope_table(cuda)

# %%
names, fractions = perf.bandwidth_series(cuda)
fig, ax = plt.subplots(figsize=(7.5, 3.6))
ax.barh(names, fractions, color=["tab:gray" if n == "clone" else "tab:blue" if n.startswith("lowered") else "tab:orange" for n in names])
ax.axvline(perf.ROPE_TARGET, color="k", linestyle="--", linewidth=1)
ax.set_xlabel("fraction of a clone's bandwidth (H200)")
ax.set_title(f"dashed: target {perf.ROPE_TARGET}; blue: lowered; orange: reference", fontsize=9)
ax.invert_yaxis()
plt.tight_layout()
plt.show()
print("\n".join(perf.rope_claims(cuda)))

# %% [markdown]
# **Reading.** Compiled as it comes out of the lowering, the lowered graph reaches 0.92 of
# the clone, 0.91 of the hand-written one-graph version. In an earlier probe run on the same
# box (`TORCH_LOGS=output_code`; the log is not stored here), inductor emitted one fused
# kernel for it with the same loads and stores as for the hand-written version except one:
# the frequencies were read interleaved from the packed buffer instead of from separate
# cos/sin planes. Folding them into contiguous planes closes the gap, whether inductor's
# freezing does it (0.98 and 0.99 of the clone) or the lowering pass does: 0.985 and 0.978
# of the one-graph version, against the 0.99 aim: just short of it in this run, and within
# its noise (the two hand-written variants, the same arithmetic, differ by 0.048 of the
# clone), so one run can say neither "met" nor "missed" with confidence. Torch-TensorRT runs constant folding among its
# post-lowering passes; the compile pipeline here does not yet, because its refit replaces
# weights by name and a value folded from a buffer would keep the old one
# (`compiler/constant_folding.py` says so). The complex original, compiled or not, stays
# near 85%: inductor does not generate code for complex ops and falls back to eager
# kernels. Eager lowered code is slow (each real op is its own kernel and its own pass over
# the data): lowering is meant to be compiled.

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
# variant's). The errors are the largest logit error relative to the largest logit,
# against eager bf16 and against an fp32 run of the same weights.

# %%
import pathlib

llama4_path = pathlib.Path(RESULTS) / "llama4_cuda.json"
if llama4_path.exists():
    llama4 = results.load(llama4_path, "llama4")
    print(*wrap_lines(perf.machine_line(llama4)), sep="\n")
    display(perf.llama4_table(llama4))
    print(*wrap_lines("\n".join(perf.llama4_claims(llama4))), sep="\n")
else:
    print("No stored run: `python -m benchmarks.perf --device cuda --suites llama4` writes results/llama4_cuda.json.")

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
# the CPU reference by `scripts/gpu_check.py` on the same H200 (230 of 230 cases equal), and
# the FP8 GEMM writes bf16 directly. MXFP8 and NVFP4 have no tensor-core GEMM on Hopper:
# here they are emulated: each operand is dequantized into bf16 (which holds its values
# exactly) by a Triton kernel and multiplied by cuBLAS's bf16 GEMM.

# %%
perf.linear_table(cuda)

# %%
names, tflops = perf.tflops_series(cuda)
fig, ax = plt.subplots(figsize=(7.5, 3.8))
ax.barh(names, tflops, color=["tab:green" if "fp8" in n else "tab:gray" if "bf16" in n else "tab:purple" for n in names])
ax.set_xscale("log")
ax.set_xlabel("TFLOP/s (H200, log scale)")
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
# in one process, once with the default compile mode and once with `reduce-overhead` (CUDA
# graphs, every variant alike). The code that ran is this notebook's commit: the Triton
# quantization kernels, NVFP4's column-wise Hadamard transform fused with its transpose, and
# the native blockwise GEMM.

# %%
steps = results.load(f"{RESULTS}/train_step_cuda.json", "train_step")
print(*wrap_lines("file: " + perf.machine_line(steps)), sep="\n")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
for ax, suite in zip(axes, ("train_step", "train_step_reduce-overhead")):
    training.plot_step_speedups(ax, steps, suite)
fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=5, fontsize=9)
fig.suptitle("speedup over bf16 (H200); black ticks: targets; dotted: bf16", fontsize=10)
plt.tight_layout(rect=(0, 0.06, 1, 1))
plt.show()
display(training.step_table(steps), training.step_table(steps, "train_step_reduce-overhead"))

# %% [markdown]
# **Targets.** The ratios this work set out to reach, judged on this one run (default
# compile mode; the CUDA-graph figure beside it), and the FP8 forward against raw
# `torch._scaled_mm` on operands quantized beforehand:

# %%
display(training.step_target_table(steps), training.forward_table(steps))
print("\n".join(training.missed_targets(steps)))

# %% [markdown]
# **Where the time goes.** Kernel profiles of three steps from the same run (the torch
# profiler over 5 steps, per step; the host time is of steps issued back to back), then the
# host's side of the fp8_current step at the small size, layer by layer
# (`benchmarks/host_breakdown.py`: each callable issued back to back, device waits left
# out, so each row is what the host spends to issue it):

# %%
display(*(training.profile_table(steps, key) for key in steps["suites"]["profiles"]))
display(training.host_breakdown_table(steps))

# %% [markdown]
# **Reading.** At the large size, fp8_current is 1.596x bf16 in the default mode, just
# under the 1.6x line, and 1.58x with CUDA graphs, ahead of torchao (1.06x and 1.09x
# its speed; the target table). fp8_block, on the native blockwise GEMM, is 1.27x (1.25x
# with CUDA graphs): its quantization kernel writes the scales straight into
# TransformerEngine's GEMM-ready buffers and the GEMM reads them as views, so its profile
# holds the three GEMMs (5.50 ms) and the quantization kernel (0.66 ms for three calls) and
# nothing else of note. MXFP8 and NVFP4, emulated, are 0.93x and 0.79x. Of NVFP4's 11.6 ms of
# kernels the three emulated GEMMs (bf16 operands, fp32 results) take 8.1 ms; its
# multiply-and-cast pass forms the per-tensor factors from the two global amaxes itself,
# and scale buffers that need no padding are kept as the kernel wrote them, so what is left
# besides its own kernels is 5 zero fills, 2 seed draws, 3 memsets and one copy per step
# (the one-element torch ops that formed the factors were 51 kernels per step). The
# column-wise Hadamard transform is two calls of 0.13 ms, and stochastic rounding makes its
# Philox draws in the quantization kernel. At the small size every recipe of this project is
# bound by the host in the default mode: the fp8_current profile shows 0.74 ms of kernels
# under 3.2 ms of host time (this host was slow: the breakdown's rows are 1.5-1.8x the
# previous run's). The breakdown says where that goes: each custom op costs 0.8-0.9 ms of
# host time here when called directly, two quantizes and the GEMM most of the forward's.
# torchao's float8 is traced into inductor's own kernels instead, and bf16 issues three
# GEMMs. CUDA graphs remove the host from the step: there fp8_current is 1.36x bf16 at the
# small size (the previous run of the same fp8_current code gave 1.26x: the 1.35x line is
# within the spread between machines) and ahead of torchao at both sizes.

# %% [markdown]
# ## 5. Do the recipes train like bf16? A loss study
#
# A small decoder-only transformer learns a synthetic language (sequences from a fixed
# random order-1 Markov chain with 8 likely successors per token, so the lowest reachable
# loss is the chain's entropy rate). Every recipe starts from the same weights and sees the
# same batches; every `Linear` of the blocks is this project's quantized Linear with that
# recipe, while embeddings, norms, attention and the head stay bf16. TransformerEngine
# cannot run MXFP8 or NVFP4 on Hopper at all: here they run emulated. The curves are running
# means over 20 steps; the right panels show each recipe's distance to bf16.
#
# The CPU study (bottom) is a different, much smaller experiment run on this 2-core machine:
# the model is shrunk until all five recipes train in minutes, and the per-tensor FP8 GEMM
# (`torch._scaled_mm` on a CPU) is by far its slowest part. Compare recipes within a study,
# not the two studies with each other.

# %%
loss_gpu = results.load(f"{RESULTS}/loss_curves_cuda.json", "loss_study")
loss_cpu = results.load(f"{RESULTS}/loss_curves_cpu.json", "loss_study")
for name, study in (("H200", loss_gpu), ("CPU", loss_cpu)):
    print(*wrap_lines(f"{name} file: {perf.machine_line(study)}"), sep="\n")
    print(*wrap_lines("; ".join(training.loss_file_contents(study))), sep="\n")

# %%
fig, axes = plt.subplots(2, 2, figsize=(10, 7))
training.plot_loss_study(axes[0], loss_gpu)
training.plot_loss_study(axes[1], loss_cpu)
fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=5, fontsize=9)
plt.tight_layout(rect=(0, 0.04, 1, 1))
plt.show()
display(training.final_loss_table(loss_gpu), training.final_loss_table(loss_cpu))
print("\n".join(training.loss_claim(study) for study in (loss_gpu, loss_cpu)))

# %% [markdown]
# **Reading.** On this task every recipe tracks bf16 closely, in both studies: the lines
# above give the largest gap. The task is easy: a harder one (a larger vocabulary, a longer
# run) would separate the recipes more. The wall times are of an eager training loop and say
# nothing about kernel speed (section 4 does); on the CPU they mostly measure how slow
# `torch._scaled_mm` and the reference quantizers are there.

# %% [markdown]
# ## 6. The same on this 2-core CPU
#
# Smaller sizes, a loaded shared machine, two threads. The picture is different: the CPU
# is not memory-bound at these sizes, inductor's C++ code for the lowered graph is slower
# than ATen's complex kernels, and lowering is no speed-up here (notebook 01 says so too).
# No targets apply to the CPU.

# %%
display(perf.rope_table(cpu), perf.attention_table(cpu), perf.linear_table(cpu))
print(*wrap_lines("\n".join(perf.target_claims(cpu))), sep="\n")

# %% [markdown]
# ## 7. Lowering time against graph size (CPU)
#
# HF Llama 4 with 2 to 32 layers, lowered by both strategies and by torch's own
# `decompose_complex_in_graph` (stored by `python -m benchmarks.perf --suites lowering`;
# notebook 01 shows the same file).

# %%
bench = results.load(f"{RESULTS}/lowering.json", "lowering")
fig, ax = plt.subplots(figsize=(6.5, 3.4))
for name, (layers, seconds) in perf.lowering_curves(bench).items():
    ax.plot(layers, seconds, marker="o", label=name)
ax.set_xlabel("decoder layers")
ax.set_ylabel("lowering time (s)")
ax.legend()
plt.tight_layout()
plt.show()
print("\n".join(perf.lowering_claims(bench)[:9]))

# %% [markdown]
# ## What remains open
#
# - **TensorRT.** The H200 box has no TensorRT or torch-tensorrt, so no TensorRT engine was
#   built or timed; ONNX Runtime (CPU) is the engine the tests run, and inductor is the
#   compiler whose bandwidth is measured above.
# - **Block-scaled GEMMs.** In section 3's run, MXFP8, FP8 blockwise and NVFP4 GEMMs were
#   emulated; section 4's run has the native FP8 blockwise GEMM. MXFP8 and NVFP4 GEMMs need
#   Blackwell hardware, which was not available: on Hopper they stay emulated.
# - **Training-step targets.** Section 4 lists the ones this run missed. At the small size
#   the default mode is bound by the host: custom ops with Python implementations (the
#   design this collection studies, as TransformerEngine's torch.compile path uses them)
#   cost 0.5-0.9 ms of host time each; a C++ implementation or a traced quantization (as
#   torchao's) would be needed, not faster kernels. Even then the default mode has a floor:
#   the compiled bf16 step alone takes 0.6-0.9 ms of host time in the stored runs, while
#   1.35x bf16 needs the whole fp8_current step within about 0.8 ms. NVFP4 and MXFP8 stay
#   emulated on Hopper. The FP8 forward against raw `_scaled_mm` misses its aims by the cost
#   of current scaling itself: the input must be read once for its amax before it can be
#   cast. At the bandwidths `scripts/gpu_check.py` measured (amax 3.5 TB/s, cast 3.4 TB/s),
#   quantizing an 8192^2 bf16 operand takes at least about 97 us, against 855 us for the
#   GEMM: at best 0.82 of `_scaled_mm` with both operands quantized and 0.90 with a cached
#   weight, under the 0.90 and 0.95 aims.
# - **Complex side at full speed.** Compiled without freezing, the lowered RoPE reaches
#   0.91 of the hand-written one-graph version, and 0.98 after the constant-folding pass
#   (section 1's lines; the aim is 0.99, within this run's noise); the compile pipeline
#   does not run that pass until its refit can recompute folded values. The mid-size Llama 4 through
#   `compile(backend="inductor")` is 0.976 of `torch.compile`'s speed in the stored run
#   (section 2's lines): close to, but not, the aim of 1.0.
# - **Noise.** The RoPE target sits within the run-to-run spread of identical kernels
#   (about 5% here); a tighter claim needs hardware counters (ncu) rather than more
#   repeats, which the device lease did not leave time for.
# - **Versions.** The GPU figures were measured with torch 2.11 (the box's version), the CPU
#   ones with torch 2.14.1.
