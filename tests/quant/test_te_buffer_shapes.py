"""TransformerEngine's buffer shapes and shape/input refusals, per format and usage.

The shapes are those TE's C++ ``create_tensor`` allocates (``pytorch/csrc/quantizer.cpp``):
data in the tensor's own N-D shape row-wise; column-wise ``(shape[-1], *shape[:-1])`` where
the layout is transposed (per-tensor FP8, FP8 block), the N-D shape itself for MXFP8, and
2-D ``(K, M/2)`` for NVFP4 (its "enforce 2D shape"); NVFP4 codes halve the last dim. Scale
buffers stay 2-D.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import pytest
import torch

from tetrt_support.quant import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from tetrt_support.quant.fake_impls.tensor_proto import TensorProto

SHAPES = [(64, 128), (2, 48, 128), (2, 3, 16, 128)]  # 2-D, 3-D, 4-D; M = 64 or 96
USAGES = {"both": (True, True), "rowwise": (True, False), "columnwise": (False, True)}


def _transposed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[-1], *shape[:-1])


def _m(shape: tuple[int, ...]) -> int:
    m = 1
    for s in shape[:-1]:
        m *= s
    return m


# format -> (make(rowwise, columnwise), row-wise data name, column-wise data name, TE's shapes)
FORMATS: dict[str, tuple[Callable, str, str, Callable, Callable]] = {
    "fp8_delayed": (lambda r, c: Float8Quantizer(rowwise_usage=r, columnwise_usage=c), "_data", "_transpose",
                    lambda s: s, _transposed),
    "fp8_current": (lambda r, c: Float8CurrentScalingQuantizer(rowwise_usage=r, columnwise_usage=c), "_data",
                    "_transpose", lambda s: s, _transposed),
    "fp8_block_1x128": (lambda r, c: Float8BlockQuantizer(rowwise_usage=r, columnwise_usage=c, block_scaling_dim=1),
                        "_rowwise_data", "_columnwise_data", lambda s: s, _transposed),
    "fp8_block_128x128": (lambda r, c: Float8BlockQuantizer(rowwise_usage=r, columnwise_usage=c),
                          "_rowwise_data", "_columnwise_data", lambda s: s, _transposed),
    "mxfp8": (lambda r, c: MXFP8Quantizer(rowwise_usage=r, columnwise_usage=c), "_rowwise_data", "_columnwise_data",
              lambda s: s, lambda s: s),
    "nvfp4": (lambda r, c: NVFP4Quantizer(rowwise_usage=r, columnwise_usage=c), "_rowwise_data", "_columnwise_data",
              lambda s: (*s[:-1], s[-1] // 2), lambda s: (s[-1], _m(s) // 2)),
}


@pytest.mark.parametrize("usage", list(USAGES))
@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "3d", "4d"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_data_buffers_have_tes_nd_shapes(fmt: str, shape: tuple[int, ...], usage: str) -> None:
    """Every format and usage, 2-D to 4-D: the data buffers have TE's shapes, the scale
    buffers are 2-D, and ``make_empty`` / ``describe_buffers`` / a TensorProto agree."""
    make, row_name, col_name, row_shape, col_shape = FORMATS[fmt]
    q = make(*USAGES[usage])
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    t = q.quantize(x)
    want = {}
    if q.rowwise_usage:
        want[row_name] = row_shape(shape)
    if q.columnwise_usage:
        want[col_name] = col_shape(shape)
    got = {name: tuple(b.shape) for name, b in t.inner_buffers().items()}
    assert {n: got[n] for n in want} == want
    assert {n for n in got if n not in want and got[n] is not None} == set(got) - set(want)
    for name, buf_shape in got.items():
        if name not in want and "amax" not in name and name != "_scale_inv":
            assert len(buf_shape) == 2, (name, buf_shape)  # scale buffers stay 2-D, as TE's
    assert {n: tuple(b.shape) for n, b in q.make_empty(shape).inner_buffers().items()} == got
    assert {n: s for n, (s, _) in q.describe_buffers(shape).items()} == got
    assert {b.name: b.shape for b in TensorProto.describe(q, shape, x.dtype, "cpu").buffers} == got


@pytest.mark.parametrize("shape", SHAPES[1:], ids=["3d", "4d"])
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "fp8_delayed"])
def test_nd_buffers_hold_the_bytes_and_values_of_the_2d_view(fmt: str, shape: tuple[int, ...]) -> None:
    """The N-D buffers are the 2-D quantization's bytes reshaped; each layout dequantizes to
    the same values; pickling, clone and .to keep the shapes."""
    make = FORMATS[fmt][0]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    nd, flat = make(True, True).quantize(x), make(True, True).quantize(x.reshape(-1, shape[-1]))
    for name, buf in nd.inner_buffers().items():
        other = flat.inner_buffers()[name]
        assert torch.equal(buf.reshape(-1).view(torch.uint8), other.reshape(-1).view(torch.uint8)), name
    for layout in ("rowwise", "columnwise"):
        assert torch.equal(nd.dequantize(layout=layout), flat.dequantize(layout=layout).reshape(shape))
    shapes = {n: b.shape for n, b in nd.inner_buffers().items()}
    for again in (pickle.loads(pickle.dumps(nd)), nd.clone(), copy.deepcopy(nd), nd.to(torch.bfloat16)):
        assert {n: b.shape for n, b in again.inner_buffers().items()} == shapes
        assert torch.equal(again.dequantize(torch.float32), nd.dequantize(torch.float32))
    into = make(True, True).make_empty(shape)
    into.copy_(x)  # re-quantizes into the N-D buffers
    assert torch.equal(into.dequantize(), nd.dequantize())


def test_block_formats_data_of_0d_and_1d_tensors_keep_their_shape_as_te() -> None:
    """TE's FP8 block ``create_tensor`` with shape () or (n,): data () or (n,) for both usages."""
    for shape in [(), (7,)]:
        t = Float8BlockQuantizer(block_scaling_dim=1).quantize(torch.randn(shape))
        assert t._rowwise_data.shape == shape and t._columnwise_data.shape == shape
        assert t.dequantize().shape == shape


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("usage", list(USAGES))
@pytest.mark.parametrize("quantizer, block, shape", [
    (NVFP4Quantizer, 16, (1, 16)), (NVFP4Quantizer, 16, (2, 4, 16)), (NVFP4Quantizer, 16, (16, 24)),
    (MXFP8Quantizer, 32, (1, 32)), (MXFP8Quantizer, 32, (2, 8, 32)), (MXFP8Quantizer, 32, (32, 48)),
])
def test_block_dims_are_refused_whatever_the_usage_as_te_create_tensor(quantizer, block: int, shape, usage: str) -> None:
    """TE's ``create_tensor`` (MXFP8 and NVFP4) checks the product of the leading dims and
    the last dim before it allocates, for every usage; a row-wise-only (1, 16) NVFP4 tensor
    is refused too. (TE's pure-PyTorch reference quantizers pad instead; this quantizer
    stands for TE's ``NVFP4Quantizer`` / ``MXFP8Quantizer``, whose quantize goes through
    ``create_tensor``.)"""
    q = quantizer(rowwise_usage=USAGES[usage][0], columnwise_usage=USAGES[usage][1])
    which = "product of the leading dims" if _m(shape) % block else "last dim"
    match = f"{which} must be a multiple of {block} for any usage"
    with pytest.raises(ValueError, match=match):
        q.quantize(torch.randn(shape))
    with pytest.raises(ValueError, match=match):
        q.make_empty(shape)
    empty = q.quantize(torch.randn(0, block))  # 0 rows are a multiple of every block
    assert empty.shape == (0, block)


