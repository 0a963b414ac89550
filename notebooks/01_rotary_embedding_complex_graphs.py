# %% [markdown]
# # 01 · Rotary embeddings as complex graphs, and how to lower them to real arithmetic
#
# **Question.** Llama-style rotary position embeddings (RoPE) are written with complex
# numbers: `torch.polar`, `view_as_complex`, a complex multiply, `view_as_real`. What do
# they become in an exported ATen graph, why can an engine without complex dtypes
# (TensorRT; here ONNX Runtime, its CPU stand-in) not run that graph, and how is it
# lowered to real arithmetic on a trailing `[..., 2]` dimension without changing the
# numbers or the way the model is called?
#
# Everything below runs on a CPU with the models of `tetrt_support.zoo`: a Llama-style
# RoPE module, an attention block, HF rotate-half RoPE, and Hugging Face's own Llama 4
# text model from a tiny config with random weights.

# %%
from tetrt_support.notebook import setup; setup()

import matplotlib.pyplot as plt
import torch
from IPython.display import display

from tetrt_support import optional, zoo
from tetrt_support.complex import RULES, lower
from tetrt_support.report import complex_graphs as graphs
from tetrt_support.report import collapsed, perf, results
from tetrt_support.report.compare import max_abs_error

print(optional.availability_line())


# %% [markdown]
# **Abstract.** The answer, its figures computed by the cell below (the zoo's RoPE module
# lowered both ways, and the stored lowering benchmark), and where each part is:

# %%
from tetrt_support.report import abstract

abstract.show("01", **abstract.figures_01("../benchmarks/results/lowering.json"))

# %% [markdown]
# ## 1. The math: RoPE rotates feature pairs, and complex numbers say so in one multiply
#
# RoPE reads the features of a query (or key) at position $p$ as pairs
# $(x_{2i}, x_{2i+1})$, i.e. complex numbers $z_i = x_{2i} + \mathrm{i}\,x_{2i+1}$, and
# rotates pair $i$ by the angle $p\,\theta_i$ with $\theta_i = \text{base}^{-2i/d}$:
#
# $$z_i \;\mapsto\; z_i\, e^{\mathrm{i} p \theta_i}.$$
#
# Llama precomputes $e^{\mathrm{i} p \theta_i}$ once with `torch.polar` (`freqs_cis`). A
# rotation keeps norms, and the score of a rotated query at position $m$ with a rotated
# key at $n$ depends only on $m-n$. The plot follows the unit vector $(1, 0)$ of four
# pairs through 32 positions, as computed by the zoo's `ComplexRoPE` module itself.

# %%
rope = zoo.ComplexRoPE(head_dim=16, max_seq_len=32)
traces = graphs.rope_rotation_traces(rope, pairs=[0, 1, 3, 7], positions=32)
fig, ax = plt.subplots(figsize=(5.4, 4.2))  # the legend goes to its right
for t in traces:
    ax.plot(t.x, t.y, "o-", ms=3, lw=0.8, label=f"pair {t.pair}: {t.frequency:.2g} rad/pos")
ax.set_aspect("equal"); ax.set_xlabel("x[2i] (unitless)"); ax.set_ylabel("x[2i+1] (unitless)")
ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), title="turn per position")
ax.set_title("RoPE: where (1, 0) goes at positions 0..31")
plt.show()
inv_freq = zoo.rope_inverse_frequencies(16)
print("every point on the unit circle:",
      all(torch.allclose(t.x**2 + t.y**2, torch.ones(32)) for t in traces))
print("pair i turns by theta_i per position:",
      all(abs(t.frequency - inv_freq[t.pair].item()) < 1e-5 for t in traces))
print("score depends only on m - n (spread < 1e-4):",
      graphs.relative_position_invariance(rope, positions=32) < 1e-4)

# %% [markdown]
# ## 2. The exported ATen graph holds complex nodes
#
# `torch.export.export(..., strict=False)` of the RoPE module (q, k of shape
# `[batch=2, seq=8, heads=4, head_dim=16]`). The non-persistent `freqs_cis` buffer becomes
# a complex64 constant of the program; it is sliced to the sequence length, and each of q
# and k goes through `view_as_complex` → complex `mul` → `view_as_real`.

# %%
rope_model = zoo.build_model("complex_rope")
rope_ep, rope_args, rope_kwargs = zoo.export_model("complex_rope", model=rope_model)
print("complex constants:",
      {k: (str(v.dtype), list(v.shape)) for k, v in rope_ep.constants.items()})
