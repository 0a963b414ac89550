#!/usr/bin/env python3
"""Check on a CUDA GPU that every fast path computes what the CPU reference computes.

    python scripts/gpu_check.py --out gpu_check.json

1. Quantization kernels (:mod:`tetrt_support.quant.kernels`) against their twins in
   :mod:`tetrt_support.quant.numerics`, run on the CPU on the same inputs: every output
   buffer must be equal byte for byte (NaN compared as NaN). Inputs: random bf16 and
   fp32 tensors of several shapes (partial tiles included), and the same with special
   values (NaN, +-inf, zeros, subnormals, values at the formats' limits); and the E2M1
   encoding (nearest-even and stochastic) of every bf16 value. The eager
   PyTorch reference run on the GPU is compared too, for information: it is NOT always
   the CPU's bytes (CUDA's ``tensor / scalar`` multiplies by a rounded reciprocal).
2. The quantizers' own CUDA path (whatever ``quantize`` runs there) against the same
   quantizer on the CPU.
3. The native FP8 blockwise GEMM (forward, dgrad and wgrad layouts) against the fp64
   product of the dequantized operands, and the emulated MXFP8 / NVFP4 GEMMs against
   :func:`~tetrt_support.quant.kernels.gemm.emulated_reference_mm` (equal on inputs whose
   sums are exact; a relative error on random ones).
4. torch.compile: a few training steps of quantized Linears per recipe and fake-impl
   design, counting frames, graphs, graph breaks and recompiles.

Prints a summary and writes everything to ``--out``; exit status 1 if a bit-identity
check failed. A script, not a test: it needs a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.record import private_inductor_cache  # noqa: E402

private_inductor_cache("tetrt-gpu-check-")  # before torch loads

import torch  # noqa: E402

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def bytes_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Equal bytes; float buffers may differ only in the payload/sign of NaNs."""
    if a is None or b is None:
        return a is None and b is None
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype in (torch.float32, torch.bfloat16, torch.float16):
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        if not torch.equal(nan_a, nan_b):
            return False
        ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
        return torch.equal(a.view(ints)[~nan_a], b.view(ints)[~nan_b])
    if a.dtype in FP8 or a.dtype == torch.float8_e8m0fnu:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype in FP8:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    if a.is_floating_point():
        return int(((a != b) & ~(torch.isnan(a) & torch.isnan(b))).sum())
    return int((a != b).sum())


def differences(a: torch.Tensor, b: torch.Tensor, limit: int = 4) -> list[list[Any]]:
    """Up to ``limit`` [flat index, fast bits, reference bits] where the bit patterns differ."""
    a, b = a.detach().cpu().contiguous().reshape(-1), b.detach().cpu().contiguous().reshape(-1)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}.get(a.element_size())
    if ints is None or a.dtype != b.dtype:
        return []
    ia, ib = a.view(ints).long(), b.view(ints).long()
    where = torch.nonzero(ia != ib).reshape(-1)[:limit].tolist()
    return [[i, hex(int(ia[i]) & 0xFFFFFFFF), hex(int(ib[i]) & 0xFFFFFFFF)] for i in where]


def inputs(shape: tuple[int, int], dtype: torch.dtype, special: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2)
    if special:
        flat = x.view(-1)
        n = flat.numel()
        idx = torch.randperm(n, generator=g)
        specials = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 448.0, -448.0, 57344.0,
                    1e-39, -1e-42, 3e38, 1e-30, 6.0, 0.25, 2.5]
        for i, v in enumerate(specials):
            flat[idx[i]] = v
        x[: min(3, shape[0])] *= 1e-20  # whole tiny rows: tiny block scales
        if shape[0] > 40:
            x[40] = 0.0  # an all-zero row (amax 0)
    return x.to(dtype)


def compare(name: str, fast: dict[str, torch.Tensor | None], ref: dict[str, torch.Tensor | None],
            ref_cuda: dict[str, torch.Tensor | None] | None, results: list[dict[str, Any]]) -> None:
    row: dict[str, Any] = {"case": name, "buffers": {}}
    for key, value in ref.items():
        ok = bytes_equal(fast[key], value)
        entry = {"equal_cpu_reference": ok}
        if not ok and fast[key] is not None and value is not None and fast[key].shape == value.shape:
            entry["mismatches"] = mismatches(fast[key], value)
            entry["first_differences"] = differences(fast[key], value)
        if ref_cuda is not None:
            entry["cuda_eager_reference_equals_cpu"] = bytes_equal(ref_cuda[key], value)
        row["buffers"][key] = entry
    row["ok"] = all(e["equal_cpu_reference"] for e in row["buffers"].values())
    results.append(row)


