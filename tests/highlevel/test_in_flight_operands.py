"""A pipelined loop of two dots into two accumulators leaves the second wgmma in flight
past the loop; the wait that retires it comes after the first accumulator's layout
conversion, whose shared scratch must not reuse the ring slots that wgmma still reads
(allocate_shared_memory keeps an async wgmma's operands live until its wait:
compiler/passes/wgmma_retirement.py). On the emulator, with its race detection, against
numpy float64, at every ring depth (3 and 4 stages raced before the fix)."""

import dataclasses

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.runtime.emulator import emulate

RNG = np.random.default_rng(50)


@tl.jit
def two_products(a_ptr, b_ptr, c_ptr, x_ptr, y_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """x = a @ b and y = a @ c, a [BLOCK_M, K], b and c [K, BLOCK_N] row-major (K a multiple
    of BLOCK_K): two dots an iteration sharing the A tile."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * K + inner[None, :]
    b_ptrs = b_ptr + inner[:, None] * BLOCK_N + cols[None, :]
    c_ptrs = c_ptr + inner[:, None] * BLOCK_N + cols[None, :]
    x = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    y = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs)
        x += tl.dot(a, tl.load(b_ptrs))
        y += tl.dot(a, tl.load(c_ptrs))
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * BLOCK_N
        c_ptrs += BLOCK_K * BLOCK_N
    out = rows[:, None] * BLOCK_N + cols[None, :]
    tl.store(x_ptr + out, x)
    tl.store(y_ptr + out, y)


SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "x_ptr": "*fp32", "y_ptr": "*fp32", "K": "i32"}
BLOCK = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)


def prepared(stages: int):
    tile = build_kernel(two_products, SIGNATURE, BLOCK, 4, {}, language="highlevel")
    tile = dataclasses.replace(tile, num_stages=stages)
    return pipeline.prepare_for_emulator(tile)


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_two_accumulators_match_numpy_and_race_nothing(stages):
    kernel = prepared(stages)
    k = 5 * BLOCK["BLOCK_K"]
    a = RNG.standard_normal((64, k)).astype(np.float16)
    b, c = (RNG.standard_normal((k, 64)).astype(np.float16) for _ in range(2))
    x, y = np.full((64, 64), np.nan, np.float32), np.full((64, 64), np.nan, np.float32)
    emulate(kernel, (1,), [a, b, c, x, y, k])  # raises on a shared-memory race
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(x, a64 @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, a64 @ c.astype(np.float64), rtol=1e-5, atol=1e-5)