graphs.complex_node_table(rope_ep)

# %% [markdown]
# ## 3. What an engine without complex dtypes says
#
# ONNX Runtime has no complex arithmetic, like TensorRT. Exporting this program to ONNX
# (`torch.onnx.export(..., dynamo=True)`, onnxscript's torchlib) fails at the first
# complex op it has no translation for: the `unsqueeze` of the complex `freqs_cis` slice.

# %% tags=["raises-exception"]
torch.onnx.export(rope_ep, rope_args, kwargs=rope_kwargs, dynamo=True, verbose=False)

# %% [markdown]
# ## 4. The mechanism: one rule per op, on a packed `[..., 2]` layout
#
# `tetrt_support.complex.lower` carries every complex tensor of shape `S` as a real tensor
# of shape `S + [2]` (what `view_as_real` returns) and rewrites each complex op with a rule
# from one table. Views shift their dims (a negative dim `d` becomes `d - 1`), elementwise
# ops become real formulas, `mm`/`bmm`/`matmul` become four real products. The table (closed; its line opens it):

# %%
rules = graphs.rule_table(RULES)
print(f"{len(RULES)} ATen ops have a rule, in {len(rules.rows)} rule functions")
collapsed(rules, f"The rule table: {len(rules.rows)} rules and the ATen ops each lowers")

# %% [markdown]
# What two rules emit, on one-op programs (real `[..., 2]` in and out, as in RoPE). A
# complex multiply $(a_r + \mathrm{i} a_i)(b_r + \mathrm{i} b_i)$ becomes selects of the
# real and imaginary planes, four real multiplies, a subtract, an add, and a `stack` that
# packs the result; `polar(abs, angle)` becomes `abs·cos(angle)` and `abs·sin(angle)`,
# stacked. `view_as_complex` and `view_as_real` become nothing at all: the packed layout
# IS the real view.

# %%
def complex_mul(x, y):
    return torch.view_as_real(torch.view_as_complex(x) * torch.view_as_complex(y))

def polar(magnitude, angle):
    return torch.view_as_real(torch.polar(magnitude, angle))

for fn, inputs in ((complex_mul, (torch.randn(2, 3, 2), torch.randn(2, 3, 2))),
                   (polar, (torch.rand(2, 3), torch.randn(2, 3)))):
    lowered = lower(graphs.one_op_program(fn, *inputs), strategy="rewrite")
    print(f"{fn.__name__}:\n  " + "\n  ".join(graphs.lowered_aten_lines(lowered)))

# %% [markdown]
# ## 5. Two strategies, side by side
#
# Torch-TensorRT lowers complex graphs in two ways, and so does `lower`, over the same rules:
#
# - `strategy="rewrite"` edits the exported graph in place (replace complex constants by
#   their `view_as_real`, then rewrite each complex node with its rule);
# - `strategy="retrace"` runs the graph in an `fx.Interpreter` under `make_fx`, carrying
#   complex values as packed real tensors and applying the rule per op, and records a
#   new graph.
#
# Both must return a graph without complex values that is called like `ep.module()` and
# gives the eager numbers. One column per graph below; timings are not stable outputs, the
# benchmark in section 10 measures them.

# %%
strategies = [graphs.tetrt_strategy("rewrite"), graphs.tetrt_strategy("retrace")]
with torch.no_grad():
    rope_eager = rope_model(*rope_args, **rope_kwargs)
rope_reports = graphs.compare_strategies(rope_ep, rope_args, rope_kwargs, strategies,
                                         reference=rope_eager)
graphs.strategy_table(rope_ep, rope_reports).transposed(corner="")

# %% [markdown]
# What each leaves behind, op by op (the complex ops all disappear; real selects, stacks
# and arithmetic take their place):

# %%
histograms = ({"exported": graphs.op_histogram(rope_ep)}
              | {r.strategy: graphs.op_histogram(r.graph) for r in rope_reports})
graphs.histogram_table(histograms)

# %% [markdown]
# Dynamic shapes survive: exported with a dynamic batch and sequence
# (`Dim("batch")`, `Dim("seq")`), the lowered attention block (keyword `attention_mask`)
# runs at sizes it was never traced with, because no rule reads a concrete size.

