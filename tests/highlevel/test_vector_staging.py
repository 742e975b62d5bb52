"""Row loads in a dot loop (attention backward's `tl.load(lse_ptr + queries)`) staged with
the tiles (compiler/passes/pipeline_row_loads.py): each is copied by cp.async into a ring
of its own, num_stages - 1 iterations ahead, and read from its slot by a shared load in
the layout its reader needs, with no conversion through shared memory left in the loop.
On the CPU emulator (its race checks see every cp.async byte until its wait_group and
every shared read until the barrier before a refill) against numpy float64: num_stages
2-4, loops shorter than the prologue, masked tails, a hypothesis property over those; a
loop that is not pipelined keeps its plain loads; the golden text of the pass's loop."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (AsyncCopyGlobalToShared, ConvertLayout, For, Load, SharedLoad, SharedStore)
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify
from weft.layouts.plans import SharedRoundTrip
from weft.runtime.emulator import emulate

from ..compiler.golden import golden_checker
from ._compile import HAS_PTXAS

check_golden = golden_checker(__file__, globals())
DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
RNG = np.random.default_rng(46)
KEYS = 64


@tl.jit
def key_block_grads(k_ptr, v_ptr, q_ptr, lse_ptr, delta_ptr, out_ptr, seq, ROWS: tl.constexpr,
                    HEAD_DIM: tl.constexpr, STAGES: tl.constexpr):
    """sum over query blocks of (P * (V Q^T - delta)) Q for one key block, P = exp2(K Q^T -
    lse): attention backward's dK loop, its two row loads read after different dots."""
    cols = tl.arange(0, HEAD_DIM)
    keys = tl.program_id(0) * 64 + tl.arange(0, 64)
    k = tl.load(k_ptr + keys[:, None] * HEAD_DIM + cols[None, :])
    v = tl.load(v_ptr + keys[:, None] * HEAD_DIM + cols[None, :])
    acc = tl.zeros([64, HEAD_DIM], dtype=tl.float32)
    queries = tl.arange(0, ROWS)
    q_t_ptrs = q_ptr + queries[None, :] * HEAD_DIM + cols[:, None]
    for _ in tl.range(0, tl.cdiv(seq, ROWS), num_stages=STAGES):
        q_t = tl.load(q_t_ptrs, mask=queries[None, :] < seq, other=0.0)
        lse = tl.load(lse_ptr + queries, mask=queries < seq, other=0.0)
        p = tl.math.exp2(tl.dot(k, q_t) - lse[None, :])
        delta = tl.load(delta_ptr + queries, mask=queries < seq, other=0.0)
        dp = tl.dot(v, q_t)
        ds = (p * (dp - delta[None, :])).to(tl.float16)
        acc += tl.dot(ds, tl.trans(q_t))
        queries += ROWS
        q_t_ptrs += ROWS * HEAD_DIM
    tl.store(out_ptr + keys[:, None] * HEAD_DIM + cols[None, :], acc)


SIGNATURE = {"k_ptr": "*fp16", "v_ptr": "*fp16", "q_ptr": "*fp16", "lse_ptr": "*fp32", "delta_ptr": "*fp32",
             "out_ptr": "*fp32", "seq": "i32"}


def tile_kernel(rows: int, head_dim: int, stages: int):
    return build_kernel(key_block_grads, SIGNATURE, dict(ROWS=rows, HEAD_DIM=head_dim, STAGES=stages), 4,
                        {name: "divisible_by_16" for name in SIGNATURE if name != "seq"}, language="highlevel")


def the_loop(kernel) -> For:
    return next(op for op in kernel.body.ops if isinstance(op, For))


