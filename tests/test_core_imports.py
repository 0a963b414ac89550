"""The lean core install: the compiler and the quantizers load no showcase code.

``pip install -e .`` (no extras) installs torch, numpy, onnx, onnxscript and onnxruntime
only; transformers, scipy, tqdm and matplotlib come with the ``zoo`` and ``notebooks``
extras. Each check runs in a fresh interpreter in which those packages cannot be imported
(``sys.modules[name] = None``, as if they were not installed), imports a core entry point
or compiles a model, and lists the ``tetrt_support`` modules that loaded. torch imports
tqdm itself when it is installed (``torch.hub``); refusing it is what a lean install sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

#: Packages that only the showcase (models, notebooks, benchmarks) needs.
OPTIONAL_PACKAGES = ("transformers", "scipy", "tqdm", "matplotlib")

#: Showcase modules of the package: the Hugging Face zoo, the re-enacted history, the
#: notebook and report helpers, and the quantizer demonstrations of notebooks 03 and 04.
SHOWCASE_MODULES = (
    "tetrt_support.history",
    "tetrt_support.zoo",
    "tetrt_support.notebook",
    "tetrt_support.report",
    "tetrt_support.quant.fake_impls.hazards",
    "tetrt_support.quant.distributed",
)

_PRELUDE = textwrap.dedent(
    """
    import json, sys

    REFUSED = {refused!r}
    for name in REFUSED:
        sys.modules[name] = None  # import raises ModuleNotFoundError, find_spec says None
    """
)

_REPORT = textwrap.dedent(
    """
    loaded = sorted(m for m in sys.modules if m.startswith("tetrt_support"))
    third_party = sorted(
        m for m, mod in sys.modules.items() if mod is not None and m.partition(".")[0] in REFUSED
    )
    print(json.dumps({"tetrt": loaded, "third_party": third_party}))
    """
)


def _run_lean(body: str) -> dict[str, list[str]]:
    """Run ``body`` in a fresh interpreter with the optional packages refused."""
    code = _PRELUDE.format(refused=set(OPTIONAL_PACKAGES)) + textwrap.dedent(body) + _REPORT
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"failed in a lean interpreter:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _showcase(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == s or m.startswith(s + ".") for s in SHOWCASE_MODULES)]


@pytest.mark.parametrize(
    "entry", ["tetrt_support", "tetrt_support.compiler", "tetrt_support.quant"]
)
def test_core_import_loads_no_showcase_module(entry: str) -> None:
    seen = _run_lean(f"import {entry}")
    print(f"import {entry} loaded {len(seen['tetrt'])} tetrt modules:", *seen["tetrt"], sep="\n  ")
    loaded = "loaded: " + ", ".join(seen["tetrt"])
    assert entry in seen["tetrt"], loaded
    assert _showcase(seen["tetrt"]) == [], loaded
    assert seen["third_party"] == [], loaded


def test_compile_and_call_run_without_the_optional_packages() -> None:
    # Beyond the import: compiling a complex (rotary) graph to onnxruntime and calling it
    # imports nothing from the showcase either.
    seen = _run_lean(
        """
        import torch
        import tetrt_support

        class Rotate(torch.nn.Module):
            def forward(self, x, angle):
                z = torch.view_as_complex(x) * torch.polar(torch.ones_like(angle), angle)
                return torch.view_as_real(z)

        x, angle = torch.randn(3, 4, 2), torch.randn(3, 4)
        program = torch.export.export(Rotate(), (x, angle))
        compiled = tetrt_support.compile(program, arg_inputs=(x, angle))
        torch.testing.assert_close(compiled(x, angle), Rotate()(x, angle), atol=1e-5, rtol=1e-5)
        """
    )
    print("compile + call loaded:", *seen["tetrt"], sep="\n  ")
    loaded = "loaded: " + ", ".join(seen["tetrt"])
    assert _showcase(seen["tetrt"]) == [], loaded
    assert seen["third_party"] == [], loaded
