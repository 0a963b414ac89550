# %% [markdown]
# # 08 · Torch-TensorRT's calls, on this compiler
#
# **Question.** A Torch-TensorRT user compiles a module with example inputs and a few
# options (`min_block_size`, `torch_executed_ops`, `require_full_compilation`, ...), or
# hands a model to `torch.compile(backend=...)`, saves the result as an `ExportedProgram`
# and refits new weights into it. Do those calls, with Torch-TensorRT's names and
# defaults, work the same here — on the model they care about, HF Llama 4 with complex
# rotary embeddings — and give the eager model's numbers?
#
# Everything below runs on a CPU: ONNX Runtime is the engine that stands where TensorRT
# would (no complex dtypes, dynamic dims, weights baked into its model unless fed as
# inputs).

# %%
from tetrt_support.notebook import setup; setup()

import io

import torch
from IPython.display import display

import tetrt_support
import tetrt_support.compiler  # registers torch.compile's backend "tetrt"
from tetrt_support import optional, zoo
from tetrt_support.report import Table
from tetrt_support.report.compare import max_abs_error

print("torch", torch.__version__.split("+")[0])
print(optional.availability_line())
print("TensorRT was not run here: engine blocks run in ONNX Runtime on the CPU.")

# The model of this notebook: a tiny Llama 4 (random weights, no download), called by keyword.
llama = zoo.tiny_llama4(seed=0).eval()
ids = zoo.llama4_example_inputs(llama, batch=2, seq=8, seed=0)


# %% [markdown]
# **Abstract.** The answer, its figures computed by the cell below (a tiny Llama 4 exported,
# compiled from the program and from the module, each compared with eager: the two compiled
# modules that section 1 shows), and where each part is:

# %%
from tetrt_support.report import abstract

with torch.no_grad():
    eager = llama(**ids)
program = torch.export.export(llama, (), ids, strict=False)
from_program = tetrt_support.compile(program)
from_module = tetrt_support.compile(llama, kwarg_inputs=ids)
abstract.show("08", **abstract.figures_08(eager.logits, [from_program, from_module], ids))

# %% [markdown]
# ## 1. One model, three ways in
#
# `torch_tensorrt.compile(model, arg_inputs=..., kwarg_inputs=...)` exports the module
# itself; so does `tetrt_support.compile`. An `ExportedProgram` is taken as it is, and
# `torch.compile(model, backend="tetrt")` hands over each graph Dynamo captures. The tiny
# Llama 4 (2 layers, random weights, no download) is called by keyword, `input_ids=`.

# %%
# Reused: llama and ids (first cell); eager, from_program and from_module (abstract cell).
torch._dynamo.reset()
with torch.no_grad():
    via_dynamo = torch.compile(llama, backend="tetrt")(**ids)
graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]

def close(logits):
    return max_abs_error(eager.logits, logits) < 1e-5


def blocks_of(compiled):
    return [(b.name, b.kind, b.ops) for b in compiled.blocks()]


dynamo_graphs = f"{graphs} Dynamo graph{'s' if graphs != 1 else ''}, compiled"
rows = [
    ("tetrt_support.compile(ep)", from_program.blocks_summary(), close(from_program(**ids).logits)),
    ("tetrt_support.compile(model, kwarg_inputs=ids)", from_module.blocks_summary(),
     close(from_module(**ids).logits)),
    ('torch.compile(model, backend="tetrt")', dynamo_graphs, close(via_dynamo.logits)),
]
display(Table(rows, ["call", "blocks", "logits within 1e-5 of eager"]))
print("module + example inputs gives the program's blocks:",
      blocks_of(from_program) == blocks_of(from_module))

# %% [markdown]
# ## 2. The options, with Torch-TensorRT's names and defaults
#
# Each option changes where ops run. `min_block_size` (default 5, as in Torch-TensorRT)
# sends an engine block with fewer compute ops to PyTorch; `torch_executed_ops` forces ops
# there; `truncate_double` runs float64 engine inputs as float32. The model: a small real
# region, a complex `cumsum` (no complex rule, so PyTorch), a larger real region.

