"""The default split of chained-dot loops (pipeline_tma_warp_specialize.default_split_loops)
takes two loops in a row only when nothing but pure ops stands between them. A second loop
whose dot reads pointer loads is staged through a buffer of its own, allocated between the
loops, so the kernel stays in one partition, the first loop's TMA ring included; with both
loops over descriptor boxes the same kernel is split. Both run on the emulator against
numpy float64."""

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler.ir import For, WarpSpecialize
from weft.highlevel.tools.tensor_descriptor import TensorDescriptor

HEAD_DIM, BLOCK_M, BLOCK_N = 128, 128, 64  # a 96 KB ring at 3 stages: split by default at 8 warps


@tl.jit
def two_key_ranges(desc_q, desc_k, desc_v, K, Out, n_ctx, scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, SECOND_BY_POINTERS: tl.constexpr):
    """Out = (Q K^T * scale) V over the keys in two loops, the first half's K and V boxes by
    descriptors, the second half's K by pointers when SECOND_BY_POINTERS."""
    row = tl.program_id(0) * BLOCK_M
    q = desc_q.load([row, 0])
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    half = n_ctx // 2
    for start in tl.range(0, half, BLOCK_N):
        p = tl.dot(q, desc_k.load([start, 0]).T) * scale
        acc = tl.dot(p.to(tl.float16), desc_v.load([start, 0]), acc)
    for start in tl.range(half, n_ctx, BLOCK_N):
        if SECOND_BY_POINTERS:
            k = tl.load(K + (start + offs_n)[None, :] * HEAD_DIM + offs_d[:, None])
        else:
            k = desc_k.load([start, 0]).T
        p = tl.dot(q, k) * scale
        acc = tl.dot(p.to(tl.float16), desc_v.load([start, 0]), acc)
    rows = row + tl.arange(0, BLOCK_M)
    tl.store(Out + rows[:, None] * HEAD_DIM + offs_d[None, :], acc)


def run(second_by_pointers: bool, n_ctx: int = 256):
    rng = np.random.default_rng(48)
    q, k, v = ((0.5 * rng.standard_normal((n_ctx, HEAD_DIM))).astype(np.float16) for _ in range(3))
    out = np.empty((n_ctx, HEAD_DIM), np.float32)
    scale = HEAD_DIM ** -0.5
    two_key_ranges[(n_ctx // BLOCK_M,)](
        TensorDescriptor(q, [n_ctx, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM]),
        TensorDescriptor(k, [n_ctx, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM]),
        TensorDescriptor(v, [n_ctx, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM]),
        k, out, n_ctx, scale, HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        SECOND_BY_POINTERS=second_by_pointers, num_warps=8, num_stages=3)
    # P is rounded to fp16 before the second dot, as the kernel does.
    p = (q.astype(np.float64) @ k.astype(np.float64).T * scale).astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(out, p @ v.astype(np.float64), atol=2e-2, rtol=2e-3)




@pytest.mark.parametrize("second_by_pointers", [True, False])
def test_a_pointer_fed_second_loop_keeps_one_partition(second_by_pointers):
    from weft.highlevel.jit import compile_kernel

    signature = {"desc_q": f"tensordesc<fp16[{BLOCK_M},{HEAD_DIM}]>", "desc_k": f"tensordesc<fp16[{BLOCK_N},{HEAD_DIM}]>",
                 "desc_v": f"tensordesc<fp16[{BLOCK_N},{HEAD_DIM}]>", "K": "*fp16", "Out": "*fp32", "n_ctx": "i32",
                 "scale": "fp32"}
    kernel = compile_kernel(two_key_ranges, signature,
                            dict(HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                 SECOND_BY_POINTERS=second_by_pointers), {},
                            {"num_warps": 8, "target": "emulator", "num_stages": 3})
    splits = [op for op in kernel.walk() if isinstance(op, WarpSpecialize)]
    if second_by_pointers:
        assert not splits
    else:
        (split,) = splits  # both loops in one split
        assert sum(isinstance(op, For) for op in split.default.ops) == 2
    run(second_by_pointers)
