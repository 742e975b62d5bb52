"""What the attention example's loops compute per iteration, against what Triton 3.6 emits
for the same source: a block pointer's address is its offsets times the strides, one
scalar, plus a tile that does not depend on them (so a loop that advances the block
computes no 64-bit tile product); wgmma descriptors built where the wgmma is, from a
warp index ptxas knows to be uniform; loops that write shared memory by cp.async only
fenced once before, not every iteration (hoist_copy_fences); and the values still match numpy float64 on the
emulator (hypothesis over blocks, strides, offsets, edges; attention over tiles, tails
and causal)."""

import os
import re

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler.ir import Binary, FenceAsyncShared, For, WarpgroupMmaWait, is_tensor
from weft.compiler.types import i64
from weft.highlevel import attention_backward_example, attention_example
from weft.highlevel.jit import compile_kernel
from weft.kernels.attention import reference_attention_backward

from . import test_attention_backward_source as backward_source
from ._compile import HAS_PTXAS
from .test_attention_example import SIGNATURE, SPECIALIZATION, constexprs, reference

RNG = np.random.default_rng(48)
DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


def varying_tile_products(kernel) -> list[Binary]:
    """The i64 tile multiplies inside the kernel's loops that read a value that changes
    from iteration to iteration (derived from the loop's induction variable or carried
    values); the others ptxas computes once, before the loop."""
    found = []
    for loop in (op for op in kernel.walk() if isinstance(op, For)):
        varying = set(loop.body.args)
        for op in loop.body.walk():
            if any(value in varying for value in op.uses()):
                varying.update(op.defines())
                if (isinstance(op, Binary) and op.kind == "mul" and is_tensor(op.result)
                        and op.result.type.element == i64):
                    found.append(op)
    return found


def test_a_block_pointer_loop_steps_a_scalar():
    """K and V walked by tl.advance: each iteration's (and each refill's) address is the
    block's base plus offsets times strides (scalars) plus a loop-invariant tile, not
    (offset + i) * stride per element in 64 bits."""
    for causal in (False, True):
        kernel = compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(64, (128, 64), causal),
                                SPECIALIZATION, {"num_warps": 8, "target": "emulator", "num_stages": 3})
        assert varying_tile_products(kernel) == []


@tl.jit
def walk_blocks(x_ptr, out_ptr, M, N, stride_m, stride_n, row, col, STEPS: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, DM: tl.constexpr, DN: tl.constexpr, ORDER: tl.constexpr):
    """out[s] = the [BM, BN] block of x at (row + s * DM, col + s * DN), zero outside x."""
    block = tl.make_block_ptr(x_ptr, (M, N), (stride_m, stride_n), (row, col), (BM, BN), ORDER)
    dst = tl.make_block_ptr(out_ptr, (STEPS * BM, BN), (BN, 1), (0, 0), (BM, BN), (1, 0))
    for _ in range(STEPS):
        tl.store(dst, tl.load(block, boundary_check=(0, 1), padding_option="zero"))
        block = tl.advance(block, (DM, DN))
        dst = tl.advance(dst, (BM, 0))


@settings(max_examples=200 if DEEP else 8, deadline=None, suppress_health_check=list(HealthCheck))
@given(shape=st.tuples(st.integers(1, 40), st.integers(1, 40)), block=st.sampled_from([(8, 16), (16, 8), (4, 32)]),
       start=st.tuples(st.integers(-20, 40), st.integers(-20, 40)), move=st.tuples(st.integers(-9, 9), st.integers(-9, 9)),
       transposed=st.booleans(), steps=st.integers(1, 3))