# %%
class IslandBetween(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        small = torch.relu(x) * 2
        island = torch.cumsum(torch.view_as_complex(small.reshape(x.shape[0], 4, 2)), dim=1)
        return torch.tanh(self.proj(torch.view_as_real(island).reshape(x.shape[0], 8)) + 1).sin()


island, x = IslandBetween().eval(), torch.randn(3, 8)
settings = [
    {"min_block_size": 1},
    {},
    {"min_block_size": 1, "torch_executed_ops": {"torch.ops.aten.tanh.default"}},
    {"min_block_size": 50},
]
rows = []
for options in settings:
    compiled = tetrt_support.compile(island, arg_inputs=(x,), **options)
    kinds = " → ".join(b.kind for b in compiled.blocks())
    spelled = ", ".join(f"{name}={value!r}" for name, value in options.items()) or "(defaults)"
    rows.append((spelled, kinds, max_abs_error(island(x), compiled(x)) < 1e-5))
Table(rows, ["options", "blocks, in call order", "matches eager"])

# %% [markdown]
# `require_full_compilation=True` asks for nothing outside an engine; here that is
# impossible, and the error names the op, its block and its source line:

# %% tags=["raises-exception"]
tetrt_support.compile(island, arg_inputs=(x,), require_full_compilation=True)

# %% [markdown]
# A misspelt option is an error too, not a silently ignored keyword (a `torch.compile`
# user's `options={...}` goes through the same check):

# %% tags=["raises-exception"]
tetrt_support.compile(island, arg_inputs=(x,), min_blok_size=3)

# %% [markdown]
# ## 3. Saved as an `ExportedProgram`, loaded by `torch.export.load`
#
# `tetrt_support.save(compiled, path, output_format="exported_program", kwarg_inputs=...)`
# (the default format, as in `torch_tensorrt.save`) re-exports the compiled module. An
# ONNX Runtime session is not something `torch.export` can trace or store, and this
# package ships no TorchBind engine class with a custom op as Torch-TensorRT does; so the
# saved program keeps each engine block as the real-arithmetic ATen graph the engine was
# built from, with its weights. It loads with plain `torch.export.load` and is called by
# keyword, returning Llama 4's `ModelOutput`.

# %%
buffer = io.BytesIO()
tetrt_support.save(from_module, buffer, kwarg_inputs=ids)
buffer.seek(0)
reloaded = torch.export.load(buffer)
other = zoo.llama4_example_inputs(llama, batch=2, seq=8, seed=1)
out = reloaded.module()(**other)
with torch.no_grad():
    ref = llama(**other)
ops = {str(n.target) for n in reloaded.graph.nodes if n.op == "call_function"}
print(type(reloaded).__name__, "→", type(out).__name__, list(out.keys()))
print("logits within 1e-5 of eager:", max_abs_error(ref.logits, out.logits) < 1e-5)
print("complex ops left in the saved graph:",
      sorted(op for op in ops if "complex" in op or "polar" in op))

# %% [markdown]
# ## 4. Refit: new weights, same engines
#
# `refit_module_weights(compiled, new_weights)` takes a state dict, a module or an
# `ExportedProgram` of the same architecture. The ONNX Runtime block was built with its
# weights as inputs, so a refit replaces tensors and keeps the ONNX model itself; complex
# parameters and buffers are packed as the lowering packed them (`[..., 2]`).

# %%
new_llama = zoo.tiny_llama4(seed=1).eval()
refitted = tetrt_support.refit_module_weights(from_module, new_llama.state_dict())
fresh = tetrt_support.compile(new_llama, kwarg_inputs=ids)
with torch.no_grad():
    new_ref = new_llama(**other)
same_onnx = (refitted.engine_0.engine_block.model_bytes
             == from_module.engine_0.engine_block.model_bytes)
print("blocks:", refitted.blocks_summary(), "| same ONNX model as before the refit:", same_onnx)
print("refitted vs fresh compile of the new weights, max abs error < 1e-6:",
      max_abs_error(fresh(**other).logits, refitted(**other).logits) < 1e-6)
print("refitted vs the new eager model < 1e-5:",
      max_abs_error(new_ref.logits, refitted(**other).logits) < 1e-5)
print("the compiled module itself still has the old weights:",
      max_abs_error(ref.logits, from_module(**other).logits) < 1e-5)

# %% [markdown]
# Torch-TensorRT's own spelling works too: `new_weight_module=`, and `verify_output=True`
# with the inputs to compare the refitted module with the new weights' module on (a
# difference raises `RefitVerificationError` and leaves the compiled module as it was):

# %%
checked = tetrt_support.refit_module_weights(
    compiled_module=from_module, new_weight_module=new_llama,
    kwarg_inputs=other, verify_output=True)
print("verify_output=True passed | refitted vs the new eager model < 1e-5:",
      max_abs_error(new_ref.logits, checked(**other).logits) < 1e-5)

# %% [markdown]
# The compile also folds what depends on weights and constants alone, as Torch-TensorRT's
# `constant_fold` does: RoPE's complex frequencies become two contiguous real planes. A
# refit computes those values again from the new weights (the compiled module keeps the
# constant subgraph it folded). A refit that only replaced the named weights would leave
# the old planes in place and rotate by the old angles, without any error.

# %%
from tetrt_support.compiler.constant_folding import FOLDED_KEY

g = torch.Generator().manual_seed(0)
q, k = torch.randn(2, 16, 3, 32, generator=g), torch.randn(2, 16, 3, 32, generator=g)
rope_old = zoo.ComplexRoPE(head_dim=32, max_seq_len=32).eval()
rope_new = zoo.ComplexRoPE(head_dim=32, max_seq_len=32, theta=50.0).eval()  # other frequencies
rope_compiled = tetrt_support.compile(rope_old, arg_inputs=(q, k))
folded = rope_compiled.meta[FOLDED_KEY]
print("folded from", folded.sources(), "into", folded.names)
rope_refitted = tetrt_support.refit_module_weights(rope_compiled, rope_new)
print("refitted vs the new eager RoPE, max abs error < 1e-5:",
      max_abs_error(rope_new(q, k), rope_refitted(q, k)) < 1e-5)
print("refitted vs the old eager RoPE, max abs error > 0.1:",
      max_abs_error(rope_old(q, k), rope_refitted(q, k)) > 0.1)

# %% [markdown]
# Weights of another architecture are refused, naming the first key that differs:

# %% tags=["raises-exception"]
tetrt_support.refit_module_weights(from_module, zoo.tiny_llama4(num_layers=3).state_dict())

# %% [markdown]
# ## What remains open
#
# - **Engines are not saved in the `ExportedProgram` format**: the program runs the
#   blocks' ATen graphs in PyTorch. Keeping the engine would take an engine class
#   `torch.export` can serialize (TorchBind or an opaque object) and a custom op with a
#   fake implementation: Torch-TensorRT's design, and a runtime library to ship.
#   The `"pickle"` format keeps the engines.
# - **A saved program is called with the keyword/positional split it was saved with**
#   (`torch.export`'s own rule for `ep.module()`).
# - **TensorRT blocks** keep their weights in the TensorRT plan: refit raises for them
#   here; on a GPU machine that is the place for torch_tensorrt's own refitter.
# - **The `torch.compile` backend is inference only** (as Torch-TensorRT's is): it raises
#   when a graph input requires grad with grad mode on, rather than return outputs without
#   gradients. With `dynamic=True` Dynamo marks every dim dynamic, head sizes included;
#   an ONNX Runtime block whose graph fixes such a dim then fails to export and runs in
#   PyTorch, with a warning (automatic dynamic shapes, batch and sequence, stay in the engine).
