"""The fast-path tables (``quant.kernels.dispatch``), FP8 current scaling's one route
decision and the one FP8 dtype check.

The CUDA paths themselves run in ``test_kernels_cpu.py`` (Triton's interpreter) and on a GPU
(``scripts/gpu_check.py``); here: lookup by exact type, duplicates refused with their
message, every shipped format registered where it is defined, and the lazy kernel imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from tetrt_support import quant
from tetrt_support.quant import numerics
from tetrt_support.quant.float8_tensor import current_scaling_route
from tetrt_support.quant.kernels import dispatch

TENSOR_CLASSES = tuple(dict.fromkeys(q.tensor_class for q in quant.ALL_QUANTIZERS))


@pytest.mark.parametrize("cls", quant.VALUE_QUANTIZERS, ids=lambda c: c.__name__)
def test_every_value_quantizer_registers_its_quantize_fast_path_in_its_module(cls: type) -> None:
    handler = dispatch.QUANTIZE.lookup(cls)
    assert handler is not None and cls in dispatch.QUANTIZE
    assert handler.__module__ == cls.__module__


@pytest.mark.parametrize("cls", TENSOR_CLASSES, ids=lambda c: c.__name__)
def test_every_tensor_class_registers_its_gemm_fast_path_in_its_module(cls: type) -> None:
    handler = dispatch.GEMM.lookup(cls)
    assert handler is not None and cls in dispatch.GEMM
    assert handler.__module__ == cls.__module__


def test_the_tables_hold_exactly_the_shipped_classes() -> None:
    # FP8 delayed scaling has no quantize fast path (its quantize updates live tensors); its
    # tensors share Float8Tensor's GEMM.
    assert set(dispatch.QUANTIZE.registered()) == set(quant.VALUE_QUANTIZERS)
    assert quant.Float8Quantizer not in dispatch.QUANTIZE
    assert set(dispatch.GEMM.registered()) == set(TENSOR_CLASSES)


def test_a_second_registration_is_refused_naming_the_class_and_both_handlers() -> None:
    cls = quant.Float8CurrentScalingQuantizer
    held = dispatch.QUANTIZE.lookup(cls)

    def another(q: Any, x: torch.Tensor, x2d: torch.Tensor, options: dict) -> None:
        return None

    module = "tetrt_support.quant.float8_tensor"
    expected = (
        f"quantize fast path for {module}.Float8CurrentScalingQuantizer is already registered "
        f"({module}._current_scaling_buffers); refusing a second one ({another.__module__}."
        "test_a_second_registration_is_refused_naming_the_class_and_both_handlers.<locals>.another)"
    )
    with pytest.raises(ValueError) as info:
        dispatch.QUANTIZE.register(cls)(another)
    assert str(info.value) == expected
    assert dispatch.QUANTIZE.lookup(cls) is held  # the first one stays
    gemm_message = r"GEMM fast path for .*\.NVFP4Tensor is already registered \(.*\._nvfp4_mm\)"
    with pytest.raises(ValueError, match=gemm_message):
        dispatch.GEMM.register(quant.NVFP4Tensor)(another)


def test_keys_must_be_classes_of_the_tables_kind() -> None:
    with pytest.raises(TypeError, match="quantize fast paths are keyed by subclasses of Quantizer, "
                                        "got 'MXFP8'"):
        dispatch.QUANTIZE.register("MXFP8")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="GEMM fast paths are keyed by subclasses of "
                                        "QuantizedTensor, got <class"):
        dispatch.GEMM.register(quant.MXFP8Quantizer)


def test_lookup_is_by_exact_type_a_subclass_registers_its_own() -> None:
    class Sub(quant.MXFP8Quantizer):
        pass

    assert dispatch.QUANTIZE.lookup(Sub) is None  # no MRO walk: the subclass runs the reference
    table = dispatch.FastPathTable("quantize", quant.Quantizer)

    def parent_path(*args: Any) -> None:
        return None

    def sub_path(*args: Any) -> None:
        return None

    table.register(quant.MXFP8Quantizer)(parent_path)
    assert table.lookup(Sub) is None
    assert table.register(Sub)(sub_path) is sub_path  # the decorator returns the function
    assert table.lookup(Sub) is sub_path and table.lookup(quant.MXFP8Quantizer) is parent_path
    copy = table.registered()
    copy.clear()
    assert len(table.registered()) == 2  # registered() is a copy


def test_quantize_takes_the_handler_registered_for_its_type(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Sub(quant.Float8CurrentScalingQuantizer):
        pass

    table = dispatch.FastPathTable("quantize", quant.Quantizer)
    monkeypatch.setattr(dispatch, "QUANTIZE", table)
    calls: list[tuple[type, tuple[int, ...], tuple[int, ...]]] = []

    @table.register(Sub)
    def record(q: Any, x: torch.Tensor, x2d: torch.Tensor, options: dict) -> dict:
        calls.append((type(q), tuple(x.shape), tuple(x2d.shape)))
        return q._quantize_tensor(x, **options)  # the reference's buffers

    x = torch.randn(2, 3, 8)
    got = Sub().quantize(x)
    assert calls == [(Sub, (2, 3, 8), (6, 8))]
    want = quant.Float8CurrentScalingQuantizer().quantize(x)  # not in this table: the reference
    assert len(calls) == 1
    for name in ("_data", "_transpose", "_scale_inv"):
        mine, theirs = getattr(got, name), getattr(want, name)
        assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8))


def test_fast_matmul_needs_two_operands_of_one_registered_class() -> None:
    x = torch.randn(32, 32)
    a = quant.Float8CurrentScalingQuantizer().quantize(x)
    b = quant.MXFP8Quantizer().quantize(x)
    kwargs = {"transpose_a": False, "transpose_b": True, "out_dtype": torch.float32}
    assert dispatch.fast_matmul(a, b, **kwargs) is None  # mixed classes: the reference
    assert dispatch.fast_matmul(a, a, **kwargs) is None  # a CPU tensor: no kernels here


# ------------------------------------------------------------ FP8 current scaling route
def _route(x: torch.Tensor, **options: Any) -> str | None:
    return current_scaling_route(quant.Float8CurrentScalingQuantizer(), x, options)


def test_current_scaling_route_on_the_cpu_is_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert _route(torch.randn(4, 8)) is None


def test_current_scaling_route_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU under Triton's interpreter decides as a CUDA device does, minus the compiled
    reference (CUDA only): an amax reduction, a given amax, a stray option, an empty tensor
    or the kernels switched off run the reference."""
    from tetrt_support.quant import kernels

    if not kernels.triton_available():
        pytest.skip("needs Triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TETRT_QUANT_KERNELS", "1")
    x = torch.randn(4, 8)
    assert _route(x) == "kernel"
    assert _route(x, amax_reduction_group=None, tensor_amax=None) == "kernel"
    assert _route(x, amax_reduction_group="group0") is None
    assert _route(x, tensor_amax=torch.tensor(1.0)) is None
    assert _route(x, stray=None) is None
    assert _route(torch.randn(0, 8)) is None
    held = quant.Float8CurrentScalingQuantizer(amax_reduction_group="group0")
    assert current_scaling_route(held, x, {}) is None
    monkeypatch.setenv("TETRT_QUANT_KERNELS", "0")
    assert _route(x) is None  # a CPU tensor: no compiled path either