def run(rows: int, head_dim: int, stages: int, seq: int) -> None:
    """The emulated kernel against float64 on random inputs, `seq` queries."""
    kernel = pipeline.prepare_for_emulator(tile_kernel(rows, head_dim, stages))
    k, v, q = ((0.5 * RNG.standard_normal((n, head_dim))).astype(np.float16) for n in (KEYS, KEYS, seq))
    lse = (1.0 + RNG.standard_normal(seq)).astype(np.float32)
    delta = RNG.standard_normal(seq).astype(np.float32)
    out = np.full((KEYS, head_dim), np.nan, np.float32)
    emulate(kernel, (1,), [k, v, q, lse, delta, out, seq])
    k64, v64, q64 = (x.astype(np.float64) for x in (k, v, q))
    p = np.exp2(k64 @ q64.T - lse[None, :])
    ds = p * (v64 @ q64.T - delta[None, :])
    expected = ds @ q64
    # dS rounded to fp16 before its dot: a few 2^-11 of the largest term.
    np.testing.assert_allclose(out, expected, atol=4e-3 * np.abs(expected).max() + 1e-6, rtol=0)


def test_row_loads_are_copied_into_rings_and_read_in_place():
    kernel = pipeline.prepare_for_emulator(tile_kernel(32, 32, 3))
    body = list(the_loop(kernel).body.walk())
    assert not any(isinstance(op, Load) for op in body)
    # (The queries' offsets and masks may still move between layouts; the rows never do.)
    assert not any(isinstance(op, ConvertLayout) and isinstance(op.plan, SharedRoundTrip)
                   and op.result.type.element.name == "fp32" for op in body), "a row went through shared memory twice"
    copies = [op for op in body if isinstance(op, AsyncCopyGlobalToShared)]
    assert sorted(len(op.buffer.type.shape) for op in copies) == [1, 1, 2]
    reads = [op for op in body if isinstance(op, SharedLoad)]
    assert len(reads) == 2 and all(len(op.result.type.shape) == 1 for op in reads)
    assert sum(isinstance(op, AsyncCopyGlobalToShared) for op in kernel.walk()) == 3 * 3  # prologue 2 + loop


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("seq", [0, 16, 70, 128])
def test_staged_row_loads_match_float64(stages, seq):
    """Loops of 0, 1, 3 and 4 iterations of 32 queries (a masked tail at 70)."""
    run(32, 32, stages, seq)


@settings(max_examples=40 if DEEP else 5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.sampled_from([16, 32]), head_dim=st.sampled_from([16, 32]), stages=st.integers(2, 4),
       seq=st.integers(1, 100))
def test_staged_row_loads_property(rows, head_dim, stages, seq):
    run(rows, head_dim, stages, seq)


def test_a_loop_left_unpipelined_keeps_its_plain_loads():
    kernel = pipeline.prepare_for_emulator(tile_kernel(32, 32, 1))
    body = list(the_loop(kernel).body.walk())
    assert sum(isinstance(op, Load) for op in body) >= 2
    assert not any(isinstance(op, (SharedLoad, AsyncCopyGlobalToShared)) for op in body)


def until_pipelined(stages: int):
    kernel = tile_kernel(32, 32, stages)
    for name, run_pass in pipeline.TILE_PASSES:
        kernel = verify(run_pass(kernel))
        if name == "pipeline_dot_loops":
            return kernel
    raise AssertionError("pipeline_dot_loops is not in TILE_PASSES")


def loop_text(kernel) -> str:
    """The printed loop, from its `for` line to its closing brace."""
    lines = print_kernel(kernel).splitlines()
    start = next(i for i, line in enumerate(lines) if " = for " in line)
    end = next(i for i in range(start, len(lines)) if lines[i] == "  }")
    return "\n".join(lines[start:end + 1]) + "\n"


def test_golden_loop_after_pipeline_dot_loops():
    """The row loads' stores are gone; each row is read from its slot right before its
    first reader, after the wait_group of its iteration; its copy for iteration i + 2
    goes into the refilled slot with the tile's."""
    kernel = until_pipelined(3)
    loop = the_loop(kernel)
    assert not any(isinstance(op, (SharedStore, Load)) for op in loop.body.walk())
    check_golden(loop_text(kernel), "GOLDEN_LOOP")


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
def test_the_staged_loop_assembles_without_spills():
    compiled = key_block_grads.compile(signature=SIGNATURE, constexprs=dict(ROWS=32, HEAD_DIM=64, STAGES=4),
                                       specialization={n: "divisible_by_16" for n in SIGNATURE if n != "seq"},
                                       num_warps=4)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert compiled.asm["ptx"].count("cp.async.ca.shared.global") >= 2  # the 4-byte row copies


