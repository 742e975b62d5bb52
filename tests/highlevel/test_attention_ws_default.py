"""Warp specialization by default for chained-dot loops (pipeline_tma_warp_specialize:
pays_by_default, default_split_loops): the descriptor attention forward, its key loops
written `tl.range(..., warp_specialize=WARP_SPECIALIZE)` with WARP_SPECIALIZE=None, is
split into a producer and two consumer warpgroups at head_dim 128 with 8 warps (a ring
above DEFAULT_SPLIT_CHAINED_RING_BYTES), causal's two key loops in one split, and kept
in one partition at head_dim 64, with 4 warps and with WARP_SPECIALIZE=False. The
default-split kernels run on the CPU emulator (partitions interleaved, race and deadlock
checks, shuffled TMA completions) against numpy float64, causal and not, with tails; the
head_dim 128 configs go through ptxas without spills."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft.compiler.ir import For, TmaAsyncCopyGlobalToShared, WarpgroupTurn, WarpSpecialize
from weft.compiler.passes import pipeline_tma_warp_specialize
from weft.highlevel import attention_descriptor_example as example

from ._compile import HAS_PTXAS
from .test_attention_example import reference
from .test_attention_ws_rings import check, constexprs, inputs, signature

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


def splits(kernel) -> list[WarpSpecialize]:
    return [op for op in kernel.walk() if isinstance(op, WarpSpecialize)]


def default_compiled(head_dim, block, causal, num_warps=8, stages=3, warp_specialize=None, n_ctx=None):
    """The kernel attention() launches for `n_ctx` (None: a multiple of the blocks)."""
    from weft.highlevel.jit import compile_kernel

    even = n_ctx is None or n_ctx % block[0] == 0 and n_ctx % block[1] == 0
    return compile_kernel(example.attention_kernel, signature(head_dim, block),
                          {**constexprs(head_dim, block, causal, warp_specialize), "EVEN": even}, {},
                          {"num_warps": num_warps, "target": "emulator", "num_stages": stages})


@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_128_at_8_warps_is_split_by_default(causal):
    kernel = default_compiled(128, (128, 64), causal)
    (split,) = splits(kernel)
    loops = 2 if causal else 1
    # Causal's two key loops in one split: the consumers run both, one producer walks both.
    assert sum(isinstance(op, For) for op in split.default.ops) == loops
    assert sum(isinstance(op, For) for op in split.workers[0].ops) == loops
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in split.workers[0].walk()) == 2 * loops
    assert split.default_num_regs == 232
    # Two consumer warpgroups over a 3-stage ring: they take turns (pingpong_warpgroups).
    assert any(isinstance(op, WarpgroupTurn) for op in split.default.walk())


@pytest.mark.parametrize("head_dim, block, num_warps, stages, warp_specialize", [
    (64, (128, 64), 8, 3, None),     # 16 KB of boxes a stage: the split cost ~3%
    (64, (128, 64), 8, 4, None),     # still at 4 stages (a 64 KB ring)
    (128, (128, 64), 8, 2, None),    # 2 stages: a 64 KB ring, no ping-pong
    (128, (64, 64), 4, 3, None),     # one consumer warpgroup
    (128, (128, 64), 8, 3, False)])  # refused
@pytest.mark.parametrize("causal", [False, True])
def test_the_default_keeps_one_partition_elsewhere(head_dim, block, num_warps, stages, warp_specialize, causal):
    kernel = default_compiled(head_dim, block, causal, num_warps, stages, warp_specialize)
    assert not splits(kernel)
    assert any(isinstance(op, TmaAsyncCopyGlobalToShared) for op in kernel.walk())  # still ringed by TMA


def test_matmul_rings_keep_their_own_rule(monkeypatch):
    """A lower chained-dot line does not reach single-dot loops: the matmul default is unchanged."""
    pytest.importorskip("torch")  # the matmul kernel's module takes torch host arrays
    from .test_warp_specialize_default import default_matmul, is_split, prepared

    monkeypatch.setattr(pipeline_tma_warp_specialize, "DEFAULT_SPLIT_CHAINED_RING_BYTES", 0)
    assert not is_split(prepared(default_matmul, (128, 128, 64), 3, 8))


@pytest.mark.parametrize("causal, n_ctx, shuffle", [(False, 130, 7), (True, 200, None)])
def test_default_split_head_dim_128_matches_numpy(monkeypatch, causal, n_ctx, shuffle):
    """Tails past the last full block (rows and key columns of the next head masked)."""
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    assert splits(default_compiled(128, (128, 64), causal, n_ctx=n_ctx))
    check(n_ctx, 128, causal, (128, 64), 8, 3, warp_specialize=None)


def emulated_matches_numpy(kernel, n_ctx: int, head_dim: int, block, causal: bool) -> None:
    """`kernel` (compiled here, so the lowered line never reaches the jit's caches) on the
    emulator over two heads, against numpy float64."""
    from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
    from weft.runtime.emulator import emulate

    q, k, v = inputs(n_ctx, head_dim)
    out, lse = np.empty_like(q), np.empty((1, 2, n_ctx), np.float32)
    rows = 2 * n_ctx
    descs = [TensorDescriptor(t, [rows, head_dim], [head_dim, 1], [box, head_dim])
             for t, box in ((q, block[0]), (k, block[1]), (v, block[1]), (out, block[0]))]
    sm_scale = head_dim ** -0.5
    emulate(kernel, (-(-n_ctx // block[0]), 2), (*descs, out, lse, sm_scale, n_ctx))
    expected, expected_lse = reference(q, k, v, causal, sm_scale)
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-4, rtol=1e-5)


@settings(max_examples=100 if DEEP else 4, deadline=None, suppress_health_check=list(HealthCheck))
@given(block_n=st.sampled_from([32, 64]), stages=st.integers(3, 4), causal=st.booleans(), m_blocks=st.integers(1, 2),
       tail=st.sampled_from([0, 1, 33]), shuffle=st.sampled_from([None, 5]))
def test_default_split_property(monkeypatch, block_n, stages, causal, m_blocks, tail, shuffle):
    """The default's split with the line lowered to 0, so head_dim 64 (quicker on the
    emulator) is split too: any key block, stage count, causal or not, tail and TMA
    completion order agrees with numpy."""
    monkeypatch.setattr(pipeline_tma_warp_specialize, "DEFAULT_SPLIT_CHAINED_RING_BYTES", 0)
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    n_ctx = m_blocks * 128 - tail
    kernel = default_compiled(64, (128, block_n), causal, stages=stages, n_ctx=n_ctx)
    assert len(splits(kernel)) == 1
    emulated_matches_numpy(kernel, n_ctx, 64, (128, block_n), causal)


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found")
@pytest.mark.parametrize("causal", [False, True])
def test_the_default_split_assembles_without_spills(causal):
    block = (128, 64)
    kernel = example.attention_kernel.compile(signature=signature(128, block), num_warps=8, num_stages=3,
                                              constexprs=constexprs(128, block, causal, None))
    assert "setmaxnreg.inc.sync.aligned.u32 232" in kernel.asm["ptx"]
    assert kernel.metadata["spill_stores"] == 0 and kernel.metadata["spill_loads"] == 0, kernel.metadata
