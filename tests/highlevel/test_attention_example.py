"""The tutorial-style attention forward of highlevel/attention_example.py: on the CPU
emulator (race and deadlock checks on) against numpy float64, causal and not, with tails,
head_dim 64 and 128, pipelined or not; its layout IR (Q, K and V TMA boxes from the
block pointers (stage_block_pointers), P fed to the second wgmma from registers, K^T a box
of K read through a transposed view); and its cubins at the Hopper configs
through ptxas without spills."""

import numpy as np
import pytest

from weft.compiler.ir import (AsyncCopyGlobalToShared, Cast, ConvertLayout, Permute, SharedPermute, SharedStore,
                              TmaAsyncCopyGlobalToShared, WarpgroupMma, is_tensor)
from weft.highlevel import attention_example
from weft.highlevel.jit import compile_kernel

from ._compile import HAS_PTXAS

RNG = np.random.default_rng(43)


def reference(q, k, v, causal: bool, sm_scale: float):
    """(out, log2-sum-exp2 of the scaled scores) in float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) * sm_scale
    if causal:
        n = scores.shape[-1]
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    weights = np.exp(scores - top)
    total = weights.sum(-1, keepdims=True)
    lse = (top + np.log(total))[..., 0] / np.log(2)
    return weights / total @ v, lse


# (n_ctx, head_dim, causal, (BLOCK_M, BLOCK_N), num_warps, num_stages): tails where n_ctx is
# not a multiple of the blocks.
CASES = [(128, 64, False, (64, 64), 4, None), (200, 64, True, (128, 64), 8, 3), (96, 128, False, (64, 32), 4, 2),
         (130, 128, True, (128, 128), 8, 3), (192, 64, True, (64, 32), 4, 4)]


@pytest.mark.parametrize("n_ctx,head_dim,causal,block,num_warps,stages", CASES)
def test_attention_matches_numpy(n_ctx, head_dim, causal, block, num_warps, stages):
    q, k, v = ((0.5 * RNG.standard_normal((1, 2, n_ctx, head_dim))).astype(np.float16) for _ in range(3))
    out, lse = attention_example.attention(q, k, v, causal, block=block, num_warps=num_warps, num_stages=stages)
    expected, expected_lse = reference(q, k, v, causal, head_dim ** -0.5)
    # fp16 P and V in fp32 sums; the output is rounded to fp16 (2^-11 of values below 4).
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-4, rtol=1e-5)


SIGNATURE = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "Out": "*fp16", "Lse": "*fp32", "sm_scale": "fp32",
             **{f"stride_{t}{d}": "i32" for t, dims in (("q", "zhmd"), ("k", "zhnd"), ("v", "zhnd"), ("o", "zhmd"))
                for d in dims}, "H": "i32", "n_ctx": "i32"}
SPECIALIZATION = {**{name: "divisible_by_16" for name in SIGNATURE if name.startswith("stride") or name.isupper()},
                  "n_ctx": "divisible_by_16", "stride_qd": "equal_to_1", "stride_kd": "equal_to_1",
                  "stride_vd": "equal_to_1", "stride_od": "equal_to_1"}


def constexprs(head_dim, block, causal):
    return dict(HEAD_DIM=head_dim, BLOCK_M=block[0], BLOCK_N=block[1], CAUSAL=causal, EVEN=True)


@pytest.mark.parametrize("causal", [False, True])
def test_a_one_partition_loop_keeps_k_and_v_on_cp_async(causal):
    """stage_block_pointers: 128 x 64 tiles at head_dim 64 in 3 stages make a 48 KB ring,
    which the default does not split: K and V stay on the cp.async ring (faster there),
    Q, outside the loop, is a TMA box."""
    kernel = compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(64, (128, 64), causal),
                            SPECIALIZATION, {"num_warps": 8, "target": "emulator", "num_stages": 3})
    ops = list(kernel.walk())
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in ops) == 1
    assert any(isinstance(op, AsyncCopyGlobalToShared) for op in ops)


@pytest.mark.parametrize("causal", [False, True])
def test_q_k_and_v_are_tma_boxes_and_p_stays_in_registers(causal):
    """128 x 128 tiles at head_dim 64 in 3 stages (a 96 KB ring): the default splits the
    loop, so Q, K and V are TMA boxes, nothing goes by cp.async."""
    kernel = compile_kernel(attention_example.attention_kernel, SIGNATURE, constexprs(64, (128, 128), causal),
                            SPECIALIZATION, {"num_warps": 8, "target": "emulator", "num_stages": 3})
    ops = list(kernel.walk())
    loops = 2 if causal else 1
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in ops) >= 1 + 2 * loops
    assert not any(isinstance(op, AsyncCopyGlobalToShared) for op in ops)
    assert not any(isinstance(op, SharedStore) for op in ops)  # every wgmma operand lands where TMA put it
    wgmmas = [op for op in ops if isinstance(op, WarpgroupMma)]
    assert [is_tensor(op.a) for op in wgmmas] == [False, True] * loops
    # K^T is a box of K read through a transposed view: no register permute, no conversion
    # of a 16-bit tile but the output's (cast from the fp32 accumulator, then converted for the store).
    assert not any(isinstance(op, Permute) for op in ops)
    views = {op.result for op in ops if isinstance(op, SharedPermute)}
    assert all(op.b in views for op in wgmmas[::2])
    casts = {op.result for op in ops if isinstance(op, Cast)}
    assert all(op.operand in casts for op in ops
               if isinstance(op, ConvertLayout) and op.result.type.element.name == "fp16")


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
@pytest.mark.parametrize("head_dim,block,causal", [(64, (128, 64), True), (64, (128, 128), True),
                                                   (128, (128, 64), True), (128, (128, 128), True),
                                                   (128, (128, 128), False)])
def test_the_hopper_configs_assemble_without_spills(head_dim, block, causal):
    """The causal kernel (two loops) needs the most registers; 128x128 at head_dim 128 the most of all."""
    compiled = attention_example.attention_kernel.compile(signature=SIGNATURE,
                                                          constexprs=constexprs(head_dim, block, causal),
                                                          num_warps=8, num_stages=3, specialization=SPECIALIZATION)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    ptx = compiled.asm["ptx"]
    # Q by TMA; K and V too where the loop is split (all but 128 x 64 at head_dim 64).
    assert "cp.async.bulk.tensor" in ptx and ("cp.async.cg" in ptx) == ((head_dim, block) == (64, (128, 64)))