def test_block_pointer_walks_match_numpy(shape, block, start, move, transposed, steps):
    """Any block, start (inside, across or past the edges), advance and strides (x stored
    transposed or not): each step's block is x's elements there, zeros outside."""
    m, n = shape
    x = RNG.standard_normal((n, m) if transposed else (m, n)).astype(np.float32)
    view = x.T if transposed else x
    strides = (1, m) if transposed else (n, 1)
    out = np.full((steps * block[0], block[1]), np.nan, np.float32)
    walk_blocks[(1,)](x, out, m, n, *strides, *start, STEPS=steps, BM=block[0], BN=block[1], DM=move[0], DN=move[1],
                      ORDER=(0, 1) if transposed else (1, 0))
    padded = np.zeros((m + 200, n + 200), np.float64)
    padded[100:100 + m, 100:100 + n] = view
    for s in range(steps):
        r, c = 100 + start[0] + s * move[0], 100 + start[1] + s * move[1]
        np.testing.assert_array_equal(out[s * block[0]:(s + 1) * block[0]], padded[r:r + block[0], c:c + block[1]])


@settings(max_examples=100 if DEEP else 4, deadline=None, suppress_health_check=list(HealthCheck))
@given(config=st.sampled_from([(64, (64, 32), 4), (64, (64, 64), 4), (128, (64, 64), 4)]),
       stages=st.sampled_from([None, 2, 3]), causal=st.booleans(), blocks=st.integers(1, 3),
       tail=st.integers(0, 40))
def test_attention_matches_numpy_property(config, stages, causal, blocks, tail):
    """The example with its block pointers split into scalar and tile and its loops' fences
    hoisted (or kept: no stages, the loop stores): values match float64 on the emulator
    (races, proxy fences and in-flight reads checked) over tiles, stages, causal, tails."""
    head_dim, block, num_warps = config
    n_ctx = max(1, blocks * block[0] - tail)
    q, k, v = ((0.5 * RNG.standard_normal((1, 1, n_ctx, head_dim))).astype(np.float16) for _ in range(3))
    out, lse = attention_example.attention(q, k, v, causal, block=block, num_warps=num_warps, num_stages=stages)
    expected, expected_lse = reference(q, k, v, causal, head_dim ** -0.5)
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-4, rtol=1e-5)


def loop_blocks(ptx: str) -> list[str]:
    """The PTX text of each basic block that holds a wgmma.mma_async."""
    blocks = re.split(r"\n(?=\$L__BB\d+_\d+:)", ptx)
    return [block for block in blocks if "wgmma.mma_async" in block]


def test_shared_operand_descriptors_are_built_at_each_wgmma_from_a_uniform_warp():
    """Q K^T reads Q through descriptors whose rows depend on the warpgroup: built where
    the wgmma is, from lane 0's warp index (shfl), ptxas makes them in uniform registers
    each iteration, as Triton does; computed once before the loop they were held in vector
    registers and moved to uniform ones (R2UR) before every wgmma. The first wgmma's
    block builds its descriptors from a shfl of the warp index, and steps them by adds."""
    compiled = attention_example.attention_kernel.compile(signature=SIGNATURE, constexprs=constexprs(64, (128, 64), False),
                                                          num_warps=8, num_stages=3, specialization=SPECIALIZATION)
    first = loop_blocks(compiled.asm["ptx"])[0]
    assert "shfl.sync.idx" in first.split("wgmma.mma_async")[0]
    # Each K step's descriptors are the first's plus 32 bytes (2 in the >> 4 field): 64-bit
    # adds (one UIADD3.64 each), not ors that ptxas builds as two halves per wgmma.
    steps = re.findall(r"add\.s64\s+%rd\d+, %rd\d+, (\d+);", first)
    assert {"2", "4", "6"} <= set(steps)
    if HAS_PTXAS:
        assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata


def fences_in_loops(kernel) -> list[int]:
    return [sum(isinstance(op, FenceAsyncShared) for op in loop.body.walk())
            for loop in kernel.body.ops if isinstance(loop, For)]