GOLDEN_LOOP = """\
  %acc_111, %queries_112, %q_t_ptrs_113, %slot, %ahead, %ahead_116 = for [schedule={num_stages=3}] %55, %54, %56, %acc, %queries, %q_t_ptrs, %110, %queries_103, %q_t_ptrs_105 : tensor<64x32xfp32>, tensor<32xi32>, tensor<32x32x*fp16>, i32, tensor<32xi32>, tensor<32x32x*fp16> {
    ^(%_: i32, %acc_118: tensor<64x32xfp32>, %queries_119: tensor<32xi32>, %q_t_ptrs_120: tensor<32x32x*fp16>, %slot_121: i32, %ahead_122: tensor<32xi32>, %ahead_123: tensor<32x32x*fp16>)
    %124 = expand_dims [axis=0] %queries_119 : tensor<1x32xi32>
    %125 = splat %seq : tensor<1x32xi32>
    %126 = compare [predicate=lt] %124, %125 : tensor<1x32xi1>
    %127 = broadcast %126 : tensor<32x32xi1>
    %128 = constant [value=0.0] : tensor<32x32xfp16>
    %129 = convert_layout %q_t_ptrs_120 : tensor<32x32x*fp16, #L4>
    %130 = convert_layout %127 : tensor<32x32xi1, #L4>
    %131 = convert_layout %128 : tensor<32x32xfp16, #L4>
    %132 = splat %lse_ptr : tensor<32x*fp32>
    %133 = add_ptr %132, %queries_119 : tensor<32x*fp32>
    %134 = splat %seq : tensor<32xi32>
    %135 = compare [predicate=lt] %queries_119, %134 : tensor<32xi1>
    %136 = constant [value=0.0] : tensor<32xfp32>
    %137 = convert_layout %133 : tensor<32x*fp32, #L7>
    %138 = convert_layout %135 : tensor<32xi1, #L7>
    %139 = convert_layout %136 : tensor<32xfp32, #L7>
    async_copy_wait_group [pending=1]
    %lse_smem_140 = shared_index %lse_smem, %slot_121 : shared<32xfp32, #L5>
    %b_smem_141 = shared_index %b_smem, %slot_121 : shared<32x32xfp16, #L6>
    %delta_smem_142 = shared_index %delta_smem, %slot_121 : shared<32xfp32, #L5>
    fence_async_shared
    %143 = constant [value=0.0] : tensor<64x32xfp32>
    %144 = convert_layout %143 : tensor<64x32xfp32, #L8>
    %145 = warpgroup_mma [is_async=True] %a_smem, %b_smem_141, %144 : tensor<64x32xfp32, #L8>
    %146 = warpgroup_mma_wait [pending=0] %145 : tensor<64x32xfp32, #L8>
    %147 = convert_layout %146 : tensor<64x32xfp32>
    %lse = shared_load %lse_smem_140 : tensor<32xfp32>
    %149 = expand_dims [axis=0] %lse : tensor<1x32xfp32>
    %150 = broadcast %149 : tensor<64x32xfp32>
    %151 = binary [kind=sub] %147, %150 : tensor<64x32xfp32>
    %p = unary [kind=exp2] %151 : tensor<64x32xfp32>
    %153 = splat %delta_ptr : tensor<32x*fp32>
    %154 = add_ptr %153, %queries_119 : tensor<32x*fp32>
    %155 = splat %seq : tensor<32xi32>
    %156 = compare [predicate=lt] %queries_119, %155 : tensor<32xi1>
    %157 = constant [value=0.0] : tensor<32xfp32>
    %158 = convert_layout %154 : tensor<32x*fp32, #L7>
    %159 = convert_layout %156 : tensor<32xi1, #L7>
    %160 = convert_layout %157 : tensor<32xfp32, #L7>
    %161 = constant [value=0.0] : tensor<64x32xfp32>
    %162 = convert_layout %161 : tensor<64x32xfp32, #L8>
    %dp = warpgroup_mma [is_async=True] %a_smem_59, %b_smem_141, %162 : tensor<64x32xfp32, #L8>
    %dp_164 = warpgroup_mma_wait [pending=0] %dp : tensor<64x32xfp32, #L8>
    %dp_165 = convert_layout %dp_164 : tensor<64x32xfp32>
    %delta = shared_load %delta_smem_142 : tensor<32xfp32>
    %167 = expand_dims [axis=0] %delta : tensor<1x32xfp32>
    %168 = broadcast %167 : tensor<64x32xfp32>
    %169 = binary [kind=sub] %dp_165, %168 : tensor<64x32xfp32>
    %170 = binary [kind=mul] %p, %169 : tensor<64x32xfp32>
    %ds = cast %170 : tensor<64x32xfp16>
    %b_smem_172 = shared_permute [order=(1, 0)] %b_smem_141 : shared<32x32xfp16, #L9>
    %173 = convert_layout %acc_118 : tensor<64x32xfp32, #L8>
    %acc_174 = warpgroup_mma [is_async=True] %ds, %b_smem_172, %173 : tensor<64x32xfp32, #L8>
    %175 = constant [value=2] : i32
    %176 = binary [kind=add] %_, %175 : i32
    %177 = constant [value=2] : i32
    %178 = binary [kind=add] %slot_121, %177 : i32
    %179 = constant [value=3] : i32
    %180 = binary [kind=mod] %178, %179 : i32
    %181 = expand_dims [axis=0] %ahead_122 : tensor<1x32xi32>
    %182 = splat %seq : tensor<1x32xi32>
    %183 = compare [predicate=lt] %181, %182 : tensor<1x32xi1>
    %184 = broadcast %183 : tensor<32x32xi1>
    %185 = convert_layout %ahead_123 : tensor<32x32x*fp16, #L4>
    %186 = convert_layout %184 : tensor<32x32xi1, #L4>
    %187 = splat %lse_ptr : tensor<32x*fp32>
    %188 = add_ptr %187, %ahead_122 : tensor<32x*fp32>
    %189 = splat %seq : tensor<32xi32>
    %190 = compare [predicate=lt] %ahead_122, %189 : tensor<32xi1>
    %191 = splat %delta_ptr : tensor<32x*fp32>
    %192 = add_ptr %191, %ahead_122 : tensor<32x*fp32>
    %193 = splat %seq : tensor<32xi32>
    %194 = compare [predicate=lt] %ahead_122, %193 : tensor<32xi1>
    %195 = constant [value=32] : tensor<32xi32>
    %queries_196 = binary [kind=add] %ahead_122, %195 : tensor<32xi32>
    %197 = constant [value=1024] : tensor<32x32xi32>
    %q_t_ptrs_198 = add_ptr %ahead_123, %197 : tensor<32x32x*fp16>
    %lse_smem_199 = shared_index %lse_smem, %180 : shared<32xfp32, #L5>
    %b_smem_200 = shared_index %b_smem, %180 : shared<32x32xfp16, #L6>
    %delta_smem_201 = shared_index %delta_smem, %180 : shared<32xfp32, #L5>
    %202 = compare [predicate=lt] %176, %54 : i1
    if %202 {
      async_copy_global_to_shared %lse_smem_199, %188, %190
      async_copy_global_to_shared %b_smem_200, %185, %186
      async_copy_global_to_shared %delta_smem_201, %192, %194
      yield
    } {
      yield
    }
    async_copy_commit_group
    %acc_203 = warpgroup_mma_wait [pending=0] %acc_174 : tensor<64x32xfp32, #L8>
    %acc_204 = convert_layout %acc_203 : tensor<64x32xfp32>
    %205 = constant [value=32] : tensor<32xi32>
    %queries_206 = binary [kind=add] %queries_119, %205 : tensor<32xi32>
    %207 = constant [value=1024] : tensor<32x32xi32>
    %q_t_ptrs_208 = add_ptr %q_t_ptrs_120, %207 : tensor<32x32x*fp16>
    %209 = constant [value=1] : i32
    %210 = binary [kind=add] %slot_121, %209 : i32
    %211 = constant [value=3] : i32
    %slot_212 = binary [kind=mod] %210, %211 : i32
    yield %acc_204, %queries_206, %q_t_ptrs_208, %slot_212, %queries_196, %q_t_ptrs_198
  }
"""