def check_kernels(results: list[dict[str, Any]], shapes: list[tuple[int, int]] | None = None,
                  dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32), label: str = "") -> None:
    from tetrt_support.quant import numerics as N
    from tetrt_support.quant.kernels import float8 as F
    from tetrt_support.quant.kernels import mxfp8 as MX
    from tetrt_support.quant.kernels import nvfp4 as NV
    from tetrt_support.quant.kernels.hadamard import rht_transpose

    shapes = shapes or [(256, 512), (192, 320), (1000, 384), (1024, 2048)]
    for shape in shapes:
        for dtype in dtypes:
            for special in (False, True):
                tag = f"{shape[0]}x{shape[1]} {str(dtype).split('.')[-1]}{' special' if special else ''}{label}"
                x = inputs(shape, dtype, special, seed=hash((shape, special)) % 1000)
                xc = x.cuda()
                xt = x.t().contiguous()
                for f8 in FP8:
                    for pow2 in (False, True):
                        d, t, si, am = F.current_scaling_quantize(xc, f8, force_pow_2_scales=pow2, rowwise=True, columnwise=True)
                        rd, rsi, ram = N.float8_current_scaling_quantize(x, f8, force_pow_2_scales=pow2)
                        cd, csi, cam = N.float8_current_scaling_quantize(xc, f8, force_pow_2_scales=pow2)
                        compare(f"current {f8} pow2={pow2} {tag}", {"data": d, "transpose": t, "scale_inv": si, "amax": am},
                                {"data": rd, "transpose": rd.t().contiguous(), "scale_inv": rsi, "amax": ram},
                                {"data": cd, "transpose": cd.t().contiguous(), "scale_inv": csi, "amax": cam}, results)
                for dim in (1, 2):
                    br = 1 if dim == 1 else 128
                    a, b, c, e = F.blockwise_quantize(xc, torch.float8_e4m3fn, dim, rowwise=True, columnwise=True)
                    ra, rb = N.float8_blockwise_quantize(x, torch.float8_e4m3fn, br, 128)
                    rc, re_ = N.float8_blockwise_quantize(xt, torch.float8_e4m3fn, br, 128)
                    ga, gb = N.float8_blockwise_quantize(xc, torch.float8_e4m3fn, br, 128)
                    gc, ge = N.float8_blockwise_quantize(xc.t().contiguous(), torch.float8_e4m3fn, br, 128)
                    compare(f"blockwise {br}x128 {tag}", {"row_data": a, "row_scale_inv": b, "col_data": c, "col_scale_inv": e},
                            {"row_data": ra, "row_scale_inv": rb, "col_data": rc, "col_scale_inv": re_},
                            {"row_data": ga, "row_scale_inv": gb, "col_data": gc, "col_scale_inv": ge}, results)
                if shape[0] % 32 == 0 and shape[1] % 32 == 0:
                    a, b, c, e = MX.mxfp8_quantize(xc, torch.float8_e4m3fn, rowwise=True, columnwise=True)
                    ra, rb = N.mxfp8_quantize(x, torch.float8_e4m3fn, 1, 32)
                    rc, re_ = N.mxfp8_quantize(x, torch.float8_e4m3fn, 32, 1)
                    ga, gb = N.mxfp8_quantize(xc, torch.float8_e4m3fn, 1, 32)
                    gc, ge = N.mxfp8_quantize(xc, torch.float8_e4m3fn, 32, 1)
                    compare(f"mxfp8 {tag}", {"row_data": a, "row_scale": b, "col_data": c, "col_scale": e},
                            {"row_data": ra, "row_scale": rb, "col_data": rc, "col_scale": re_},
                            {"row_data": ga, "row_scale": gb, "col_data": gc, "col_scale": ge}, results)
                    deq = MX.mxfp8_dequantize_bf16(ra.cuda(), rb.cuda(), 1, 32)
                    compare(f"mxfp8 bf16 operand {tag}", {"operand": deq},
                            {"operand": N.mxfp8_dequantize(ra, rb, 1, 32).to(torch.bfloat16)}, None, results)
                if shape[0] % 16 == 0 and shape[1] % 16 == 0:
                    for br in (1, 16):
                        a, b, c, e, am = NV.nvfp4_quantize(xc, None, br, rowwise=True, columnwise=True)
                        ram = N.amax(x)
                        ra, rb = N.nvfp4_quantize(x, ram, br)
                        rc, re_ = N.nvfp4_quantize(xt, ram, br)
                        gam = N.amax(xc)
                        ga, gb = N.nvfp4_quantize(xc, gam, br)
                        gc, ge = N.nvfp4_quantize(xc.t().contiguous(), gam, br)
                        compare(f"nvfp4 {br}x16 {tag}",
                                {"row_data": a, "row_scale": b, "col_data": c, "col_scale": e, "amax": am.reshape(())},
                                {"row_data": ra, "row_scale": rb, "col_data": rc, "col_scale": re_, "amax": ram},
                                {"row_data": ga, "row_scale": gb, "col_data": gc, "col_scale": ge, "amax": gam}, results)
                    for mask in (0, N.TE_RHT_SIGN_MASK):
                        h = N.random_hadamard_matrix(mask)
                        compare(f"rht transpose mask={mask:#06x} {tag}",
                                {"rotated": rht_transpose(xc, mask)}, {"rotated": N.apply_hadamard(xt, h)},
                                {"rotated": N.apply_hadamard(xc.t().contiguous(), h.cuda())}, results)
                    op = NV.nvfp4_operand_bf16(ra.cuda(), rb.cuda())
                    ref = N.e2m1_decode(N.unpack_fp4(ra)) * N.expand_block_scales(rb.float(), 1, 16, tuple(x.shape))
                    compare(f"nvfp4 bf16 operand {tag}", {"operand": op, "operand_as_fp32": op.float()},
                            {"operand": ref.to(torch.bfloat16), "operand_as_fp32": ref}, None, results)