def test_loops_that_only_copy_by_cp_async_fence_before_not_inside():
    """Forward and backward: every pipelined loop writes shared memory by cp.async only, so
    it runs no proxy fence per iteration (ptxas made it MEMBAR.ALL.CTA and FENCE.VIEW.ASYNC.S
    behind dummy loads, which Triton's loops do not run); one fence before each loop
    covers the stores before it."""
    forward = compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(64, (128, 64), True),
                             SPECIALIZATION, {"num_warps": 8, "target": "emulator", "num_stages": 3,
                                              "block_pointer_tma": False})  # K and V by cp.async
    backward = compile_kernel(attention_backward_example.attention_backward_kernel, backward_source.SIGNATURE,
                              backward_source.constexprs(64, True), backward_source.SPECIALIZATION,
                              {**backward_source.LAUNCH, "target": "emulator"})
    for kernel, loops in ((forward, 2), (backward, 4)):
        assert fences_in_loops(kernel) == [0] * loops
        top = kernel.body.ops
        for i in (i for i, op in enumerate(top) if isinstance(op, For)):  # a fence since the last loop
            assert isinstance(next(op for op in reversed(top[:i]) if isinstance(op, (For, FenceAsyncShared))),
                              FenceAsyncShared)


def test_a_loop_that_stores_keeps_its_fence():
    """Unpipelined (no num_stages), the loop stores K and V itself: generic writes that
    wgmma reads, fenced every iteration (the emulator checks it in the property below)."""
    kernel = compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(64, (64, 64), False),
                            SPECIALIZATION, {"num_warps": 4, "target": "emulator", "block_pointer_tma": False})
    assert fences_in_loops(kernel) == [2]  # one per dot: K, then V


def dkdv_waits(sink: bool, causal: bool = False) -> list[list[tuple]]:
    """Per dK/dV loop of the tutorial backward: each wgmma wait's (pending, deps' names)."""
    kernel = compile_kernel(attention_backward_example.attention_backward_kernel, backward_source.SIGNATURE,
                            backward_source.constexprs(64, causal), backward_source.SPECIALIZATION,
                            {**backward_source.LAUNCH, "target": "emulator", "sink_waits": sink})
    loops = [op for op in kernel.body.ops if isinstance(op, For)]
    return [[(op.pending, tuple(dep.hint for dep in op.deps)) for op in loop.body.ops
             if isinstance(op, WarpgroupMmaWait)] for loop in loops[:len(loops) // 2]]


def test_sink_waits_issues_dv_and_dp_together():
    """With the launch option sink_waits, dV += P^T dO is not waited for before dP^T = V dO^T
    is issued: one wait(0) retires both, and dK += dS^T Q stays in flight across the back
    edge, retired by the next iteration's first wait (one wait after the loop), as in
    Triton's loop (off: a wait each)."""
    assert dkdv_waits(False) == [[(0, ("",)), (0, ("dv",)), (0, ("dp_t",)), (0, ("dk",))]]
    assert dkdv_waits(True) == [[(0, ("",)), (0, ("dv", "dp_t"))]]  # dK's: the next iteration's first


@settings(max_examples=50 if DEEP else 3, deadline=None, suppress_health_check=list(HealthCheck))
@given(blocks=st.integers(1, 3), causal=st.booleans(), sink=st.booleans())
def test_backward_matches_numpy_property(blocks, causal, sink):
    """The tutorial backward (its dK/dV loops' waits sunk or not, no proxy fence in its
    loops, ring slots by select): dq, dk, dv match float64 on the emulator."""
    seq, head_dim = 128 * blocks, 64
    q, k, v, do = ((0.5 * RNG.standard_normal((1, 1, seq, head_dim))).astype(np.float16) for _ in range(4))
    scale = head_dim ** -0.5
    out, lse = backward_source.forward(q, k, v, causal, scale)
    grads = attention_backward_example.attention_backward(q, k, v, out, lse, do, causal, sink_waits=sink)
    for name, got, expected in zip(("dq", "dk", "dv"), grads,
                                   reference_attention_backward(q, k, v, do, causal, scale)):
        np.testing.assert_allclose(got.astype(np.float64), expected, atol=4e-3 * np.abs(expected).max(), rtol=0,
                                   err_msg=name)
