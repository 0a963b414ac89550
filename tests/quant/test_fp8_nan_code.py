"""Every NaN is written as the positive FP8 NaN code 0x7F, as TE's kernels write it.

TE casts to FP8 with ``cvt.rn.satfinite`` (``common/util/ptx.cuh``). On an H200 that
conversion, and torch's CUDA cast, wrote 0x7F for -NaN (``scripts/gpu_check.py`` compares
the kernels with the CPU path on inputs holding +-NaN); torch's CPU cast keeps the sign
(0xFF), so the CPU path drops it explicitly.
"""

from __future__ import annotations

import math

import pytest
import torch

from tetrt_support.quant import Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, numerics


def _signed_nans(dtype: torch.dtype) -> torch.Tensor:
    x = torch.linspace(-3, 3, 32 * 128).reshape(32, 128)
    x[0, 1], x[0, 2] = math.nan, -math.nan
    return x.to(dtype)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_cast_to_fp8_writes_one_nan_code(fp8_dtype: torch.dtype) -> None:
    x = torch.tensor([math.nan, -math.nan, 1.0, -1.0])
    codes = numerics.cast_to_fp8(x, 1.0, fp8_dtype).view(torch.uint8).tolist()
    assert codes[:2] == [0x7F, 0x7F]
    assert codes[2] & 0x80 == 0 and codes[3] & 0x80 == 0x80  # finite values keep their sign


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("quantizer", [
    Float8CurrentScalingQuantizer(fp8_dtype=torch.float8_e4m3fn),
    Float8CurrentScalingQuantizer(fp8_dtype=torch.float8_e5m2),
    Float8BlockQuantizer(block_scaling_dim=1),
    Float8BlockQuantizer(block_scaling_dim=2),
    MXFP8Quantizer(),
], ids=["current-e4m3", "current-e5m2", "block-1x128", "block-128x128", "mxfp8"])
def test_quantizers_write_positive_nan_in_both_layouts(quantizer, dtype: torch.dtype) -> None:
    q = quantizer.quantize(_signed_nans(dtype))
    for name in q.__tensor_flatten__()[0]:
        buffer = getattr(q, name)
        if buffer.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            continue
        nan = torch.isnan(buffer.float())
        assert int(nan.sum()) == 2, name  # the two NaNs, in this layout too
        assert (buffer.view(torch.uint8)[nan] == 0x7F).all(), name  # both positive, code 0x7F