# %%
attn = zoo.build_model("rope_attention")
attn_ep, _, _ = zoo.export_model("rope_attention", model=attn, dynamic=True)
for strategy in ("rewrite", "retrace"):
    attn_gm = lower(attn_ep, strategy=strategy)
    for batch, seq in ((1, 5), (3, 11), (2, 40)):
        (hidden,), kw = zoo.example_inputs("rope_attention", attn, batch=batch, seq=seq, seed=batch)
        with torch.no_grad():
            error = max_abs_error(attn(hidden, **kw),
                                  attn_gm(hidden, attention_mask=kw["attention_mask"]))
        print(f"{strategy}: batch={batch} seq={seq:>2}  max abs error < 1e-5: {error < 1e-5}")

# %% [markdown]
# ## 6. The lowered graph runs where the complex one could not
#
# The same program, compiled by `tetrt_support.compile` with ONNX Runtime as the engine:
# lowered, partitioned, the engine block exported to ONNX and run by ONNX Runtime on the
# CPU. What depends on the frequency buffer alone is folded first (its real and
# imaginary planes, computed once and stored contiguous), so the engine block holds only
# the arithmetic on q and k. Whatever the engine does not take runs in PyTorch fallback
# blocks; the lines below list their ops, so nothing is hidden.

# %%
import tetrt_support

for strategy in ("rewrite", "retrace"):
    compiled = tetrt_support.compile(rope_ep, backend="onnxruntime", strategy=strategy)
    with torch.no_grad():
        out = compiled(*rope_args, **rope_kwargs)
    print(f"{strategy}: {compiled.blocks_summary()}; "
          f"max abs error < 1e-5: {max_abs_error(rope_eager, out) < 1e-5}")
    for block in compiled.blocks():
        print(f"  {block.name} ({block.runner}): {len(block.ops)} ops; "
              f"complex ops: {any('complex' in op or 'polar' in op for op in block.ops)}"
              + ("" if block.kind == "engine" else f"; {sorted(set(block.ops))}"))

# %% [markdown]
# ## 7. The same on Hugging Face's Llama 4
#
# `Llama4ForCausalLM` from `transformers`, built from a tiny `Llama4TextConfig` (hidden 64,
# 4 heads, 2 KV heads, head_dim 16, vocab 128, 2 layers, random weights, nothing
# downloaded), exported with the keyword input `input_ids`. Its rotary embedding builds
# `freqs_cis` with `torch.polar` in forward and casts it with `.to(complex64)`.

# %%
llama = zoo.tiny_llama4(num_layers=2, with_moe=False, seed=0)
llama_ep, llama_args, llama_kwargs = zoo.export_llama4(llama, batch=2, seq=8)
llama_hist = graphs.op_histogram(llama_ep)
print({op: llama_hist[op] for op in ("aten.polar.default", "aten.view_as_complex.default",
                                     "aten.view_as_real.default")})
print("complex-valued nodes:", len(graphs.complex_valued_nodes(llama_ep)))
llama_nodes = graphs.complex_node_table(llama_ep)
print(f"first 9 of the {len(llama_nodes.rows)} nodes that produce or read complex values:")
llama_nodes.head(9)

# %% [markdown]
# Both strategies on the whole model; the lowered modules are called with `input_ids=` and
# return the same `ModelOutput` type with the eager logits:

# %%
with torch.no_grad():
    llama_eager = llama(**llama_kwargs)
llama_reports = graphs.compare_strategies(llama_ep, llama_args, llama_kwargs, strategies,
                                          reference=llama_eager)
display(graphs.strategy_table(llama_ep, llama_reports).transposed(corner=""))
for r in llama_reports:
    with torch.no_grad():
        out = r.graph(input_ids=llama_kwargs["input_ids"])
    print(f"{r.strategy}: returns {type(out).__name__}; logits match eager (atol 1e-5): "
          f"{torch.allclose(out.logits, llama_eager.logits, atol=1e-5)}")

# %% [markdown]
# ## 8. The contrast: rotate-half RoPE has nothing to lower
#
# Llama 1–3 in `transformers` write the same rotation with real `cos`/`sin` tables and
# `rotate_half` on the two halves of the head dim. Its graph has no complex node at all,
# and it computes the same numbers as the complex version once the head dim is permuted
# from interleaved pairs `(0,1),(2,3),…` to halves `[0,2,4,…|1,3,5,…]`:

