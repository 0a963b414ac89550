"""Models and functions more than one test module uses, each defined once.

The signature-case models (:class:`OutputModel`, :class:`Eig`, ...) are the ones
:mod:`tetrt_support.history` runs its matrix on; the tests use the same classes.
"""

from __future__ import annotations

import torch

from tetrt_support.history import DC, NT, CumsumBetween, Eig, Eigvals, OutputModel, register_case_dataclass

__all__ = ["DC", "NT", "CumsumBetween", "Eig", "Eigvals", "OutputModel", "register_case_dataclass", "rope"]


def rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in complex arithmetic: ``x`` as pairs times ``polar(1, freqs)``."""
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis[None, :, None, :]).flatten(3)
