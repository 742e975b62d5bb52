"""fit_ring_depth (compiler/ring_depth.py): a kernel whose loops run several dots an
iteration gets rings shallower than the launch's num_stages where those would keep fewer
CTAs on an SM than the register file holds (two of 4 warps at any register count). The
tutorial's attention backward at head_dim 128: 5 stages take 146 KB a CTA (one an SM), 3
take 113 KB (two); at head_dim 64 the 5 fit three CTAs and stay. A two-product loop of
our own is checked on the emulator (races, deadlocks) against float64 at the depth chosen;
a one-dot loop keeps its depth."""

import dataclasses

import numpy as np
import pytest

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import AsyncCopyWaitGroup
from weft.compiler.ring_depth import register_ctas, shared_ctas
from weft.highlevel import attention_backward_example
from weft.highlevel.jit import compile_kernel
from weft.runtime.emulator import emulate

from ._compile import HAS_PTXAS
from .test_attention_backward_source import LAUNCH, SIGNATURE, SPECIALIZATION, constexprs, forward

RNG = np.random.default_rng(47)


def tutorial(head_dim: int, causal: bool, **options):
    return compile_kernel(attention_backward_example.attention_backward_kernel, SIGNATURE,
                          constexprs(head_dim, causal), SPECIALIZATION, {**LAUNCH, "target": "emulator", **options})


def ring_waits(kernel) -> list[int]:
    return [op.pending for op in kernel.walk() if isinstance(op, AsyncCopyWaitGroup)]


@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_128_rings_leave_room_for_two_ctas(causal):
    kernel = tutorial(128, causal)
    assert register_ctas(kernel) == 2
    assert kernel.num_stages == 3 and shared_ctas(kernel.shared_bytes) == 2, kernel.shared_bytes
    # every ring 3 deep: each loop's wait leaves one group (iteration i + 1's copies) in flight
    assert set(ring_waits(kernel)) == {1}
    asked = tutorial(128, causal, fit_rings=False)
    assert asked.num_stages == 5 and shared_ctas(asked.shared_bytes) == 1
    assert set(ring_waits(asked)) == {3}


def test_head_dim_128_at_the_fitted_depth_matches_float64():
    """Not causal (the source tests emulate the causal kernel): 3-deep rings, emulated with
    race and deadlock checks, against float64."""
    from weft.kernels.attention import reference_attention_backward

    q, k, v, do = ((0.5 * RNG.standard_normal((1, 1, 256, 128))).astype(np.float16) for _ in range(4))
    scale = 128 ** -0.5
    out, lse = forward(q, k, v, False, scale)
    grads = attention_backward_example.attention_backward(q, k, v, out, lse, do, False)
    for name, got, expected in zip(("dq", "dk", "dv"), grads, reference_attention_backward(q, k, v, do, False, scale)):
        np.testing.assert_allclose(got.astype(np.float64), expected, atol=4e-3 * np.abs(expected).max(), rtol=0,
                                   err_msg=name)


def test_head_dim_64_keeps_the_launch_depth():
    kernel = tutorial(64, True)
    assert kernel.num_stages == 5 and set(ring_waits(kernel)) == {3}
    assert shared_ctas(kernel.shared_bytes) >= register_ctas(kernel)


@tl.jit
def two_products(a_ptr, b_ptr, c_ptr, x_ptr, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SECOND: tl.constexpr):
    """x = a @ b (+ a @ c, SECOND) for a [BLOCK_M, K], b and c [K, BLOCK_N], row-major, K a
    multiple of BLOCK_K: each iteration loads a tile of each and runs one or two dots into x."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * K + inner[None, :]
    b_ptrs = b_ptr + inner[:, None] * BLOCK_N + cols[None, :]
    c_ptrs = c_ptr + inner[:, None] * BLOCK_N + cols[None, :]
    x = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs)
        x = tl.dot(a, tl.load(b_ptrs), x)
        if SECOND:
            x = tl.dot(a, tl.load(c_ptrs), x)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * BLOCK_N
        c_ptrs += BLOCK_K * BLOCK_N
    tl.store(x_ptr + rows[:, None] * BLOCK_N + cols[None, :], x)


PRODUCTS_SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "x_ptr": "*fp32", "K": "i32"}


def products(block, second: bool, stages: int = 5, **options):
    """two_products at the `layout` stage the emulator runs, launched with `stages`."""
    tile = build_kernel(two_products, PRODUCTS_SIGNATURE, dict(BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2],
                                                               SECOND=second), 4, {}, language="highlevel")
    return pipeline.prepare_for_emulator(dataclasses.replace(tile, num_stages=stages, **options))


@pytest.mark.parametrize("k", [64, 320])  # one iteration (shorter than the prologue), five
def test_a_two_dot_loop_gets_the_deepest_ring_that_fits_two_ctas(k):
    block = (64, 64, 64)  # a slot of each ring: 8 KB; 3 rings x 5 slots = 120 KB, one CTA an SM
    kernel = products(block, True)
    assert kernel.num_stages == 4 and shared_ctas(kernel.shared_bytes) == 2, kernel.shared_bytes
    assert ring_waits(kernel) == [2]
    assert shared_ctas(products(block, True, fit_rings=False).shared_bytes) == 1
    a = RNG.standard_normal((block[0], k)).astype(np.float16)
    b, c = (RNG.standard_normal((k, block[1])).astype(np.float16) for _ in range(2))
    x = np.full(block[:2], np.nan, np.float32)
    emulate(kernel, (1,), [a, b, c, x, k])
    a64, b64, c64 = (m.astype(np.float64) for m in (a, b, c))
    scale = (np.abs(a64) @ (np.abs(b64) + np.abs(c64))).max()
    np.testing.assert_allclose(x, a64 @ b64 + a64 @ c64, rtol=0, atol=1e-5 * scale)


def test_a_one_dot_loop_keeps_its_depth():
    """One dot an iteration: the ring's depth is what hides the copies' latency."""
    kernel = products((128, 128, 64), False)  # 32 KB a slot, 160 KB: one CTA an SM
    assert kernel.num_stages == 5 and ring_waits(kernel) == [3] and shared_ctas(kernel.shared_bytes) == 1


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
def test_the_fitted_head_dim_128_kernel_fits_two_ctas_after_ptxas():
    """The launch's shared memory (what the driver sees) and ptxas's registers allow two
    CTAs an SM."""
    compiled = attention_backward_example.attention_backward_kernel.compile(
        signature=SIGNATURE, constexprs=constexprs(128, True), specialization=SPECIALIZATION, **LAUNCH)
    assert shared_ctas(compiled.metadata["shared"]) == 2
    assert 65536 // (128 * -(-compiled.metadata["registers"] // 8) * 8) >= 2
