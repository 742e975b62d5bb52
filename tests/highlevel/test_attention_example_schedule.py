"""The wait schedule of the attention example's pipelined loop (pipeline_chained_dots,
merge_wgmma_waits): per iteration one warpgroup_mma_wait (Q K^T's, which also retires the
P V wgmma the iteration before left in flight), no fence_async_shared (one before the loop:
hoist_copy_fences), two CTA barriers
(the ring's wait_group, and the refill of the slot the last P V read); the P V wgmma's
result leaves the body unwaited, and the loop's exit waits for it. A hypothesis property
runs the example on the emulator (races and in-flight reads flagged) over tiles, warps,
stages, causal and tails; the configs of benchmarks/highlevel_attention.py assemble
without spills."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft.compiler.ir import (Barrier, Block, FenceAsyncShared, For, Value, WarpgroupMma, WarpgroupMmaWait, Yield)
from weft.compiler.passes import pipeline_dot_loops
from weft.compiler.passes.merge_wgmma_waits import merge_block
from weft.compiler.types import TensorType, fp32
from weft.highlevel import attention_example
from weft.highlevel.jit import compile_kernel
from weft.runtime.emulator.errors import EmulationError

from ._compile import HAS_PTXAS
from .test_attention_example import SIGNATURE, SPECIALIZATION, constexprs, reference

RNG = np.random.default_rng(47)
DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


def prepared(head_dim=64, block=(128, 64), causal=False, num_warps=8, stages=3):
    """The example at `layout` on cp.async rings (block_pointer_tma=False: the block-pointer
    loads kept), Q K^T issued in its own iteration (issue_dot_ahead off:
    test_attention_overlap.py checks that schedule)."""
    return compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(head_dim, block, causal),
                          SPECIALIZATION, {"num_warps": num_warps, "target": "emulator", "num_stages": stages,
                                           "dot_ahead": False, "block_pointer_tma": False})


def per_iteration(loop: For) -> dict:
    ops = list(loop.body.walk())
    return {kind.__name__: sum(isinstance(op, kind) for op in ops)
            for kind in (WarpgroupMmaWait, FenceAsyncShared, Barrier, WarpgroupMma)}


@pytest.mark.parametrize("head_dim,block,causal", [(64, (128, 64), False), (64, (128, 64), True),
                                                   (128, (128, 128), False)])
def test_one_wait_no_fence_and_pv_left_in_flight_per_iteration(head_dim, block, causal):
    kernel = prepared(head_dim, block, causal)
    top = kernel.body.ops
    loops = [op for op in top if isinstance(op, For)]
    assert len(loops) == (2 if causal else 1)
    for loop in loops:
        assert per_iteration(loop) == {"WarpgroupMmaWait": 1, "FenceAsyncShared": 0, "Barrier": 2,
                                       "WarpgroupMma": 2}
        before = top[:top.index(loop)]  # Q's store, fenced once
        assert isinstance(next(op for op in reversed(before) if isinstance(op, (For, FenceAsyncShared))),
                          FenceAsyncShared)
        body = loop.body.ops
        qk, pv = [op for op in body if isinstance(op, WarpgroupMma)]
        (wait,) = [op for op in body if isinstance(op, WarpgroupMmaWait)]
        accumulator = next(i for i, v in enumerate(body[-1].values) if v is pv.result)  # yielded in flight
        assert wait.deps == (qk.result, loop.body.args[1 + accumulator])  # Q K^T's wait retires it
        assert body.index(wait) == body.index(qk) + 1 < body.index(pv)
        after = top[top.index(loop) + 1]  # the loop's exit waits for the last P V
        assert isinstance(after, WarpgroupMmaWait) and after.pending == 0
        assert after.deps == (loop.results[accumulator],)


def test_a_rescale_that_reads_the_accumulator_without_its_wait_is_flagged(monkeypatch):
    """The emulator checks the schedule: without the wait on the carried accumulator, the
    rescale reads the in-flight result of the last iteration's P V wgmma."""
    monkeypatch.setattr(pipeline_dot_loops, "accumulator_wait", lambda chained, arg, out: arg)
    q, k, v = ((0.5 * RNG.standard_normal((1, 1, 192, 64))).astype(np.float16) for _ in range(3))
    with pytest.raises(EmulationError, match="async `warpgroup_mma`"):
        attention_example.attention(q, k, v, False, block=(64, 64), num_warps=4, num_stages=3,
                                    block_pointer_tma=False)


def test_adjacent_waits_merge_into_one_of_the_smaller_count():
    tile = TensorType((64, 64), fp32)
    deps, results = [Value(tile) for _ in range(2)], [Value(tile) for _ in range(2)]
    block = Block((), (WarpgroupMmaWait(results=(results[0],), deps=(deps[0],), pending=1),
                       WarpgroupMmaWait(results=(results[1],), deps=(deps[1],), pending=0), Yield()))
    merged, end = merge_block(block).ops
    assert isinstance(end, Yield)
    assert merged.pending == 0 and merged.deps == tuple(deps) and merged.results == tuple(results)


@settings(max_examples=200 if DEEP else 6, deadline=None, suppress_health_check=list(HealthCheck))
@given(config=st.sampled_from([(64, (64, 64), 4), (64, (64, 32), 4), (64, (128, 64), 8), (128, (64, 64), 4),
                               (64, (128, 64), 4)]),
       stages=st.integers(2, 4), causal=st.booleans(), blocks=st.integers(1, 3), tail=st.integers(0, 40))
def test_attention_on_the_emulator_property(config, stages, causal, blocks, tail):
    """Any tile, warps, stages (2 keeps each dot's wait), causal or not, tails: the emulator
    (races, in-flight reads) agrees with numpy."""
    head_dim, block, num_warps = config
    n_ctx = max(1, blocks * block[0] - tail)
    q, k, v = ((0.5 * RNG.standard_normal((1, 1, n_ctx, head_dim))).astype(np.float16) for _ in range(3))
    out, lse = attention_example.attention(q, k, v, causal, block=block, num_warps=num_warps, num_stages=stages)
    expected, expected_lse = reference(q, k, v, causal, head_dim ** -0.5)
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("causal", [False, True])
def test_four_warps_with_both_tiles_in_flight_assemble_without_spills(causal):
    """benchmarks/highlevel_attention.py's 128x64 at 4 warps, 4 stages (head_dim 64): one
    warpgroup holds 128 rows of S and of the accumulator through the merged wait."""
    compiled = attention_example.attention_kernel.compile(signature=SIGNATURE,
                                                          constexprs=constexprs(64, (128, 64), causal),
                                                          num_warps=4, num_stages=4, specialization=SPECIALIZATION)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
