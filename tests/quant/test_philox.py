"""The stochastic-rounding draws: Philox4x32-10 as published, counted per element."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tetrt_support.quant import philox
from tetrt_support.quant.nvfp4_tensor import NVFP4Quantizer

# Known-answer vectors of Philox4x32-10 (Random123's kat_vectors): counter, key -> output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_known_answers(counter, key, expected) -> None:
    words = philox.philox4x32(tuple(np.array([c], dtype=np.uint64) for c in counter), key)
    assert tuple(int(w[0]) for w in words) == expected


def test_element_i_is_word_i_mod_4_of_quad_i_div_4() -> None:
    seed = (0xA4093822 << 32) | 0x299F31D0
    u = philox.uniform(seed, (3, 8))
    flat = u.flatten()
    for i in (0, 1, 2, 3, 4, 7, 13, 23):
        words = philox.philox4x32((np.array([i // 4], dtype=np.uint64), np.zeros(1, np.uint64), np.zeros(1, np.uint64),
                                   np.zeros(1, np.uint64)), (0x299F31D0, 0xA4093822))
        assert flat[i].item() == (int(words[i % 4][0]) >> 8) * 2.0**-24


def test_draws_are_24_bit_exact_in_0_1_and_look_uniform() -> None:
    u = philox.uniform(12345, (256, 1024))
    assert u.dtype == torch.float32 and 0.0 <= u.min().item() and u.max().item() < 1.0
    assert torch.equal(u * 2**24, torch.floor(u * 2**24))  # k / 2^24, exactly
    counts = torch.histc(u, bins=16, min=0.0, max=1.0)
    assert (counts / u.numel() - 1 / 16).abs().max().item() < 0.003


def test_the_seed_comes_from_the_generator() -> None:
    g = torch.Generator().manual_seed(3)
    first = philox.draw_seed(g, "cpu")
    g.manual_seed(3)
    assert torch.equal(first, philox.draw_seed(g, "cpu"))
    assert first.dtype == torch.int64 and first.shape == (1,)
    assert not torch.equal(first, philox.draw_seed(g, "cpu"))  # the state moved on


def test_same_generator_state_same_bytes_and_layouts_draw_apart() -> None:
    q = NVFP4Quantizer(stochastic_rounding=True, with_rht=False)
    q.set_usage(rowwise=True, columnwise=True)
    x = torch.randn(64, 64)
    a = q.quantize(x, generator=torch.Generator().manual_seed(5))
    b = q.quantize(x, generator=torch.Generator().manual_seed(5))
    c = q.quantize(x, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a._rowwise_data, b._rowwise_data) and torch.equal(a._columnwise_data, b._columnwise_data)
    assert not torch.equal(a._rowwise_data, c._rowwise_data)


def test_a_row_length_that_is_not_a_multiple_of_4_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        philox.uniform(1, (2, 6))
