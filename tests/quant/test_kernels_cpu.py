"""The Triton kernels of ``tetrt_support.quant.kernels`` against ``numerics``, on the CPU.

The kernels run in Triton's interpreter (``TRITON_INTERPRET=1``), in a child process: the
variable must be set before the kernels are defined, and must not leak into the other
tests of the session. Under the interpreter the FP8 conversions are done in integer
arithmetic (the interpreter's own float8 cast truncates), so this checks every rule of
the kernels (amax, scales, blocks, layouts, packing, E2M1 rounding, stochastic rounding)
except the GPU's conversion instruction, which ``scripts/gpu_check.py`` checks on an H200.
The emulated GEMM's definition is checked here too (equality on exactly summable inputs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

# Triton is optional (only the CUDA fast paths need it): without it there is nothing to run.
pytest.importorskip("triton")

CHILD = textwrap.dedent(
    """
    import json, torch
    from tetrt_support.quant import numerics as N, philox
    from tetrt_support.quant.kernels import float8 as F, mxfp8 as MX, nvfp4 as NV, gemm as G
    from tetrt_support.quant.kernels.dequantize import blockwise_dequantize_bf16
    from tetrt_support.quant.kernels.transpose import transpose_fp8
    from tetrt_support.quant.kernels.hadamard import rht_transpose

    def same(a, b):
        a, b = a.contiguous(), b.contiguous()
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        if a.is_floating_point():
            na, nb = torch.isnan(a), torch.isnan(b)
            ints = torch.int32 if a.dtype == torch.float32 else torch.int16
            return torch.equal(na, nb) and torch.equal(a.view(ints)[~na], b.view(ints)[~nb])
        return torch.equal(a, b)

    def data(shape, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 2)
        flat = x.view(-1)
        for i, v in enumerate([float("nan"), -float("inf"), float("inf"), 0.0, -0.0, 448.0, 6.0, 2.5, 1e-39, 3e38,
                                  -float("nan")]):
            flat[7 * i + 3] = v
        x[1] *= 1e-20
        x[2] = 0.0
        return x.to(dtype)

    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        for shape in ((96, 160), (64, 256)):
            x = data(shape, dtype, sum(shape))
            xt = x.t().contiguous()
            tag = f"{str(dtype)[6:]} {shape}"
            for f8 in (torch.float8_e4m3fn, torch.float8_e5m2):
                for pow2 in (False, True):
                    d, t, si, am = F.current_scaling_quantize(x, f8, force_pow_2_scales=pow2, rowwise=True, columnwise=True)
                    rd, rsi, ram = N.float8_current_scaling_quantize(x, f8, force_pow_2_scales=pow2)
                    out[f"current {str(f8)[6:]} pow2={pow2} {tag}"] = [same(d, rd), same(t, rd.t()), same(si, rsi), same(am, ram)]
            for dim, br in ((1, 1), (2, 128)):
                a, b, c, e = F.blockwise_quantize(x, torch.float8_e4m3fn, dim, rowwise=True, columnwise=True)
                ra, rb = N.float8_blockwise_quantize(x, torch.float8_e4m3fn, br, 128)
                rc, re_ = N.float8_blockwise_quantize(xt, torch.float8_e4m3fn, br, 128)
                out[f"blockwise {br}x128 {tag}"] = [same(a, ra), same(b, rb), same(c, rc), same(e, re_)]
                # One layout alone (one program per tile), and amax_epsilon with a row of NaNs only
                # (its blocks' amax is 0 for the reference, so the epsilon sets their scale).
                xe = x.clone()
                xe[5] = float("nan")
                for rowwise, columnwise in ((True, False), (False, True)):
                    got = F.blockwise_quantize(xe, torch.float8_e4m3fn, dim, rowwise=rowwise, columnwise=columnwise,
                                               force_pow_2_scales=False, amax_epsilon=1e-3)
                    want = (N.float8_blockwise_quantize(xe, torch.float8_e4m3fn, br, 128, force_pow_2_scales=False,
                                                        amax_epsilon=1e-3) if rowwise else
                            N.float8_blockwise_quantize(xe.t().contiguous(), torch.float8_e4m3fn, br, 128,
                                                        force_pow_2_scales=False, amax_epsilon=1e-3))
                    kept = got[:2] if rowwise else got[2:]
                    out[f"blockwise {br}x128 one layout rowwise={rowwise} epsilon {tag}"] = [
                        same(kept[0], want[0]), same(kept[1], want[1]), (got[2] is None) == rowwise]
                out[f"blockwise {br}x128 bf16 operand {tag}"] = [
                    same(blockwise_dequantize_bf16(ra, rb, br),
                         (ra.float() * N.expand_block_scales(rb, br, 128, tuple(ra.shape))).to(torch.bfloat16))]
            if shape[0] % 32 == 0:
                a, b, c, e = MX.mxfp8_quantize(x, torch.float8_e4m3fn, rowwise=True, columnwise=True)
                ra, rb = N.mxfp8_quantize(x, torch.float8_e4m3fn, 1, 32)
                rc, re_ = N.mxfp8_quantize(x, torch.float8_e4m3fn, 32, 1)
                out[f"mxfp8 {tag}"] = [same(a, ra), same(b, rb), same(c, rc), same(e, re_)]
                a, b, _, _ = MX.mxfp8_quantize(x, torch.float8_e4m3fn, rowwise=True, columnwise=False)
                _, _, c, e = MX.mxfp8_quantize(x, torch.float8_e4m3fn, rowwise=False, columnwise=True)
                out[f"mxfp8 one layout per call {tag}"] = [same(a, ra), same(b, rb), same(c, rc), same(e, re_)]
                out[f"mxfp8 bf16 operand {tag}"] = [same(MX.mxfp8_dequantize_bf16(ra, rb, 1, 32),
                                                         N.mxfp8_dequantize(ra, rb, 1, 32).to(torch.bfloat16))]
            for br in (1, 16):
                a, b, c, e, am = NV.nvfp4_quantize(x, None, br, rowwise=True, columnwise=True)
                ram = N.amax(x)
                ra, rb = N.nvfp4_quantize(x, ram, br)
                rc, re_ = N.nvfp4_quantize(xt, ram, br)
                out[f"nvfp4 {br}x16 {tag}"] = [same(a, ra), same(b, rb), same(c, rc), same(e, re_), same(am.reshape(()), ram)]
            seed = torch.tensor([0x0123456789ABCDEF + 977 * len(out)], dtype=torch.int64)  # high and low words differ
            a, b, _, _, _ = NV.nvfp4_quantize(x, None, 1, seed=seed)
            ra, rb = N.nvfp4_quantize(x, N.amax(x), 1, uniform=philox.uniform(seed, tuple(x.shape)))
            out[f"nvfp4 stochastic {tag}"] = [same(a, ra), same(b, rb)]
            op = NV.nvfp4_operand_bf16(ra, rb)
            ref = N.e2m1_decode(N.unpack_fp4(ra)) * N.expand_block_scales(rb.float(), 1, 16, tuple(x.shape))
            out[f"nvfp4 bf16 operand {tag}"] = [same(op.float(), ref)]
            q = d
            out[f"transpose {tag}"] = [same(transpose_fp8(q), q.t().contiguous())]
            zeros = x.clone()
            zeros[:16, :3], zeros[:16, 3:6] = 0.0, -0.0  # whole groups of +0 and of -0: the sign of an exact zero
            for mask in (0, N.TE_RHT_SIGN_MASK, 0xFFFF):
                h = N.random_hadamard_matrix(mask)
                out[f"rht transpose {tag}"] = [same(rht_transpose(v, mask), N.apply_hadamard(v.t().contiguous(), h))
                                               for v in (x, zeros)]
    # E2M1 encoding, element by element: every bf16 value of magnitude up to 8 (so every
    # midpoint and grid value, and their neighbours), fp32 neighbours of the midpoints,
    # +-inf and NaN; stochastically with draws that hit the fractions exactly too.
    every_bf16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 2.0, 4.0])
    near = torch.cat([torch.nextafter(mids, torch.tensor(0.0)), mids, torch.nextafter(mids, torch.tensor(9.0))])
    values = torch.cat([every_bf16[every_bf16.abs() <= 8], near, -near, every_bf16[every_bf16.isnan()][:2],
                        torch.tensor([float("inf"), -float("inf"), 1e30, -0.0, 0.0, 1e-40])])
    clamped = values.clamp(-6.0, 6.0)
    out["e2m1 nearest-even codes"] = [same(NV.e2m1_codes(values), N.e2m1_encode(clamped))]
    for seed_u in range(3):
        u = torch.rand(values.shape, generator=torch.Generator().manual_seed(seed_u))
        u[::7] = 0.5
        u[1::7] = 0.0
        out["e2m1 stochastic codes"] = out.get("e2m1 stochastic codes", []) + [
            same(NV.e2m1_codes(values, u), N.e2m1_encode_stochastic(clamped, u))]
    g = torch.Generator().manual_seed(5)
    a = (torch.randint(-6, 7, (64, 96), generator=g).float() / 4).to(torch.bfloat16)
    b = (torch.randint(-6, 7, (32, 96), generator=g).float() / 2).to(torch.bfloat16)
    alpha = torch.tensor([0.375])
    out["emulated_mm exact"] = [same(G.emulated_mm(a, b, out_dtype=torch.float32), G.emulated_reference_mm(a, b).float()),
                                same(G.emulated_mm(a, b, alpha, out_dtype=torch.bfloat16),
                                     G.emulated_reference_mm(a, b, alpha).float().to(torch.bfloat16))]
    # NVFP4's per-tensor factors formed inside the multiply-and-cast kernel: the bits of the
    # torch-op factors, for ordinary, zero, infinite, NaN and extreme global amaxes (random
    # operands: the bf16 results round).
    ar, br_ = data((64, 96), torch.bfloat16, 11), data((32, 96), torch.bfloat16, 12)
    amaxes = [(3.0, 0.7), (0.0, 5.0), (float("inf"), 2.0), (1e-30, 1e30), (float("nan"), 1.0), (448.0 * 6, 6.0)]
    out["emulated_mm nvfp4 factors in the kernel"] = [
        same(G.nvfp4_emulated_mm(lhs, rhs, torch.tensor([u]), torch.tensor([v]), out_dtype=dtype),
             G.emulated_mm(lhs, rhs, G.nvfp4_alpha(torch.tensor([u]), torch.tensor([v])), out_dtype=dtype))
        for lhs, rhs in ((a, b), (ar, br_)) for u, v in amaxes for dtype in (torch.bfloat16, torch.float32)]
    # The quantizers' fast path (kernels.dispatch) against their reference, in the usages the
    # Linear makes (both in training, row-wise only without gradients), from the same RNG
    # state (NVFP4's stochastic rounding draws uniforms).
    import os
    from tetrt_support import quant
    from tetrt_support.quant import recipes
    from tetrt_support.quant.linear import Linear

    xq = data((128, 256), torch.bfloat16, 3)
    xq = torch.nan_to_num(xq.float(), nan=0.0, posinf=100.0, neginf=-100.0)
    # Triton's interpreter decodes bf16 subnormals wrongly (1.01e-39 is read as 4.4e-39), so
    # none here; the GPU check covers them on the hardware.
    xq = torch.where(xq.abs() < torch.finfo(torch.float32).tiny, torch.zeros_like(xq), xq).to(torch.bfloat16)
    for name in recipes.RECIPES:
        for role, quantizer in zip(("input", "weight", "grad"), recipes.get_recipe(name).quantizers()):
            for columnwise in (True, False):
                quantizer.set_usage(rowwise=True, columnwise=columnwise)
                got = {}
                for flag in ("1", "0"):
                    os.environ["TETRT_QUANT_KERNELS"] = flag
                    torch.manual_seed(5)
                    got[flag] = quantizer.quantize(xq)
                names, _ = got["0"].__tensor_flatten__()
                usage = "" if columnwise else " row-wise only"
                out[f"dispatch quantize {name}/{role}{usage}"] = [same(getattr(got["1"], n), getattr(got["0"], n))
                                                                 for n in names]
    # fp32 128 x 128 blocks take the kernel too (its explicit clamp; checked on the H200) and
    # give the reference's bytes.
    from tetrt_support.quant.kernels.dispatch import fast_buffers
    os.environ["TETRT_QUANT_KERNELS"] = "1"
    weight_quantizer = quant.Float8BlockQuantizer(block_scaling_dim=2, columnwise_usage=True)
    out["dispatch quantize 128x128 takes the kernel from fp32"] = [fast_buffers(weight_quantizer, xq.float(), {})
                                                                  is not None]
    got = {}
    for flag in ("1", "0"):
        os.environ["TETRT_QUANT_KERNELS"] = flag
        got[flag] = weight_quantizer.quantize(xq.float())
    names, _ = got["0"].__tensor_flatten__()
    out["dispatch quantize 128x128 from fp32"] = [same(getattr(got["1"], n), getattr(got["0"], n)) for n in names]
    # FP8 blockwise writes TE's GEMM-ready scale buffers directly: a row count that is not a
    # multiple of 4 makes the transposed 1 x 128 buffer padded (zeros, as the reference's).
    xb = xq.repeat(2, 2)[:130, :384].contiguous()
    for dim in (1, 2):
        quantizer = quant.Float8BlockQuantizer(block_scaling_dim=dim, columnwise_usage=True)
        got = {}
        for flag in ("1", "0"):
            os.environ["TETRT_QUANT_KERNELS"] = flag
            got[flag] = quantizer.quantize(xb)
        names, _ = got["0"].__tensor_flatten__()
        out[f"dispatch quantize padded blockwise {dim}D"] = [same(getattr(got["1"], n), getattr(got["0"], n))
                                                             for n in names]
    # A Linear step through the fast GEMMs: per-tensor FP8 gives the reference's bits; the
    # block formats differ only by the GEMM's rounding (bf16 operands, fp32 accumulation).
    for name in recipes.RECIPES:
        res = {}
        for flag in ("1", "0"):
            os.environ["TETRT_QUANT_KERNELS"] = flag
            torch.manual_seed(1)
            layer = Linear(256, 128, bias=False, recipe=name, dtype=torch.bfloat16)
            x = torch.randn(128, 256, dtype=torch.bfloat16, requires_grad=True)
            y = layer(x)
            y.backward(torch.randn(y.shape, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2)))
            res[flag] = (y.detach().double(), x.grad.double(), layer.weight.grad.double())
        rel = [float((a - b).norm() / b.norm()) for a, b in zip(res["1"], res["0"])]
        out[f"dispatch linear {name}"] = [r == 0.0 if name == "fp8_current" else r < 1e-3 for r in rel]
    os.environ["TETRT_QUANT_KERNELS"] = "1"
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted() -> dict[str, list[bool]]:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=root, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, f"interpreter run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT"):])


FAMILIES = ("current", "blockwise", "mxfp8", "nvfp4", "e2m1", "transpose", "rht transpose", "emulated_mm", "dispatch quantize",
            "dispatch linear")


@pytest.mark.parametrize("family", FAMILIES)
def test_kernels_match_reference_bytes(interpreted: dict[str, list[bool]], family: str) -> None:
    cases = {name: flags for name, flags in interpreted.items() if name.startswith(family)}
    assert cases, f"no {family} cases ran"
    failed = {name: flags for name, flags in cases.items() if not all(flags)}
    assert not failed, f"kernel buffers differ from the reference: {failed}"


def test_cpu_quantize_never_takes_the_kernel_path() -> None:
    """Without the interpreter, a CPU tensor always runs the reference (no Triton at all)."""
    from tetrt_support.quant import kernels
    from tetrt_support.quant.kernels.dispatch import fast_buffers
    from tetrt_support.quant.float8_tensor import Float8CurrentScalingQuantizer

    if kernels.interpreting():
        pytest.skip("this session itself runs under TRITON_INTERPRET=1")
    assert fast_buffers(Float8CurrentScalingQuantizer(), torch.randn(4, 8), {}) is None