def test_a_stray_option_is_refused_whatever_the_device() -> None:
    # The fast path leaves a stray option to the reference, which names it.
    with pytest.raises(TypeError, match="unexpected keyword argument 'stray'"):
        quant.Float8CurrentScalingQuantizer().quantize(torch.randn(4, 8), stray=None)


# --------------------------------------------------------------------- FP8 dtype check
@pytest.mark.parametrize("build", [
    lambda d: quant.Float8CurrentScalingQuantizer(d),
    lambda d: quant.Float8Quantizer(d),
    lambda d: quant.Float8BlockQuantizer(d),
    lambda d: quant.MXFP8Quantizer(d),
], ids=["current", "delayed", "blockwise", "mxfp8"])
def test_one_fp8_dtype_check_for_every_quantizer(build: Any) -> None:
    with pytest.raises(ValueError) as info:
        build(torch.bfloat16)
    owner = str(info.value).partition(":")[0]
    want = f"{owner}: fp8_dtype must be one of {numerics.FP8_DTYPES}, got torch.bfloat16"
    assert str(info.value) == want
    assert owner.endswith("Quantizer")
    with pytest.raises(ValueError, match=r"^fp8_max: fp8_dtype must be one of"):
        numerics.fp8_max(torch.bfloat16)
    assert numerics.check_fp8_dtype(torch.float8_e5m2, "x") is torch.float8_e5m2


# ------------------------------------------------------------------------ lazy imports
def test_importing_quant_loads_no_triton_and_no_kernel_module() -> None:
    code = (
        "import json, sys\n"
        "import tetrt_support.quant\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('tetrt_support.quant.kernels'))\n"
        "print(json.dumps({'triton': 'triton' in sys.modules, 'kernels': loaded}))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    kernels = ["tetrt_support.quant.kernels", "tetrt_support.quant.kernels.dispatch"]
    assert seen == {"triton": False, "kernels": kernels}