def test_row_scaled_nvfp4_columnwise_is_refused_unless_bf16_multiples_of_32_without_4over6() -> None:
    """TE's ``quantize.cuh``: row-scaled NVFP4 with column-wise usage needs bf16 input whose
    2-D view has both dims multiples of 32, and 4over6 off; row-wise only takes any of it."""
    q = NVFP4Quantizer(row_scaled_nvfp4=True)
    with pytest.raises(ValueError, match="requires BF16 input and dimensions that are multiples of 32"):
        q.quantize(torch.randn(16, 16))  # fp32: accepted before, refused as TE
    with pytest.raises(ValueError, match="got torch.bfloat16 of shape \\(16, 64\\)"):
        q.quantize(torch.randn(16, 64, dtype=torch.bfloat16))  # M = 16
    with pytest.raises(ValueError, match="not supported with 4over6"):
        NVFP4Quantizer(row_scaled_nvfp4=True, nvfp4_use_4over6=True).quantize(torch.randn(32, 64, dtype=torch.bfloat16))
    t = q.quantize(torch.randn(2, 16, 64, dtype=torch.bfloat16))  # M = 32, K = 64: TE's supported case
    assert t._amax_rowwise.shape == (32,) and t._amax_columnwise.shape == (64,)
    row_only = NVFP4Quantizer(row_scaled_nvfp4=True, columnwise_usage=False)
    for x in (torch.randn(16, 16), torch.randn(16, 48, dtype=torch.float16)):
        assert row_only.quantize(x)._amax_rowwise.shape == (16,)
    NVFP4Quantizer(row_scaled_nvfp4=True, nvfp4_use_4over6=True, columnwise_usage=False).quantize(torch.randn(16, 16))
    assert q.quantize(torch.randn(0, 16)).shape == (0, 16)  # TE returns before its checks on empty input