def check_e2m1_codes(results: list[dict[str, Any]]) -> None:
    """The quantize kernels' E2M1 encoding (nearest-even and stochastic) over every bf16
    value, as fp32, against ``numerics`` on the CPU: every midpoint, grid value and
    neighbour, the saturating range, +-inf and NaN."""
    from tetrt_support.quant import numerics as N
    from tetrt_support.quant.kernels import nvfp4 as NV

    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    clamped = values.clamp(-6.0, 6.0)
    compare("e2m1 codes, every bf16 value", {"codes": NV.e2m1_codes(values.cuda())},
            {"codes": N.e2m1_encode(clamped)}, None, results)
    u = torch.rand(values.shape, generator=torch.Generator().manual_seed(3))
    u[::5] = 0.5
    u[1::5] = 0.0
    compare("e2m1 stochastic codes, every bf16 value", {"codes": NV.e2m1_codes(values.cuda(), u.cuda())},
            {"codes": N.e2m1_encode_stochastic(clamped, u)}, None, results)


def check_quantizers(results: list[dict[str, Any]]) -> None:
    """Each quantizer's CUDA quantize, in the usages the Linear makes (both in training,
    row-wise only without gradients), against the same quantizer on the CPU, and against the
    reference run on the GPU from the same RNG state (stochastic rounding draws its seeds
    from the device's generator)."""
    from tetrt_support.quant import recipes

    x = inputs((512, 768), torch.bfloat16, False, seed=7)
    for name in recipes.RECIPES:
        for role, quantizer in zip(("input", "weight", "grad"), recipes.get_recipe(name).quantizers()):
            for columnwise in (True, False):
                _check_quantizer(f"{name}/{role}", quantizer, columnwise, x, results)


def _check_quantizer(case: str, quantizer: Any, columnwise: bool, x: torch.Tensor, results: list[dict[str, Any]]) -> None:
    try:
        quantizer.set_usage(rowwise=True, columnwise=columnwise)
        torch.cuda.manual_seed(11)
        gpu = quantizer.quantize(x.cuda())
        os.environ["TETRT_QUANT_KERNELS"] = "0"
        try:
            torch.cuda.manual_seed(11)
            gpu_reference = quantizer.quantize(x.cuda())
            cpu = quantizer.quantize(x)
        finally:
            os.environ["TETRT_QUANT_KERNELS"] = "1"
        names, _ = cpu.__tensor_flatten__()
        label = f"quantizer {case} {quantizer!r}"
        if getattr(quantizer, "stochastic_rounding", False):  # the CPU draws other numbers
            compare(label + " vs GPU reference (same RNG state)", {n: getattr(gpu, n) for n in names},
                    {n: getattr(gpu_reference, n) for n in names}, None, results)
        else:
            compare(label, {n: getattr(gpu, n) for n in names}, {n: getattr(cpu, n) for n in names},
                    {n: getattr(gpu_reference, n) for n in names}, results)
    except Exception as e:  # noqa: BLE001 - record and go on
        usage = "both usages" if columnwise else "row-wise only"
        results.append({"case": f"quantizer {case} ({usage})", "ok": False, "error": f"{type(e).__name__}: {e}"})


def check_linear(report: dict[str, Any]) -> None:
    """A Linear step per recipe: fast path against the reference on the same GPU (relative
    differences of y, dx, dW; equal buffers give GEMM-order differences only) and each
    against float64 math on the same inputs."""
    from tetrt_support.quant.linear import Linear

    out: dict[str, Any] = {}
    for recipe in ("fp8_current", "fp8_block", "mxfp8", "nvfp4"):
        rows = {}
        for flag in ("1", "0"):
            os.environ["TETRT_QUANT_KERNELS"] = flag
            try:
                torch.manual_seed(1)
                torch.cuda.manual_seed(1)
                layer = Linear(1024, 512, bias=False, recipe=recipe, device="cuda", dtype=torch.bfloat16)
                x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                dy = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16)
                y = layer(x)
                y.backward(dy)
                rows[flag] = (y.detach().double(), x.grad.double(), layer.weight.grad.double(),
                              x.detach().double(), layer.weight.detach().double(), dy.double())
            finally:
                os.environ["TETRT_QUANT_KERNELS"] = "1"
        (yf, dxf, dwf, xd, wd, dyd), (yr, dxr, dwr, _, _, _) = rows["1"], rows["0"]
        exact = (xd @ wd.t(), dyd @ wd, dyd.t() @ xd)
        out[recipe] = {
            "fast_vs_reference": [float((a - b).norm() / b.norm()) for a, b in ((yf, yr), (dxf, dxr), (dwf, dwr))],
            "fast_vs_float64": [float((a - b).norm() / b.norm()) for a, b in zip((yf, dxf, dwf), exact)],
            "reference_vs_float64": [float((a - b).norm() / b.norm()) for a, b in zip((yr, dxr, dwr), exact)],
        }
    report["linear_y_dx_dw"] = out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm())


