"""fp8 dots whose B is a [K, N] TMA box (`b_desc.load([k, n])`, B stored [K, N]): wgmma
reads 8-bit B K-major only, so each iteration copies the ring slot's box through
registers into a K-major buffer the wgmma reads (accelerate_dots), and the loop is
pipelined with TMA rings (pipeline_tma_loops' staged operands). Run on the CPU emulator,
whose race checks see every box in flight until its mbarrier wait and every wgmma operand
read until its wait, against numpy float64 of the same fp8 values, with tails in M, N and
K and 2-4 stages; the loop's IR; ptxas without spills at the tutorial's tiles; on a GPU,
against float32 torch."""

import re
import warnings

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.backend import ptxas
from weft.compiler.errors import CompilationWarning
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import For, MBarrierWait, SharedLoad, SharedStore, TmaAsyncCopyGlobalToShared, WarpgroupMma
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
from weft.runtime.emulator import emulate
from weft.runtime.emulator.dtypes import from_fp8, to_fp8

torch = pytest.importorskip("torch")  # fp8 host arrays

RNG = np.random.default_rng(4046)
FP8 = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}


@tl.jit
def kn_matmul(a_desc, b_desc, c_desc, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              STAGES: tl.constexpr):
    """C = A @ B with B stored [K, N], read as [BLOCK_K, BLOCK_N] boxes."""
    m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1) * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        acc = tl.dot(a_desc.load([m, k]), b_desc.load([k, n]), acc)
    c_desc.store([m, n], acc.to(c_desc.dtype))


def fp8_array(rows: int, cols: int, dtype: str, pad: int = 16):
    """Random fp8 [rows, cols] (rows padded to `pad` bytes, TMA strides) and its float64 values."""
    width = -(-max(cols, 1) // pad) * pad
    bits = to_fp8(RNG.standard_normal((rows, width)), dtype)
    values = from_fp8(bits, dtype).astype(np.float64)[:, :cols]
    return torch.from_numpy(bits).view(FP8[dtype])[:, :cols], values


def signature(dtype: str, block) -> dict:
    bm, bn, bk = block
    return {"a_desc": f"tensordesc<{dtype}[{bm},{bk}]>", "b_desc": f"tensordesc<{dtype}[{bk},{bn}]>",
            "c_desc": f"tensordesc<fp16[{bm},{bn}]>", "K": "i32"}


def constexprs(block, stages: int) -> dict:
    return dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2], STAGES=stages)


def prepared(dtype: str, block, stages: int, num_warps: int):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompilationWarning)  # the [K, N] box no longer warns
        return pipeline.prepare_for_emulator(build_kernel(kn_matmul, signature(dtype, block), constexprs(block, stages),
                                                          num_warps, {}, language="highlevel"))


def the_loop(kernel) -> For:
    return next(op for op in kernel.body.ops if isinstance(op, For))


@pytest.mark.parametrize("dtype, stages, num_warps", [("fp8e4m3", 2, 4), ("fp8e5m2", 3, 4), ("fp8e4m3", 4, 8)])
def test_matches_numpy_with_tails(dtype, stages, num_warps):
    block = (64 * num_warps // 4, 64, 64)
    m, n, k = block[0] + 22, 100, 200  # tails in M, N and K (TMA fills them with zeros)
    (a, a64), (b, b64) = fp8_array(m, k, dtype), fp8_array(k, n, dtype)
    c = torch.zeros((m, 112), dtype=torch.float16)[:, :n]
    kernel = prepared(dtype, block, stages, num_warps)
    descs = [TensorDescriptor.from_tensor(t, list(box)) for t, box in ((a, block[::2]), (b, block[2:0:-1]),
                                                                       (c, block[:2]))]
    emulate(kernel, (-(-m // block[0]), -(-n // block[1])), (*descs, k))
    reference = a64 @ b64
    scale = np.abs(a64) @ np.abs(b64)
    error = np.abs(c.double().numpy() - reference)
    assert (error <= 1e-5 * scale + 2 ** -10 * np.abs(reference) + 1e-6).all(), f"largest error {error.max()}"
