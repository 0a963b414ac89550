"""``torch.compile(model, backend="tetrt", options={...})``: every graph Dynamo hands over
(one per graph break) is lowered and compiled with ``tetrt_support.compile``'s options,
and the result matches eager."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

from tetrt_support import zoo
from tetrt_support.compiler.backend import BACKEND_NAME, tetrt_backend

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A backend that calls ``tetrt_backend`` and keeps what it compiled, graph by graph."""

    def __init__(self, **options) -> None:
        self.options = options
        self.compiled: list = []

    def __call__(self, gm, example_inputs):
        run = tetrt_backend(gm, example_inputs, options=self.options)
        self.compiled.append(getattr(run, "compiled_module", None))
        return run


class BreakBetween(torch.nn.Module):
    """Complex RoPE, a graph break (a Python side effect), complex RoPE again."""

    def __init__(self) -> None:
        super().__init__()
        self.rope = zoo.build_model("complex_rope")
        self.seen: list[int] = []

    def forward(self, xq: torch.Tensor, xk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.rope(xq, xk)
        self.seen.append(int(a.shape[1]))  # graph break: Dynamo cannot keep a list append of an int it computed
        torch._dynamo.graph_break()
        return self.rope(a * 2 + 1, b)


def _qk(batch: int = 2, seq: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    model = zoo.build_model("complex_rope")
    return zoo.example_inputs("complex_rope", model, batch=batch, seq=seq, seed=seed)[0]


def test_backend_compiles_each_graph_around_a_graph_break() -> None:
    torch._dynamo.reset()
    model = BreakBetween().eval()
    backend = Recorder(min_block_size=1)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        out, ref = compiled(*_qk()), model(*_qk())
    assert len(backend.compiled) == 2  # one graph before the break, one after
    assert all(c is not None and c.blocks_summary() == "1 engine block, 0 fallback blocks" for c in backend.compiled)
    assert all(c.meta["tetrt_backend"] == "onnxruntime" for c in backend.compiled)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-4)


def test_backend_options_change_the_blocks() -> None:
    torch._dynamo.reset()
    model = zoo.build_model("complex_rope").eval()
    backend = Recorder(min_block_size=1, torch_executed_ops={"torch.ops.aten.mul.Tensor"}, backend="eager")
    with torch.no_grad():
        out = torch.compile(model, backend=backend)(*_qk())
    (module,) = backend.compiled
    assert module.meta["tetrt_backend"] == "eager"
    assert any(b.kind == "fallback" and "aten.mul.Tensor" in b.ops for b in module.blocks())
    for o, r in zip(out, model(*_qk())):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-4)


def test_backend_keeps_the_dims_dynamo_marks_dynamic_dynamic() -> None:
    torch._dynamo.reset()
    model = zoo.build_model("complex_rope").eval()
    backend = Recorder(min_block_size=1)
    compiled = torch.compile(model, backend=backend)  # automatic dynamic: batch and seq, after a change
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every block builds in the engine
        with torch.no_grad():
            for batch, seq in ((2, 8), (3, 5), (4, 11), (5, 3)):
                for o, r in zip(compiled(*_qk(batch, seq, seed=seq)), model(*_qk(batch, seq, seed=seq))):
                    torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-4)
    # a static graph first; after the sizes change, one dynamic graph serves every later size
    assert len(backend.compiled) == 2
    assert all(c.blocks_summary() == "1 engine block, 0 fallback blocks" for c in backend.compiled)


def _int_times(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.sin(x) * n + 1


def test_a_graph_that_cannot_compile_runs_in_pytorch_or_raises() -> None:
    # dynamic=True makes the int argument a SymInt input that no tensor carries
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.warns(UserWarning, match=r"the 'tetrt' backend could not compile a graph of 3 ops "
                                       r"\(NotImplementedError: graph input l_n_ is the symbolic int s\d+, which is no size "
                                       r"of a tensor input.*\); it runs in PyTorch as Dynamo captured it"):
        out = torch.compile(_int_times, backend=Recorder(min_block_size=1), dynamic=True)(x, 3)
    torch.testing.assert_close(out, _int_times(x, 3))
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="graph input l_n_ is the symbolic int"):
        torch.compile(_int_times, backend=Recorder(pass_through_build_failures=True), dynamic=True)(x, 3)