def check_gemms(report: dict[str, Any]) -> None:
    from tetrt_support.quant import numerics as N
    from tetrt_support.quant.kernels import float8 as F
    from tetrt_support.quant.kernels import gemm as G
    from tetrt_support.quant.kernels import mxfp8 as MX
    from tetrt_support.quant.kernels import nvfp4 as NV

    m, n, k = 1024, 768, 2048
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", generator=g, dtype=torch.bfloat16)
    xr, xs, xcd, xcs = F.blockwise_quantize(x, torch.float8_e4m3fn, 1, rowwise=True, columnwise=True)
    wr, ws, wcd, wcs = F.blockwise_quantize(w, torch.float8_e4m3fn, 2, rowwise=True, columnwise=True)
    gr, gs, gcd, gcs = F.blockwise_quantize(dy, torch.float8_e4m3fn, 1, rowwise=True, columnwise=True)

    def deq(data: torch.Tensor, scale: torch.Tensor, br: int) -> torch.Tensor:
        return data.double() * N.expand_block_scales(scale.double(), br, 128, tuple(data.shape))

    gemms = {
        "forward x @ w.T": (xr, xs, wr, ws, True, deq(xr, xs, 1) @ deq(wr, ws, 128).t()),
        "dgrad dy @ w": (gr, gs, wcd, wcs, True, deq(gr, gs, 1) @ deq(wcd, wcs, 128).t()),
        "wgrad dy.T @ x": (gcd, gcs, xcd, xcs, False, deq(gcd, gcs, 1) @ deq(xcd, xcs, 1).t()),
    }
    # The same operands with the scales the quantizers store (TE's GEMM-ready buffers, read
    # by the GEMM as views, no re-layout copy): the product must be bit-identical.
    from tetrt_support.quant.float8_blockwise_tensor import (
        Float8BlockQuantizer,
        gemm_ready_block_scales,
    )

    def stored(t: torch.Tensor, dim: int) -> Any:
        return Float8BlockQuantizer(block_scaling_dim=dim, columnwise_usage=True).quantize(t)

    qx, qw, qg = stored(x, 1), stored(w, 2), stored(dy, 1)
    ready = {
        "forward x @ w.T": (gemm_ready_block_scales(qx, "rowwise"), gemm_ready_block_scales(qw, "rowwise")),
        "dgrad dy @ w": (gemm_ready_block_scales(qg, "rowwise"), gemm_ready_block_scales(qw, "columnwise")),
        "wgrad dy.T @ x": (gemm_ready_block_scales(qg, "columnwise"), gemm_ready_block_scales(qx, "columnwise")),
    }
    stored_ptrs = {getattr(q, f"_{layout}_scale_inv").untyped_storage().data_ptr()
                   for q in (qx, qw, qg) for layout in ("rowwise", "columnwise")}
    out: dict[str, Any] = {}
    for name, (a, sa, b, sb, two_d, ref) in gemms.items():
        try:
            y = G.blockwise_fp8_mm(a, sa, b, sb, b_two_d=two_d)
            sa_ready, sb_ready = ready[name]
            y_ready = G.blockwise_fp8_mm(a, sa_ready, b, sb_ready, b_two_d=two_d)
            out[name] = {"relative_error_vs_fp64_of_dequantized": rel_err(y, ref),
                         "gemm_ready_scale_views_bit_identical": bytes_equal(y, y_ready),
                         "gemm_ready_scales_are_views_of_the_stored_buffers": [
                             s.untyped_storage().data_ptr() in stored_ptrs for s in ready[name]]}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    report["fp8_blockwise_gemm"] = out

    # Emulated GEMMs: random data (relative error vs the fp64 definition) and data whose
    # products and sums are exact in fp32 (then equality).
    emu: dict[str, Any] = {}
    a_mx, s_mx = N.mxfp8_quantize(x.cpu(), torch.float8_e4m3fn, 1, 32)
    b_mx, t_mx = N.mxfp8_quantize(w.cpu(), torch.float8_e4m3fn, 1, 32)
    A = MX.mxfp8_dequantize_bf16(a_mx.cuda(), s_mx.cuda(), 1, 32)
    B = MX.mxfp8_dequantize_bf16(b_mx.cuda(), t_mx.cuda(), 1, 32)
    emu["mxfp8 random: rel err vs fp64 definition"] = rel_err(G.emulated_mm(A, B, out_dtype=torch.float32),
                                                             G.emulated_reference_mm(A, B))
    a_nv, s_nv = N.nvfp4_quantize(x.cpu(), N.amax(x.cpu()))
    b_nv, t_nv = N.nvfp4_quantize(w.cpu(), N.amax(w.cpu()))
    A = NV.nvfp4_operand_bf16(a_nv.cuda(), s_nv.cuda())
    B = NV.nvfp4_operand_bf16(b_nv.cuda(), t_nv.cuda())
    alpha = G.nvfp4_alpha(N.amax(x).reshape(1), N.amax(w).reshape(1))
    emu["nvfp4 random: rel err vs fp64 definition"] = rel_err(G.emulated_mm(A, B, alpha, out_dtype=torch.float32),
                                                             G.emulated_reference_mm(A, B, alpha))
    ref_deq = N.nvfp4_dequantize(a_nv, s_nv, N.amax(x.cpu())).double() @ N.nvfp4_dequantize(b_nv, t_nv, N.amax(w.cpu())).double().t()
    emu["nvfp4 random: rel err vs fp64 of fully dequantized operands"] = rel_err(
        G.emulated_mm(A, B, alpha, out_dtype=torch.float32), ref_deq)
    # exact sums: small integers times powers of two
    gi = torch.Generator().manual_seed(5)
    ai = (torch.randint(-6, 7, (256, 512), generator=gi).float() / 4).to(torch.bfloat16).cuda()
    bi = (torch.randint(-6, 7, (128, 512), generator=gi).float() / 2).to(torch.bfloat16).cuda()
    alpha_i = torch.tensor([0.375], device="cuda")
    emu["exact sums: emulated_mm == definition (no alpha)"] = bytes_equal(
        G.emulated_mm(ai, bi, out_dtype=torch.float32), G.emulated_reference_mm(ai, bi).float())
    emu["exact sums: emulated_mm == definition (alpha)"] = bytes_equal(
        G.emulated_mm(ai, bi, alpha_i, out_dtype=torch.bfloat16),
        G.emulated_reference_mm(ai, bi, alpha_i).float().to(torch.bfloat16))
    # NVFP4's factors formed in the multiply-and-cast kernel (the path the NVFP4 GEMMs take)
    # against the same GEMM with the torch-op factors: equal bytes, special amaxes included.
    amaxes = [(3.0, 0.7), (0.0, 5.0), (float("inf"), 2.0), (1e-30, 1e30), (float("nan"), 1.0), (float(N.amax(x)), 6.0)]
    emu["nvfp4 factors in the kernel == torch-op factors"] = all(
        bytes_equal(G.nvfp4_emulated_mm(lhs, rhs, torch.tensor([u], device="cuda"), torch.tensor([v], device="cuda"),
                                        out_dtype=dtype),
                    G.emulated_mm(lhs, rhs, G.nvfp4_alpha(torch.tensor([u], device="cuda"), torch.tensor([v], device="cuda")),
                                  out_dtype=dtype))
        for lhs, rhs in ((ai, bi), (A, B)) for u, v in amaxes for dtype in (torch.bfloat16, torch.float32))
    report["emulated_gemm"] = emu


