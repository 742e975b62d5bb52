"""test_pointer_tma_fuzz's drawn pointer kernels on the GPU, launched as a user launches
them (torch tensors, views into bigger buffers, the launcher's own specialization), by
default and with pointer_tma=False, against the same numpy float64 model of the pointer
arithmetic: where the emulator's TMA model and the hardware's tensor maps could differ
(the maps' encoding rules, out-of-bounds fills), the hardware's answer is checked."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from .test_pointer_tma_fuzz import NAMES, cdiv, drawn_cases, extent, fuzzed_matmul, model, operand_reads

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


@pytest.mark.filterwarnings("ignore::weft.compiler.errors.CompilationWarning")
@settings(max_examples=1000 if DEEP else 30, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=drawn_cases())
def test_pointer_kernels_match_the_model_on_the_gpu(drawn):
    case, v, num_warps, num_stages, starts = drawn
    reads = [read for _, _, dots in operand_reads(case, v) for pair in dots for read in pair]
    rng = np.random.default_rng(0)
    buffers = [rng.standard_normal(start + extent(reads[i::2]) + 8).astype(np.float16)
               for i, start in enumerate(starts)]
    expected = model(case, v, *(buffer[start:] for buffer, start in zip(buffers, starts)))
    a, b = (torch.from_numpy(buffer).cuda()[start:] for buffer, start in zip(buffers, starts))
    grid = (cdiv(v["M"], case["BLOCK_M"]), cdiv(v["N"], case["BLOCK_N"]))
    for options in ({}, {"pointer_tma": False}):
        c = torch.zeros((v["M"], v["N"]), dtype=torch.float32, device="cuda")
        fuzzed_matmul[grid](a, b, c, *(v[name] for name in NAMES[3:]), **case, num_warps=num_warps,
                            num_stages=num_stages, **options)
        np.testing.assert_allclose(c.cpu().numpy(), expected, rtol=1e-3, atol=1e-3 * (1 + v["K"]),
                                   err_msg=f"options {options}")


@pytest.mark.parametrize("stride_sign", [0, -1])
def test_a_zero_or_negative_row_stride_matches_the_model(stride_sign):
    """B's K rows read through a stride of 0 (one row broadcast, as an expanded tensor's) or
    a negative one (the rows from the last up, the base pointer at the last row): a launch
    specializes both as divisible by 16, so the prover makes B a box; a zero stride is a
    tensor map's, a negative one is not, and that launch takes the pointer_tma=False variant."""
    m, n, k, block = 64, 64, 96, 32
    gen = torch.Generator(device="cuda").manual_seed(40)
    a = torch.randn(m, k, device="cuda", generator=gen).half()
    b = torch.randn(k, n, device="cuda", generator=gen).half()
    if stride_sign == 0:
        b_base, stride_bk, b_logical = b[0], 0, b[:1].expand(k, n)
    else:
        b_base, stride_bk, b_logical = b[k - 1], -n, b.flip(0)
    case = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=block, RECOMPUTED=False, MASK_A=2, MASK_B=1, ODD=0, FIRST=0, STEP=1,
                B_LOADED_T=False, MASK_B_T=2, WS=False)
    values = dict(M=m, N=n, K=k, stride_am=k, stride_ak=1, stride_bk=stride_bk, stride_bn=1, stride_cm=n, row_a=0,
                  col_b=0, advance_k=block)
    for options in ({}, {"pointer_tma": False}):
        c = torch.zeros((m, n), dtype=torch.float32, device="cuda")
        fuzzed_matmul[(1, 1)](a, b_base, c, *(values[name] for name in NAMES[3:]), **case, num_warps=4, num_stages=3,
                              **options)
        torch.testing.assert_close(c, a.float() @ b_logical.float(), rtol=1e-3, atol=1e-2, msg=f"options {options}")
