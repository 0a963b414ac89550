"""What the FP8 blockwise kernel compiles to for Hopper (sm_90a), checked on the CPU.

Triton compiles to PTX without a GPU. The column-wise 1 x 128 program's speed on the H200
came from its transposed store: stored as ``tl.trans`` of the cast tile, Triton moved the
tile through shared memory one byte per instruction (``st.shared.b8``, 64 per thread and
slab), and the kernel that quantizes both layouts took 57.6 us at 8192 x 4096; loaded as
eight parts and packed with ``tl.join``, it moves 8-byte words and took 51.0 us (the
stored ``benchmarks/results/gpu_check_cuda.json``; 57.6 us is the run before it). This
test keeps that property: no byte-wide shared-memory access in any 1 x 128 form the
autotuner may pick.
"""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")

BYTE_WIDE_SHARED = re.compile(r"\b(?:st|ld)\.shared(?:::cta)?(?:\.v\d)?\.b8\b")


def _ptx(rowwise: bool, columnwise: bool, slab_1: int, slab_2: int, warps: int) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tetrt_support.quant.kernels.float8 import _blockwise_kernel as kernel

    pointer_and_int_types = ["*bf16", "*fp8e4nv", "*fp32", "*fp8e4nv", "*fp32"] + ["i32"] * 7
    signature = dict(zip(kernel.arg_names, pointer_and_int_types))
    constants = dict(MAX_VALUE=448.0, POWER_OF_2=True, EPSILON=0.0, VALUE_FOR_INF=3.3895313892515355e38,
                     TWO_D=False, ROWWISE=rowwise, COLUMNWISE=columnwise, OUT_DTYPE=triton.language.float8e4nv,
                     SOFTWARE=False, E4M3=True, CLAMP=False, B=128, SLAB_1=slab_1, SLAB_2=slab_2)
    signature.update(dict.fromkeys(constants, "constexpr"))
    divisible = {(i,): [["tt.divisibility", 16]] for i in range(len(pointer_and_int_types))}
    source = ASTSource(kernel, signature, constexprs=constants, attrs=divisible)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]


@pytest.mark.parametrize("slab_1, slab_2, warps", [(64, 64, 4), (32, 32, 4), (64, 32, 8), (32, 16, 4), (32, 128, 8)])
@pytest.mark.parametrize("rowwise", [True, False], ids=["both layouts", "column-wise only"])
def test_column_wise_program_moves_no_single_bytes_through_shared_memory(
    rowwise: bool, slab_1: int, slab_2: int, warps: int
) -> None:
    ptx = _ptx(rowwise, True, slab_1, slab_2, warps)
    assert re.search(r"\bst\.global(?:\.v\d)?\.b32\b", ptx), "expected word-wide global stores of the FP8 data"
    found = sorted(set(BYTE_WIDE_SHARED.findall(ptx)))
    assert not found, f"byte-wide shared-memory accesses in the 1 x 128 kernel: {found}"