def check_compile(report: dict[str, Any]) -> None:
    from tetrt_support.report.fake_impl_measure import tiny_mlp, train

    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(256, 128, device="cuda", generator=g)
    target = torch.randn(256, 64, device="cuda", generator=g)
    for fake_impl in ("tensor_proto", "make_empty_traceable"):
        for recipe in ("fp8_current", "fp8_block", "mxfp8", "nvfp4"):
            try:
                model = tiny_mlp(recipe, fake_impl, sizes=(128, 128, 64)).cuda()
                rep, _ = train(model, x, target, steps=4, backend="inductor")
                rows.append({"fake_impl": fake_impl, "recipe": recipe, "frames": rep.frames, "graphs": rep.graphs,
                             "graph_breaks": rep.graph_breaks, "losses": rep.losses})
            except Exception as e:  # noqa: BLE001
                rows.append({"fake_impl": fake_impl, "recipe": recipe, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    report["compile"] = rows


#: the recipes with an inline step, and the (tokens, in, out, bias) cases each is checked on
#: (on CUDA, _scaled_mm needs multiples of 16 and the block formats' GEMM multiples of 128 and
#: no bias; else auto takes the custom ops)
INLINE_RECIPES = ("fp8_current", "fp8_block")
INLINE_SHAPES = {
    "fp8_current": [(t, k, n, bias) for t, k, n in ((2048, 1024, 512), (4096, 4096, 4096), (1008, 2048, 4096))
                    for bias in (False, True)],
    "fp8_block": [(2048, 1024, 512, False), (4096, 4096, 4096, False), (2048, 4096, 14336, False),
                  (2048, 14336, 4096, False)],
}


def check_inline(report: dict[str, Any]) -> None:
    """Each recipe's inline step (``compile_as="inline"`` under torch.compile, inductor on
    CUDA) against the custom ops run eagerly with the kernels: y, dgrad, wgrad (and dbias)
    byte for byte, per shape, with the recipe's GEMM settings."""
    import warnings

    from tetrt_support.quant.linear import Linear

    warnings.filterwarnings("ignore", message=r"quant\.Linear\(compile_as='inline'\)")
    for recipe in INLINE_RECIPES:
        rows = []
        for t, k, n, bias in INLINE_SHAPES[recipe]:
            torch.manual_seed(1)
            eager = Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16, compile_as="custom_ops", recipe=recipe)
            inline = Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16, compile_as="inline", recipe=recipe)
            inline.load_state_dict(eager.state_dict())
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
            torch._dynamo.reset()
            outs = []
            for layer, fn in ((eager, eager), (inline, torch.compile(inline, fullgraph=True))):
                xi = x.clone().requires_grad_(True)
                y = fn(xi)
                y.backward(dy)
                outs.append([y, xi.grad, layer.weight.grad] + ([layer.bias.grad] if bias else []))
            names = ["y", "dgrad", "wgrad", "dbias"]
            rows.append({"shape": [t, k, n], "bias": bias,
                         "equal": {nm: bytes_equal(a, b) for nm, a, b in zip(names, *outs)},
                         "mismatches": {nm: mismatches(a, b) for nm, a, b in zip(names, *outs)}})
        report[f"inline_{recipe}"] = rows


