"""The fused-attention tutorial's backward as a Triton user writes it
(highlevel/attention_backward_example.py, the source benchmarks/triton_attention_backward.py
also compiles with Triton): on the CPU emulator against the float64 numpy reference,
causal and not, head_dim 64 and 128, at the tutorial's blocks and launch (32 x 128 for
dK/dV, 128 x 32 for dQ, 4 warps, 5 stages); its layout IR (every loop's tiles copied by
cp.async, a tile and its tl.trans read from one ring) and, at head_dim 64, its cubin
through ptxas without spills. (At head_dim 128 the dK and dV accumulators alone, 128 x 128
fp32 each over 128 threads, need 256 registers a thread: that config spills under Triton
too.)"""

import numpy as np
import pytest

from weft.compiler.ir import (AsyncCopyGlobalToShared, ConvertLayout, For, If, Load, Permute, SharedLoad,
                              SharedPermute, SharedStore, WarpgroupMma)
from weft.highlevel import attention_backward_example
from weft.highlevel.jit import compile_kernel
from weft.kernels.attention import reference_attention_backward
from weft.layouts.plans import SharedRoundTrip

from ._compile import HAS_PTXAS

RNG = np.random.default_rng(45)


def forward(q, k, v, causal: bool, scale: float):
    """(out as fp16, natural-log lse as fp32) in float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) * scale
    if causal:
        n = scores.shape[-1]
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    weights = np.exp(scores - top)
    total = weights.sum(-1, keepdims=True)
    return (weights / total @ v).astype(np.float16), (top + np.log(total))[..., 0].astype(np.float32)


@pytest.mark.parametrize("seq,head_dim,causal", [(256, 64, False), (256, 64, True), (128, 128, True)])
def test_backward_matches_float64(seq, head_dim, causal):
    q, k, v, do = ((0.5 * RNG.standard_normal((1, 2, seq, head_dim))).astype(np.float16) for _ in range(4))
    scale = head_dim ** -0.5
    out, lse = forward(q, k, v, causal, scale)
    grads = attention_backward_example.attention_backward(q, k, v, out, lse, do, causal)
    for name, got, expected in zip(("dq", "dk", "dv"), grads, reference_attention_backward(q, k, v, do, causal, scale)):
        # P and dS rounded to fp16 before their dots, fp32 sums, fp16 results: a few 2^-11
        # of the largest gradient.
        np.testing.assert_allclose(got.astype(np.float64), expected, atol=4e-3 * np.abs(expected).max(), rtol=0,
                                   err_msg=name)


SIGNATURE = {**{name: "*fp16" for name in ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dq_ptr", "dk_ptr", "dv_ptr")},
             "lse_ptr": "*fp32", "delta_ptr": "*fp32", "seq": "i32", "scale": "fp32"}
SPECIALIZATION = {name: "divisible_by_16" for name in SIGNATURE if name != "scale"}
LAUNCH = {"num_warps": 4, "num_stages": 5}


def constexprs(head_dim: int, causal: bool) -> dict:
    example = attention_backward_example
    return dict(HEAD_DIM=head_dim, CAUSAL=causal, ROWS_KV=example.BLOCK_M1, KEYS_KV=example.BLOCK_N1,
                ROWS_Q=example.BLOCK_M2, KEYS_Q=example.BLOCK_N2, SPLIT=example.DIAGONAL_SPLIT)


@pytest.mark.parametrize("causal", [False, True])
def test_every_loop_copies_its_tiles_once_by_cp_async(causal):
    """The dK/dV loops read Q^T and dO and their tl.trans, the dQ loops K^T and V^T and
    K^T's tl.trans: one ring per loaded tile, filled by cp.async 4 iterations ahead, the
    transposes read through permuted views, the next refill issued after the last dot;
    K, V, Q and dO stored once, before the loops. The dK/dV loops' rows of lse and delta
    are copied with the tiles and read from their slots (pipeline_row_loads): no load is
    left in any loop, and no row goes through shared memory twice."""
    kernel = compile_kernel(attention_backward_example.attention_backward_kernel, SIGNATURE,
                            constexprs(64, causal), SPECIALIZATION, {**LAUNCH, "target": "emulator"})
    loops = [op for op in kernel.body.ops if isinstance(op, For)]
    assert len(loops) == (4 if causal else 2)
    for loop in loops:
        body = list(loop.body.walk())
        key_loop = loops.index(loop) < len(loops) // 2
        assert not any(isinstance(op, (SharedStore, Permute, Load)) for op in body)
        assert not any(isinstance(op, ConvertLayout) and isinstance(op.plan, SharedRoundTrip)
                       and op.result.type.element.name == "fp32" for op in body)
        # two tiles (and two rows in the dK/dV loops), iteration i + 4
        assert sum(isinstance(op, AsyncCopyGlobalToShared) for op in body) == (4 if key_loop else 2)
        assert sum(isinstance(op, SharedLoad) for op in body) == (2 if key_loop else 0)
        assert sum(isinstance(op, SharedPermute) for op in body) == (2 if loops.index(loop) < len(loops) // 2 else 1)
        # The refill is issued while the last wgmma, which reads a slot through a transposed view, runs.
        ops = loop.body.ops
        refill = next(i for i, op in enumerate(ops) if isinstance(op, If)
                      and any(isinstance(inner, AsyncCopyGlobalToShared) for inner in op.then_body.walk()))
        assert refill > max(i for i, op in enumerate(ops) if isinstance(op, WarpgroupMma))
    assert sum(isinstance(op, AsyncCopyGlobalToShared) for op in kernel.walk()) == len(loops) * 3 * 5
    assert sum(isinstance(op, SharedStore) for op in kernel.walk()) == 4


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("causal", [False, True])
def test_the_tutorial_config_assembles_without_spills(causal):
    compiled = attention_backward_example.attention_backward_kernel.compile(
        signature=SIGNATURE, constexprs=constexprs(64, causal), specialization=SPECIALIZATION, **LAUNCH)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert "cp.async" in compiled.asm["ptx"]
