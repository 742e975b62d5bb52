"""On the GPU, weft.highlevel's tl.randint / tl.rand / tl.randn against Triton's on the same
source, bit for bit: Philox is integer arithmetic, and randn's Box-Muller takes libdevice's
logf, sinf and cosf and sqrt.approx.ftz, linked and flagged as Triton does. Triton is
imported inside the test (skipped without it).
"""

import numpy as np
import pytest

from weft import highlevel as wtl

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

N = 1024


@wtl.jit
def weft_streams(out_ptr, seed, start, N: wtl.constexpr):
    offs = start + wtl.arange(0, N)
    rows = wtl.arange(0, N)
    wtl.store(out_ptr + rows, wtl.randint(seed, offs).to(wtl.int32, bitcast=True).to(wtl.float32, bitcast=True))
    wtl.store(out_ptr + N + rows, wtl.rand(seed, offs))
    wtl.store(out_ptr + 2 * N + rows, wtl.randn(seed, offs))
    n0, n1, n2, n3 = wtl.randn4x(seed, offs)
    wtl.store(out_ptr + 3 * N + rows, n1)
    wtl.store(out_ptr + 4 * N + rows, n3)


def _triton_streams():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def triton_streams(out_ptr, seed, start, N: tl.constexpr):
        offs = start + tl.arange(0, N)
        rows = tl.arange(0, N)
        tl.store(out_ptr + rows, tl.randint(seed, offs).to(tl.int32, bitcast=True).to(tl.float32, bitcast=True))
        tl.store(out_ptr + N + rows, tl.rand(seed, offs))
        tl.store(out_ptr + 2 * N + rows, tl.randn(seed, offs))
        n0, n1, n2, n3 = tl.randn4x(seed, offs)
        tl.store(out_ptr + 3 * N + rows, n1)
        tl.store(out_ptr + 4 * N + rows, n3)

    return triton_streams


@pytest.mark.parametrize("seed, start", [(12345, 0), (-7, 1 << 20), (2**40 + 3, -5000)])
def test_random_streams_match_triton_bit_for_bit(seed, start):
    triton_streams = _triton_streams()
    ours = torch.full((5 * N,), float("nan"), device="cuda")
    theirs = torch.full((5 * N,), float("nan"), device="cuda")
    weft_streams[(1,)](ours, seed, start, N=N)
    triton_streams[(1,)](theirs, seed, start, N=N)
    torch.cuda.synchronize()
    ours, theirs = ours.cpu().numpy().view(np.uint32), theirs.cpu().numpy().view(np.uint32)
    for row, name in enumerate(("randint", "rand", "randn", "randn4x[1]", "randn4x[3]")):
        mismatched = np.flatnonzero(ours[row * N:(row + 1) * N] != theirs[row * N:(row + 1) * N])
        assert mismatched.size == 0, f"{name}: {mismatched.size} of {N} differ, first at {mismatched[:4]}"