def inline_decoder_runs(device: str = "cuda", recipe: str = "fp8_current") -> dict[str, Any]:
    """A whole tiny decoder converted to ``recipe``, through the inline step (eager,
    aot_eager, inductor; and aot_eager with SDPA's math kernel) and the custom ops (eager,
    inductor), against the custom ops run eagerly: the loss and each parameter's gradient
    norm. The inline step is not trusted on CUDA until this matches (on an H200 every
    converted weight's gradient once came out 0.0; ``quant/inline_linear.py``). ``device``
    lets the same runs be made on the CPU."""
    import copy
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tetrt_support.quant import convert_to_quantized_training
    from tetrt_support.zoo.decoder import Decoder, decoder_config

    warnings.filterwarnings("ignore", message=r"quant\.Linear\(compile_as='inline'\)")
    config = decoder_config("tiny", layers=1, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1024)
    base = Decoder(config, seed=0, device=device, dtype=torch.bfloat16)
    g = torch.Generator(device=device).manual_seed(0)
    ids, labels = (torch.randint(0, config.vocab, (2, 256), device=device, generator=g) for _ in range(2))
    runs: dict[str, Any] = {}
    plans = (("custom_ops eager", "custom_ops", None, False), ("custom_ops inductor", "custom_ops", "inductor", False),
             ("inline eager", "inline", None, False), ("inline aot_eager", "inline", "aot_eager", False),
             ("inline aot_eager, math sdpa", "inline", "aot_eager", True), ("inline inductor", "inline", "inductor", False))
    for name, compile_as, backend, math_sdpa in plans:
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        convert_to_quantized_training(model, recipe, module_filter_fn=lambda m, fqn: fqn != "lm_head",
                                      compile_as=compile_as)
        try:
            with sdpa_kernel(SDPBackend.MATH) if math_sdpa else contextlib.nullcontext():
                loss = (torch.compile(model, backend=backend) if backend else model)(ids, labels)
                loss.backward()
        except Exception as e:  # noqa: BLE001 - record the failure, run the others
            runs[name] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
            continue
        runs[name] = {"loss": loss.item(), "grad_norms": {n: (None if p.grad is None else p.grad.float().norm().item())
                                                          for n, p in model.named_parameters()}}
    reference = runs["custom_ops eager"]["grad_norms"]
    for name, run in runs.items():
        if "grad_norms" not in run:
            continue
        run["zero_or_missing_grads"] = [n for n, v in run["grad_norms"].items() if not v]
        run["max_rel_norm_diff"] = max((abs(v - reference[n]) / reference[n] for n, v in run["grad_norms"].items()
                                        if v and reference[n]), default=None)
    return runs