def test_backend_by_name_on_llama4_matches_eager() -> None:
    import tetrt_support.compiler  # noqa: F401 - registers "tetrt"

    torch._dynamo.reset()
    model = zoo.tiny_llama4().eval()
    ids = zoo.llama4_example_inputs(model)
    with torch.no_grad():
        out = torch.compile(model, backend=BACKEND_NAME)(**ids)
        ref = model(**ids)
    assert type(out) is type(ref)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-4)


def test_backend_refuses_graphs_that_need_gradients() -> None:
    torch._dynamo.reset()
    model = torch.nn.Linear(4, 4)  # parameters require grad; grad mode on
    with pytest.raises(Exception, match="compiles inference graphs .* call the compiled model under torch.no_grad"):
        torch.compile(model, backend=Recorder())(torch.randn(2, 4))


def test_backend_rejects_a_misspelt_option() -> None:
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match=r"unknown compile option 'min_blok_size' \(did you mean 'min_block_size'\?\)"):
        torch.compile(torch.nn.Linear(4, 4), backend=Recorder(min_blok_size=1))(torch.randn(2, 4))


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_import_tetrt_support_registers_nothing_and_the_entry_point_needs_no_import() -> None:
    assert "tetrt" in entry_points(group="torch_dynamo_backends").names
    code = "\n".join(
        [
            "import torch, sys",
            "import tetrt_support",
            "from torch._dynamo.backends import registry",
            "assert 'tetrt' not in registry._COMPILER_FNS, 'registered at import tetrt_support'",
            "assert 'tetrt_support.compiler' not in sys.modules",
            "f = lambda x: torch.sin(x) * 2 + 1",
            "x = torch.randn(3, 4)",
            "with torch.no_grad():",
            "    out = torch.compile(f, backend='tetrt', options={'min_block_size': 1})(x)",
            "assert torch.allclose(out, f(x), atol=1e-6)",
            "assert registry._COMPILER_FNS['tetrt'].__module__ == 'tetrt_support.compiler.backend'",
        ]
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]


def test_import_tetrt_support_compiler_registers_the_backend_once() -> None:
    code = "\n".join(
        [
            "import torch",
            "import tetrt_support.compiler",
            "from torch._dynamo.backends import registry",
            "from tetrt_support.compiler.backend import register_backend, tetrt_backend",
            "assert registry.lookup_backend('tetrt') is tetrt_backend",
            "register_backend()  # idempotent",
            "assert 'tetrt' in torch._dynamo.list_backends()",
        ]
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr[-3000:]


class SmallMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) * 2


@pytest.mark.parametrize("pass_through", [False, True])
def test_backend_by_name_with_the_inductor_engine_compiles_the_block_with_inductor(
    pass_through: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inductor engine once used ``torch.compile`` inside the block, which
    Dynamo skips while it compiles the caller's frame; the whole graph fell back to PyTorch
    with a warning, or raised with ``pass_through_build_failures=True``."""
    import tetrt_support.compiler  # noqa: F401 - registers "tetrt"
    from tetrt_support.compiler import backend as backend_module
    from tetrt_support.compiler.engines.inductor import InductorBlock

    compiled_graphs: list = []
    compile_graph = backend_module._compile_graph

    def recording(*args):
        run = compile_graph(*args)
        compiled_graphs.append(run.compiled_module)
        return run

    monkeypatch.setattr(backend_module, "_compile_graph", recording)
    torch._dynamo.reset()
    model, x = SmallMLP().eval(), torch.randn(2, 4)
    options = {"backend": "inductor", "min_block_size": 1,
               "pass_through_build_failures": pass_through}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # a graph or block that fell back to PyTorch would warn
        out = torch.compile(model, backend="tetrt", options=options)(x)
        ref = model(x)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    (module,) = compiled_graphs
    assert module.meta["tetrt_backend"] == "inductor"
    assert module.blocks_summary() == "1 engine block, 0 fallback blocks"
    (engine_block,) = [m for m in module.modules() if isinstance(m, InductorBlock)]
    assert engine_block.compiled_graphs == 1  # built and checked while Dynamo compiled the frame