# %%
half_model = zoo.build_model("rotate_half_rope")
half_ep, _, _ = zoo.export_model("rotate_half_rope", model=half_model)
print("complex nodes in the rotate-half graph:", len(graphs.complex_node_table(half_ep).rows))
display(graphs.histogram_table({"count in the rotate-half graph": graphs.op_histogram(half_ep)}))
q, k = rope_args
with torch.no_grad():
    half_q, half_k = half_model(zoo.interleaved_to_half(q), zoo.interleaved_to_half(k))
print("complex RoPE == rotate-half RoPE after the permutation (max abs error < 1e-5):",
      max_abs_error((zoo.interleaved_to_half(rope_eager[0]),
                     zoo.interleaved_to_half(rope_eager[1])), (half_q, half_k)) < 1e-5)

# %% [markdown]
# ## 9. torch's own pass: `decompose_complex_in_graph`
#
# torch ≥ 2.14 ships `torch._functorch._aot_autograd.complex_decomposition.decompose_complex_in_graph(gm, flat_args)`:
# an `fx.Interpreter` run under `make_fx` that wraps complex tensors in a `ComplexTensor`
# subclass. It is built for AOTAutograd's functionalized graphs; applied to `ep.module()`
# (after dropping export's `_assert_tensor_metadata` checks, which `ComplexTensor` has no
# rule for), it computes the right numbers, but it leaves complex constants,
# `view_as_complex` and `polar` in the graph, and the result takes flat positional inputs.

# %%
if graphs.torch_decompose_available():
    models = {"complex_rope": (rope_ep, rope_args, rope_kwargs, rope_eager),
              "llama4": (llama_ep, llama_args, llama_kwargs, llama_eager)}
    for label, (ep, args, kwargs, eager) in models.items():
        (report,) = graphs.compare_strategies(ep, args, kwargs, [graphs.TORCH_DECOMPOSE],
                                              reference=eager)
        print(label); display(graphs.strategy_table(ep, [report]).transposed(corner=""))
        out = report.graph(*torch.utils._pytree.tree_leaves((args, kwargs)))
        print(f"called with flat inputs; returns {type(out).__name__} "
              f"where the model returns {type(eager).__name__}\n")
else:
    print(f"torch {torch.__version__} has no decompose_complex_in_graph (torch >= 2.14): "
          "comparison skipped")

# %% [markdown]
# ## 10. Lowering time against model size (stored benchmark)
#
# `python -m benchmarks.perf --suites lowering` lowers tiny Llama 4 models of 2 to 32
# layers with each strategy (median of a few repeats) and writes
# `benchmarks/results/lowering.json`. The
# plot and the lines below read that file: they are the measured figures of one run, not
# re-measured here.

# %%
bench = results.load("../benchmarks/results/lowering.json", "lowering")
fig, ax = plt.subplots()
for name, (layers, seconds) in perf.lowering_curves(bench).items():
    ax.plot(layers, seconds, "o-", label=name)
ax.set_xlabel("decoder layers"); ax.set_ylabel("lowering time, median (s)")
ax.legend(title="strategy")
ax.set_title("Lowering time, tiny Llama 4")
plt.show()
print("\n".join(perf.lowering_claims(bench)))

# %% [markdown]
# ## What remains open
#
# - **Ops without a rule.** Anything outside the table (`torch.linalg.eig`, FFTs, complex
#   `scaled_dot_product_attention`, …) raises `UnsupportedComplexOp` naming the op and the
#   source line, or with `unsupported="fallback"` stays a complex island that a PyTorch
#   fallback block runs: correct, but no longer one engine.
# - **Precision.** Lowered RoPE agrees with eager to float32 rounding here; bf16/fp16
#   models, where `freqs_cis` is complex64 but activations are not, are not covered.
# - **Speed.** Lowering exists so that an engine without complex dtypes can run the
#   graph at all; on this CPU it is not a speed-up. In the stored run (section 10) the
#   lowered RoPE takes ~28x complex eager's time in eager PyTorch (many small strided
#   kernels instead of one complex multiply) and ~3x under inductor. On an H200 the
#   lowered graph under torch.compile reaches 96-97% of a clone's bandwidth, where complex
#   RoPE stays at 84-86% (notebook 05, from the stored H200 run); TensorRT itself was not
#   run anywhere.
# - **torch's pass** leaves complex nodes and drops the pytree signature when applied to
#   an exported program; bridging it to `torch.export` is future work upstream.
