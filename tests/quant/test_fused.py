"""The fused (compiled) FP8 current-scaling path produces the same bytes as the eager one.

The fused path is taken on CUDA (``current_scaling_route``); here the same function is
compiled through inductor's CPU backend and compared with the eager quantizer bit for bit.
"""

import pytest
import torch

from tetrt_support.quant import fused
from tetrt_support.quant import Float8CurrentScalingQuantizer
from tetrt_support.quant.float8_tensor import current_scaling_route


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("power_of_2", [False, True])
def test_fused_current_scaling_is_bit_exact(fp8_dtype: torch.dtype, power_of_2: bool) -> None:
    x = torch.randn(64, 96, dtype=torch.bfloat16) * 7
    x[3, 5] = 1e4  # saturating outlier sets the scale
    q = Float8CurrentScalingQuantizer(fp8_dtype, force_pow_2_scales=power_of_2, columnwise_usage=True)
    eager = q.quantize(x)
    data, scale_inv = fused.compiled_current_scaling()(x, fp8_dtype, power_of_2, 0.0)
    assert torch.equal(data.view(torch.uint8), eager._data.view(torch.uint8))
    assert torch.equal(data.t().contiguous().view(torch.uint8), eager._transpose.view(torch.uint8))
    assert torch.equal(scale_inv, eager._scale_inv)


def test_fused_path_is_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one decision (float8_tensor.current_scaling_route) never compiles for a CPU tensor,
    # with or without the kernels.
    q = Float8CurrentScalingQuantizer()
    for flag in ("1", "0"):
        monkeypatch.setenv("TETRT_QUANT_KERNELS", flag)
        assert current_scaling_route(q, torch.ones(4, 4), {}) != "compiled"
        assert current_scaling_route(q, torch.ones(0, 4), {}) is None
