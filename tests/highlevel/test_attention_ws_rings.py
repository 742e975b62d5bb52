"""The descriptor attention forward of highlevel/attention_descriptor_example.py in one
partition: its K and V boxes ringed by TMA (pipeline_tma_loops with two dots: Q read from
its one buffer, P from registers, P V left in flight across the back edge). On the CPU
emulator (race and deadlock checks on, TMA completions shuffled) against numpy float64,
causal and not, tails, head_dim 64 and 128; its IR; and the Hopper configs through ptxas
without spills."""

import numpy as np
import pytest

from weft.compiler.ir import (Barrier, For, MBarrierArrive, MBarrierWait, TmaAsyncCopyGlobalToShared, WarpgroupMma,
                              WarpgroupMmaWait, WarpSpecialize, is_tensor)
from weft.highlevel import attention_descriptor_example as example

from ._compile import HAS_PTXAS
from .test_attention_example import reference


RNG = np.random.default_rng(4047)


def inputs(n_ctx: int, head_dim: int, heads: int = 2):
    return [(0.5 * RNG.standard_normal((1, heads, n_ctx, head_dim))).astype(np.float16) for _ in range(3)]


def check(n_ctx, head_dim, causal, block, num_warps, stages, warp_specialize=False, **options):
    """The example on the emulator against numpy; `warp_specialize` as attention() takes it
    (False: one partition, whatever the default would choose)."""
    q, k, v = inputs(n_ctx, head_dim)
    out, lse = example.attention(q, k, v, causal, block=block, num_warps=num_warps, num_stages=stages,
                                 warp_specialize=warp_specialize, **options)
    expected, expected_lse = reference(q, k, v, causal, head_dim ** -0.5)
    # fp16 P and V in fp32 sums; the output is rounded to fp16 (2^-11 of values below 4).
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-4, rtol=1e-5)


# (n_ctx, head_dim, causal, (BLOCK_M, BLOCK_N), num_warps, num_stages, WEFT_EMULATE_SHUFFLE):
# tails where n_ctx is not a multiple of the blocks; 2 stages keep each iteration's wait(0),
# 3 and 4 leave P V in flight; TMA completions in order or shuffled.
CASES = [(200, 64, True, (128, 64), 8, 3, None), (200, 64, True, (128, 64), 8, 3, 7),
         (130, 128, True, (128, 128), 8, 3, 7), (96, 128, False, (64, 32), 4, 2, None),
         (192, 64, True, (64, 32), 4, 4, 7), (100, 64, False, (64, 32), 4, 3, 7), (256, 64, False, (64, 64), 4, 3, None)]


@pytest.mark.parametrize("n_ctx,head_dim,causal,block,num_warps,stages,shuffle", CASES)
def test_ringed_attention_matches_numpy(monkeypatch, n_ctx, head_dim, causal, block, num_warps, stages, shuffle):
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    check(n_ctx, head_dim, causal, block, num_warps, stages)


def signature(head_dim: int, block) -> dict:
    block_m, block_n = block
    return {"desc_q": f"tensordesc<fp16[{block_m},{head_dim}]>", "desc_k": f"tensordesc<fp16[{block_n},{head_dim}]>",
            "desc_v": f"tensordesc<fp16[{block_n},{head_dim}]>", "desc_o": f"tensordesc<fp16[{block_m},{head_dim}]>",
            "Out": "*fp16", "Lse": "*fp32", "sm_scale": "fp32", "n_ctx": "i32"}


def constexprs(head_dim: int, block, causal: bool, warp_specialize: bool = False) -> dict:
    return dict(HEAD_DIM=head_dim, BLOCK_M=block[0], BLOCK_N=block[1], CAUSAL=causal, EVEN=True,
                WARP_SPECIALIZE=warp_specialize)


def compiled(head_dim, block, causal, warp_specialize=False, stages=3, target="emulator", **options):
    from weft.highlevel.jit import compile_kernel

    return compile_kernel(example.attention_kernel, signature(head_dim, block),
                          constexprs(head_dim, block, causal, warp_specialize), {},
                          {"num_warps": 8, "target": target, "num_stages": stages, **options})


@pytest.mark.parametrize("causal", [False, True])
def test_k_and_v_are_ringed_by_tma_and_p_v_stays_in_flight(causal):
    kernel = compiled(64, (128, 64), causal)
    loops = [op for op in kernel.body.ops if isinstance(op, For)]
    assert len(loops) == (2 if causal else 1)
    assert not any(isinstance(op, WarpSpecialize) for op in kernel.walk())
    for loop in loops:
        body = list(loop.body.walk())
        wgmmas = [op for op in body if isinstance(op, WarpgroupMma)]
        assert [is_tensor(op.a) for op in wgmmas] == [False, True]  # Q from shared memory, P from registers
        # K and V of iteration i + 2 (one copy each), after the slot's release; no CTA barrier.
        assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in body) == 2
        assert sum(isinstance(op, MBarrierArrive) and op.per_warp for op in body) == 1
        assert not any(isinstance(op, Barrier) for op in body)
        # One wait, for Q K^T and the carried accumulator: it retires the last iteration's
        # P V too, which is yielded in flight.
        (wait,) = [op for op in body if isinstance(op, WarpgroupMmaWait)]
        assert wait.pending == 0 and len(wait.deps) == 2
        waits = [wait]
        assert not any(dep is wgmmas[1].result for op in waits for dep in op.deps)
        assert sum(isinstance(op, MBarrierWait) and not op.elected for op in body) == 1  # the slot's full barrier


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found")
@pytest.mark.parametrize("head_dim, block, causal, num_warps", [(64, (128, 64), False, 8), (64, (128, 64), True, 8),
                                                                (128, (128, 128), False, 8), (128, (128, 64), True, 8),
                                                                (64, (128, 64), True, 4)])
def test_the_hopper_configs_assemble_without_spills(head_dim, block, causal, num_warps):
    kernel = example.attention_kernel.compile(signature=signature(head_dim, block), num_warps=num_warps,
                                              num_stages=3, constexprs=constexprs(head_dim, block, causal))
    ptx = kernel.asm["ptx"]
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx
    assert "setmaxnreg" not in ptx  # one partition
    assert kernel.metadata["spill_stores"] == 0 and kernel.metadata["spill_loads"] == 0, kernel.metadata