def inline_cases(device: str = "cuda", recipe: str = "fp8_current") -> dict[str, Any]:
    """Which use of one inline ``recipe`` Linear loses its gradients when compiled: a 3-D
    input, a non-leaf input, a residual, a small or a mean-reduced loss, cross-entropy, the
    layer applied twice -- each under aot_eager against the same call run eagerly (weight
    and input gradient norms). Narrows down the whole-decoder failure of
    :func:`inline_decoder_runs`; ``device`` lets the same runs be made on the CPU."""
    import warnings

    from tetrt_support.quant.linear import Linear

    warnings.filterwarnings("ignore", message=r"quant\.Linear\(compile_as='inline'\)")
    target = torch.zeros(256, dtype=torch.long, device=device)
    cases = {
        "3-D input, sum": lambda lin, x: lin(x).float().sum(),
        "2-D input, sum": lambda lin, x: lin(x.reshape(-1, 256)).float().sum(),
        "non-leaf input": lambda lin, x: lin(x * 2).float().sum(),
        "residual, mean square": lambda lin, x: (x + lin(x)).float().pow(2).mean(),
        "small loss": lambda lin, x: lin(x).float().sum() * 1e-6,
        "cross-entropy": lambda lin, x: torch.nn.functional.cross_entropy(lin(x).reshape(-1, 256).float(), target),
        "applied twice": lambda lin, x: lin(lin(x)).float().pow(2).mean(),
    }
    rows: dict[str, Any] = {}
    for name, loss_of in cases.items():
        norms = {}
        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            torch.manual_seed(0)
            lin = Linear(256, 256, bias=False, device=device, dtype=torch.bfloat16, compile_as="inline", recipe=recipe)
            x = torch.randn(2, 128, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
            fn = (lambda v, lin=lin: loss_of(lin, v)) if backend == "eager" else torch.compile(
                lambda v, lin=lin: loss_of(lin, v), backend=backend)
            try:
                fn(x).backward()
                norms[backend] = [lin.weight.grad.float().norm().item(), x.grad.float().norm().item()]
            except Exception as e:  # noqa: BLE001 - record it, run the other cases
                norms[backend] = f"{type(e).__name__}: {str(e)[:200]}"
        rows[name] = {**norms, "equal": norms["eager"] == norms["aot_eager"]}
    return rows


#: the parts that run on a CPU too (``--device cpu``)
CPU_PARTS = ("inline_decoder", "inline_cases")


def check_inline_cases(report: dict[str, Any], device: str = "cuda") -> None:
    """:func:`inline_cases` on ``device``, per recipe with an inline step."""
    for recipe in INLINE_RECIPES:
        report[f"inline_{recipe}_cases"] = inline_cases(device, recipe)


def check_inline_decoder(report: dict[str, Any], device: str = "cuda") -> None:
    """:func:`inline_decoder_runs` on ``device``, per recipe with an inline step."""
    for recipe in INLINE_RECIPES:
        report[f"inline_{recipe}_decoder"] = inline_decoder_runs(device, recipe)


def time_kernels(report: dict[str, Any]) -> None:
    """Median GPU time of each kernel at one training size (bandwidth against the bytes it must move).

    Timed as CUDA-graph replays (``do_bench_cudagraph``): at this size a kernel's Python launch
    costs about as much as the kernel, and a plain loop of launches would time the host."""
    import triton.testing

    from tetrt_support.quant.kernels import float8 as F
    from tetrt_support.quant.kernels import gemm as G
    from tetrt_support.quant.kernels import mxfp8 as MX
    from tetrt_support.quant.kernels import nvfp4 as NV
    from tetrt_support.quant.kernels._common import tensor_amax_bits

    m, k, n = 8192, 4096, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    e4 = torch.float8_e4m3fn
    xr, xs, _, _ = F.blockwise_quantize(x, e4, 1)
    wr, ws, _, _ = F.blockwise_quantize(w, e4, 2)
    wr1, ws1, _, _ = F.blockwise_quantize(w, e4, 1)  # 1 x 128 on both operands: the wgrad's scaling
    xm, xms, _, _ = MX.mxfp8_quantize(x, e4)
    xn, xns, _, _, _ = NV.nvfp4_quantize(x)
    a16, b16 = x.clone(), w.clone()
    alpha = torch.tensor([0.5], device="cuda")
    from tetrt_support.quant import numerics
    from tetrt_support.quant.kernels.hadamard import rht_transpose

    cases = {
        "amax": (lambda: tensor_amax_bits(x), 2 * m * k),
        "current_scaling rowwise+transpose": (lambda: F.current_scaling_quantize(x, e4, rowwise=True, columnwise=True),
                                              2 * m * k * 2 + 2 * m * k),
        "blockwise 1x128 both": (lambda: F.blockwise_quantize(x, e4, 1, rowwise=True, columnwise=True), 2 * m * k + 2 * m * k),
        f"blockwise 128x128 both ({n}x{k} weight)": (lambda: F.blockwise_quantize(w, e4, 2, rowwise=True, columnwise=True), 4 * n * k),
        "mxfp8 both": (lambda: MX.mxfp8_quantize(x, e4, rowwise=True, columnwise=True), 2 * m * k + 2 * m * k),
        "mxfp8 dequantize bf16": (lambda: MX.mxfp8_dequantize_bf16(xm, xms, 1, 32), 3 * m * k),
        "nvfp4 both (amax included)": (lambda: NV.nvfp4_quantize(x, rowwise=True, columnwise=True), 2 * m * k * 2 + m * k),
        "nvfp4 operand bf16": (lambda: NV.nvfp4_operand_bf16(xn, xns), 2.5 * m * k),
        "rht transpose (nvfp4 column-wise operand)": (lambda: rht_transpose(x, numerics.TE_RHT_SIGN_MASK), 4 * m * k),
        "copy bf16 (ceiling)": (lambda: x.clone(), 4 * m * k),
    }
    out: dict[str, Any] = {}

    def median_ms(name: str, fn: Any) -> float:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        except Exception:  # noqa: BLE001 - not capturable: time launches (host included)
            out.setdefault("timed_without_graphs", []).append(name)
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    for name, (fn, nbytes) in cases.items():
        try:
            ms = median_ms(name, fn)
            out[name] = {"us": round(ms * 1e3, 1), "GBps": round(nbytes / ms / 1e6, 0)}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    gemms = {
        "bf16 mm": (lambda: torch.mm(a16, b16.t())),
        "blockwise fp8 mm 1x128 x 128x128": (lambda: G.blockwise_fp8_mm(xr, xs, wr, ws, b_two_d=True)),
        "blockwise fp8 mm 1x128 x 1x128": (lambda: G.blockwise_fp8_mm(xr, xs, wr1, ws1, b_two_d=False)),
        "emulated mm fp32 out + alpha": (lambda: G.emulated_mm(a16, b16, alpha)),
    }
    for name, fn in gemms.items():
        try:
            ms = median_ms(name, fn)
            out[name] = {"us": round(ms * 1e3, 1), "TFLOPs": round(2 * m * n * k / ms / 1e9, 0)}
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    report["kernel_times_8192x4096"] = out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: kernels,kernels_autotuned,quantizers,linear,gemms,times,compile,inline,"
                        "inline_decoder,inline_cases")
    parser.add_argument("--only", default="", help="comma-separated parts to run (default: every part not skipped)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: only the parts that also run there (inline_decoder, inline_cases), e.g. under "
                        "another torch version than CI's")
    args = parser.parse_args()
    if args.device == "cpu":
        args.only = args.only or ",".join(CPU_PARTS)
        if set(args.only.split(",")) - set(CPU_PARTS):
            parser.error(f"--device cpu runs only {', '.join(CPU_PARTS)}")
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device", file=sys.stderr)
        return 2
    skip = set(filter(None, args.skip.split(",")))
    from benchmarks import record

    report: dict[str, Any] = {"benchmark": "gpu_check", "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
                              "machine": record.machine(args.device)}
    started = time.perf_counter()
    kernel_rows: list[dict[str, Any]] = []
    def fixed_tiles() -> None:  # the broad matrix on each kernel's default tile sizes (no autotuning)
        os.environ["TETRT_KERNELS_AUTOTUNE"] = "0"
        try:
            check_kernels(kernel_rows)
            check_e2m1_codes(kernel_rows)
        finally:
            os.environ["TETRT_KERNELS_AUTOTUNE"] = "1"

    def tuned_tiles() -> None:  # the tile sizes the autotuner picks at a training size
        check_kernels(kernel_rows, shapes=[(4096, 4096)], dtypes=(torch.bfloat16,), label=" autotuned")

    for part, fn in (("kernels", fixed_tiles), ("kernels_autotuned", tuned_tiles),
                     ("quantizers", lambda: check_quantizers(kernel_rows)), ("linear", lambda: check_linear(report)),
                     ("gemms", lambda: check_gemms(report)), ("times", lambda: time_kernels(report)),
                     ("compile", lambda: check_compile(report)), ("inline", lambda: check_inline(report)),
                     ("inline_decoder", lambda: check_inline_decoder(report, args.device)),
                     ("inline_cases", lambda: check_inline_cases(report, args.device))):
        if part in skip or (args.only and part not in args.only.split(",")):
            continue
        t0 = time.perf_counter()
        print(f"gpu_check: {part} ...", flush=True)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report the part as failed, run the others
            report[f"{part}_error"] = record.error_record(e)["error"]
            report[f"{part}_error_package_frames"] = record.package_frames(e)
        report[f"{part}_s"] = round(time.perf_counter() - t0, 1)
        report["bit_identity"] = kernel_rows
        with open(args.out, "w") as f:  # after every part: a later part that hangs loses nothing
            json.dump(report, f, indent=1)
    report["bit_identity"] = kernel_rows
    report["wall_s"] = round(time.perf_counter() - started, 1)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    failed = [r for r in kernel_rows if not r.get("ok")]
    print(f"bit-identity cases: {len(kernel_rows)}, failed: {len(failed)}")
    for r in failed[:40]:
        bad = {k: v for k, v in r.get("buffers", {}).items() if not v["equal_cpu_reference"]}
        print("  FAIL", r["case"], bad or r.get("error"))
    cuda_diff = sorted({r["case"].split(" ")[0] + " " + k for r in kernel_rows for k, v in r.get("buffers", {}).items()
                        if v.get("cuda_eager_reference_equals_cpu") is False})
    print("cuda eager reference differs from cpu in:", cuda_diff[:20])
    for key in ("fp8_blockwise_gemm", "emulated_gemm", "linear_y_dx_dw", "kernel_times_8192x4096", "compile",
                *(f"inline_{r}{part}" for r in INLINE_RECIPES for part in ("", "_decoder", "_cases"))):
        print(key, json.dumps(report.get(key), indent=None)[:1500])
    for key in [k for k in report if k.endswith("_error")]:
        print(key, report[key], *(f"\n  at {f}" for f in report.get(f"{key}_package_frames", [])))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
