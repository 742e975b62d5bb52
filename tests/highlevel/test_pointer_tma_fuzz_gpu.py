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
