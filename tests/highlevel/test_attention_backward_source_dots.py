"""issue_dots_early (compiler/passes/issue_dots_early.py) on attention backward's dQ loop
as a Triton user writes it: dP = dO V^T, which does not read P, is issued right after S =
Q K^T and S's wait becomes wait(1). On the CPU emulator (which reports a wgmma result
read before its wait retired it, and shared reads racing the refills) against numpy
float64: num_stages 2-4, masked key tails, loops shorter than the prologue, the option
on and off, a hypothesis property over those; the pass's golden text; the launch option's
error; the tutorial's backward at head_dim 64 through ptxas without spills with the
option on (tests/highlevel/test_attention_backward_source.py), and this loop too."""

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft import highlevel as tl
from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import For, WarpgroupMma, WarpgroupMmaWait
from weft.compiler.passes.issue_dots_early import issue_dots_early
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify
from weft.highlevel.jit import compile_kernel
from weft.runtime.emulator import emulate
from weft.runtime.emulator.errors import EmulationError

from ..compiler.golden import golden_checker
from ._compile import HAS_PTXAS

check_golden = golden_checker(__file__, globals())
DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
RNG = np.random.default_rng(47)
ROWS = 64


@tl.jit
def query_block_grad(q_ptr, do_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr, dq_ptr, seq, KEYS: tl.constexpr,
                     HEAD_DIM: tl.constexpr, STAGES: tl.constexpr):
    """dQ of 64 queries over `seq` keys: sum over key blocks of (P * (dO V^T - delta)) K,
    P = exp2(Q K^T - lse); K and V read transposed, masked past `seq`."""
    cols = tl.arange(0, HEAD_DIM)
    queries = tl.arange(0, 64)
    q = tl.load(q_ptr + queries[:, None] * HEAD_DIM + cols[None, :])
    do = tl.load(do_ptr + queries[:, None] * HEAD_DIM + cols[None, :])
    lse = tl.load(lse_ptr + queries)[:, None]
    delta = tl.load(delta_ptr + queries)[:, None]
    dq = tl.zeros([64, HEAD_DIM], dtype=tl.float32)
    keys = tl.arange(0, KEYS)
    for start in tl.range(0, seq, KEYS, num_stages=STAGES):
        inside = (start + keys)[None, :] < seq
        k_t = tl.load(k_ptr + (start + keys)[None, :] * HEAD_DIM + cols[:, None], mask=inside, other=0.0)
        v_t = tl.load(v_ptr + (start + keys)[None, :] * HEAD_DIM + cols[:, None], mask=inside, other=0.0)
        p = tl.math.exp2(tl.dot(q, k_t) - lse)
        dp = tl.dot(do, v_t)
        ds = (p * (dp - delta)).to(tl.float16)
        dq += tl.dot(ds, tl.trans(k_t))
    tl.store(dq_ptr + queries[:, None] * HEAD_DIM + cols[None, :], dq)


SIGNATURE = {"q_ptr": "*fp16", "do_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "lse_ptr": "*fp32",
             "delta_ptr": "*fp32", "dq_ptr": "*fp32", "seq": "i32"}
SPECIALIZATION = {name: "divisible_by_16" for name in SIGNATURE if name != "seq"}


def layout_kernel(keys: int, head_dim: int, stages: int, early: bool = True):
    return compile_kernel(query_block_grad, SIGNATURE, dict(KEYS=keys, HEAD_DIM=head_dim, STAGES=stages),
                          SPECIALIZATION, {"num_warps": 4, "target": "emulator", "issue_dots_early": early})


def run(keys: int, head_dim: int, stages: int, seq: int, early: bool = True) -> None:
    """The emulated kernel against float64 on random inputs, `seq` keys."""
    kernel = layout_kernel(keys, head_dim, stages, early)
    q, do = ((0.5 * RNG.standard_normal((ROWS, head_dim))).astype(np.float16) for _ in range(2))
    k, v = ((0.5 * RNG.standard_normal((max(seq, 1), head_dim))).astype(np.float16) for _ in range(2))
    lse = (1.0 + RNG.standard_normal(ROWS)).astype(np.float32)
    delta = RNG.standard_normal(ROWS).astype(np.float32)
    dq = np.full((ROWS, head_dim), np.nan, np.float32)
    emulate(kernel, (1,), [q, do, k, v, lse, delta, dq, seq])
    q64, do64, k64, v64 = (x.astype(np.float64)[:n] for x, n in ((q, ROWS), (do, ROWS), (k, seq), (v, seq)))
    p = np.exp2(q64 @ k64.T - lse[:, None])
    expected = (p * (do64 @ v64.T - delta[:, None])) @ k64
    # dS rounded to fp16 before its dot: a few 2^-11 of the largest term.
    np.testing.assert_allclose(dq, expected, atol=4e-3 * np.abs(expected).max() + 1e-6, rtol=0)


def wgmma_schedule(kernel) -> list[str]:
    """The loop body's wgmmas and waits, in order: "dot" or "wait(pending)"."""
    loop = next(op for op in kernel.body.ops if isinstance(op, For))
    return [("dot" if isinstance(op, WarpgroupMma) else f"wait({op.pending})") for op in loop.body.ops
            if isinstance(op, (WarpgroupMma, WarpgroupMmaWait))]


def test_dp_is_issued_right_after_s_and_s_waits_with_one_in_flight():
    assert wgmma_schedule(layout_kernel(32, 32, 3)) == ["dot", "dot", "wait(1)", "wait(0)", "dot", "wait(0)"]
    assert wgmma_schedule(layout_kernel(32, 32, 3, early=False)) == [
        "dot", "wait(0)", "dot", "wait(0)", "dot", "wait(0)"]


@pytest.mark.parametrize("early", [True, False])
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("seq", [0, 20, 96])
def test_scheduled_loop_matches_float64(stages, seq, early):
    """Loops of 0, 1 (masked) and 3 iterations of 32 keys."""
    run(32, 32, stages, seq, early)


def test_a_wait_that_leaves_s_in_flight_is_reported(monkeypatch):
    """wait(2) in place of wait(1) would let the warps read S while its wgmma runs: the
    emulator says so."""
    def two_in_flight(kernel):
        def bump(block):
            ops = tuple(dataclasses.replace(op, pending=2) if isinstance(op, WarpgroupMmaWait) and op.pending == 1
                        else op.map_regions(bump) for op in block.ops)
            return dataclasses.replace(block, ops=ops)
        return kernel.with_body(bump(issue_dots_early(kernel).body))

    passes = tuple((name, two_in_flight if name == "issue_dots_early" else run_pass)
                   for name, run_pass in pipeline.TILE_PASSES)
    monkeypatch.setattr(pipeline, "TILE_PASSES", passes)
    with pytest.raises(EmulationError, match="before a warpgroup_mma_wait|in flight"):
        run(32, 32, 3, 64)


@settings(max_examples=40 if DEEP else 5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.sampled_from([16, 32]), head_dim=st.sampled_from([16, 32, 64]), stages=st.integers(2, 4),
       seq=st.integers(1, 120), early=st.booleans())
def test_scheduled_loop_property(keys, head_dim, stages, seq, early):
    run(keys, head_dim, stages, seq, early)


def until_scheduled():
    kernel = build_kernel(query_block_grad, SIGNATURE, dict(KEYS=32, HEAD_DIM=32, STAGES=3), 4, SPECIALIZATION,
                          language="highlevel")
    for name, run_pass in pipeline.TILE_PASSES:
        kernel = verify(run_pass(kernel))
        if name == "issue_dots_early":
            return kernel
    raise AssertionError("issue_dots_early is not in TILE_PASSES")


def loop_text(kernel) -> str:
    """The printed loop, from its `for` line to its closing brace."""
    lines = print_kernel(kernel).splitlines()
    start = next(i for i, line in enumerate(lines) if " = for " in line)
    end = next(i for i in range(start, len(lines)) if lines[i] == "  }")
    return "\n".join(lines[start:end + 1]) + "\n"


def test_the_pass_follows_the_loop_schedulers():
    """After pipeline_dot_loops has placed the loops' waits and issue_dot_ahead has
    reordered attention loops, before the passes that lower them."""
    names = [name for name, _ in pipeline.TILE_PASSES]
    assert names.index("issue_dots_early") == names.index("issue_dot_ahead") + 1
    assert names.index("issue_dot_ahead") == names.index("pipeline_dot_loops") + 1


def test_golden_loop_after_issue_dots_early():
    """dP's wgmma (with the zero accumulator it reads) right after S's, S's wait(1), dP's
    wait(0) where it was."""
    check_golden(loop_text(until_scheduled()), "GOLDEN_LOOP")


def test_the_launch_option_takes_a_bool():
    with pytest.raises(ValueError, match="issue_dots_early must be True or False"):
        compile_kernel(query_block_grad, SIGNATURE, dict(KEYS=32, HEAD_DIM=32, STAGES=3), SPECIALIZATION,
                       {"num_warps": 4, "target": "emulator", "issue_dots_early": 1})


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
def test_the_scheduled_loop_assembles_without_spills():
    compiled = query_block_grad.compile(signature=SIGNATURE, constexprs=dict(KEYS=32, HEAD_DIM=64, STAGES=4),
                                        specialization=SPECIALIZATION, num_warps=4)
    assert compiled.metadata["spill_stores"] == 0 and compiled.metadata["spill_loads"] == 0, compiled.metadata
    assert "wgmma.wait_group.sync.aligned 1;" in compiled.asm["ptx"]


GOLDEN_LOOP = """\
  %dq_141, %slot = for [schedule={num_stages=3}] %48, %seq, %49, %dq, %140 : tensor<64x32xfp32>, i32 {
    ^(%start: i32, %dq_144: tensor<64x32xfp32>, %slot_145: i32)
    %146 = splat %start : tensor<32xi32>
    %147 = binary [kind=add] %146, %keys : tensor<32xi32>
    %148 = expand_dims [axis=0] %147 : tensor<1x32xi32>
    %149 = splat %seq : tensor<1x32xi32>
    %inside_150 = compare [predicate=lt] %148, %149 : tensor<1x32xi1>
    %151 = splat %start : tensor<32xi32>
    %152 = binary [kind=add] %151, %keys : tensor<32xi32>
    %153 = expand_dims [axis=0] %152 : tensor<1x32xi32>
    %154 = constant [value=32] : tensor<1x32xi32>
    %155 = binary [kind=mul] %153, %154 : tensor<1x32xi32>
    %156 = splat %k_ptr : tensor<1x32x*fp16>
    %157 = add_ptr %156, %155 : tensor<1x32x*fp16>
    %158 = expand_dims [axis=1] %cols : tensor<32x1xi32>
    %159 = broadcast %157 : tensor<32x32x*fp16>
    %160 = broadcast %158 : tensor<32x32xi32>
    %161 = add_ptr %159, %160 : tensor<32x32x*fp16>
    %162 = broadcast %inside_150 : tensor<32x32xi1>
    %163 = constant [value=0.0] : tensor<32x32xfp16>
    %164 = convert_layout %161 : tensor<32x32x*fp16, #L4>
    %165 = convert_layout %162 : tensor<32x32xi1, #L4>
    %166 = convert_layout %163 : tensor<32x32xfp16, #L4>
    %167 = splat %start : tensor<32xi32>
    %168 = binary [kind=add] %167, %keys : tensor<32xi32>
    %169 = expand_dims [axis=0] %168 : tensor<1x32xi32>
    %170 = constant [value=32] : tensor<1x32xi32>
    %171 = binary [kind=mul] %169, %170 : tensor<1x32xi32>
    %172 = splat %v_ptr : tensor<1x32x*fp16>
    %173 = add_ptr %172, %171 : tensor<1x32x*fp16>
    %174 = expand_dims [axis=1] %cols : tensor<32x1xi32>
    %175 = broadcast %173 : tensor<32x32x*fp16>
    %176 = broadcast %174 : tensor<32x32xi32>
    %177 = add_ptr %175, %176 : tensor<32x32x*fp16>
    %178 = broadcast %inside_150 : tensor<32x32xi1>
    %179 = constant [value=0.0] : tensor<32x32xfp16>
    %180 = convert_layout %177 : tensor<32x32x*fp16, #L4>
    %181 = convert_layout %178 : tensor<32x32xi1, #L4>
    %182 = convert_layout %179 : tensor<32x32xfp16, #L4>
    async_copy_wait_group [pending=1]
    %b_smem_183 = shared_index %b_smem, %slot_145 : shared<32x32xfp16, #L5>
    %b_smem_184 = shared_index %b_smem_53, %slot_145 : shared<32x32xfp16, #L5>
    fence_async_shared
    %185 = constant [value=0.0] : tensor<64x32xfp32>
    %186 = convert_layout %185 : tensor<64x32xfp32, #L6>
    %187 = warpgroup_mma [is_async=True] %a_smem, %b_smem_183, %186 : tensor<64x32xfp32, #L6>
    %188 = constant [value=0.0] : tensor<64x32xfp32>
    %189 = convert_layout %188 : tensor<64x32xfp32, #L6>
    %dp = warpgroup_mma [is_async=True] %a_smem_52, %b_smem_184, %189 : tensor<64x32xfp32, #L6>
    %191 = warpgroup_mma_wait [pending=1] %187 : tensor<64x32xfp32, #L6>
    %192 = convert_layout %191 : tensor<64x32xfp32>
    %193 = broadcast %lse : tensor<64x32xfp32>
    %194 = binary [kind=sub] %192, %193 : tensor<64x32xfp32>
    %p = unary [kind=exp2] %194 : tensor<64x32xfp32>
    %dp_196 = warpgroup_mma_wait [pending=0] %dp : tensor<64x32xfp32, #L6>
    %dp_197 = convert_layout %dp_196 : tensor<64x32xfp32>
    %198 = broadcast %delta : tensor<64x32xfp32>
    %199 = binary [kind=sub] %dp_197, %198 : tensor<64x32xfp32>
    %200 = binary [kind=mul] %p, %199 : tensor<64x32xfp32>
    %ds = cast %200 : tensor<64x32xfp16>
    %b_smem_202 = shared_permute [order=(1, 0)] %b_smem_183 : shared<32x32xfp16, #L7>
    %203 = convert_layout %dq_144 : tensor<64x32xfp32, #L6>
    %dq_204 = warpgroup_mma [is_async=True] %ds, %b_smem_202, %203 : tensor<64x32xfp32, #L6>
    %205 = constant [value=64] : i32
    %206 = binary [kind=add] %start, %205 : i32
    %207 = constant [value=2] : i32
    %208 = binary [kind=add] %slot_145, %207 : i32
    %209 = constant [value=3] : i32
    %210 = binary [kind=mod] %208, %209 : i32
    %211 = compare [predicate=lt] %206, %seq : i1
    if %211 {
      %212 = splat %206 : tensor<32xi32>
      %213 = binary [kind=add] %212, %keys : tensor<32xi32>
      %214 = expand_dims [axis=0] %213 : tensor<1x32xi32>
      %215 = splat %seq : tensor<1x32xi32>
      %inside_216 = compare [predicate=lt] %214, %215 : tensor<1x32xi1>
      %217 = splat %206 : tensor<32xi32>
      %218 = binary [kind=add] %217, %keys : tensor<32xi32>
      %219 = expand_dims [axis=0] %218 : tensor<1x32xi32>
      %220 = constant [value=32] : tensor<1x32xi32>
      %221 = binary [kind=mul] %219, %220 : tensor<1x32xi32>
      %222 = splat %k_ptr : tensor<1x32x*fp16>
      %223 = add_ptr %222, %221 : tensor<1x32x*fp16>
      %224 = expand_dims [axis=1] %cols : tensor<32x1xi32>
      %225 = broadcast %223 : tensor<32x32x*fp16>
      %226 = broadcast %224 : tensor<32x32xi32>
      %227 = add_ptr %225, %226 : tensor<32x32x*fp16>
      %228 = broadcast %inside_216 : tensor<32x32xi1>
      %229 = convert_layout %227 : tensor<32x32x*fp16, #L4>
      %230 = convert_layout %228 : tensor<32x32xi1, #L4>
      %b_smem_231 = shared_index %b_smem, %210 : shared<32x32xfp16, #L5>
      async_copy_global_to_shared %b_smem_231, %229, %230
      %232 = splat %206 : tensor<32xi32>
      %233 = binary [kind=add] %232, %keys : tensor<32xi32>
      %234 = expand_dims [axis=0] %233 : tensor<1x32xi32>
      %235 = splat %seq : tensor<1x32xi32>
      %inside_236 = compare [predicate=lt] %234, %235 : tensor<1x32xi1>
      %237 = splat %206 : tensor<32xi32>
      %238 = binary [kind=add] %237, %keys : tensor<32xi32>
      %239 = expand_dims [axis=0] %238 : tensor<1x32xi32>
      %240 = constant [value=32] : tensor<1x32xi32>
      %241 = binary [kind=mul] %239, %240 : tensor<1x32xi32>
      %242 = splat %v_ptr : tensor<1x32x*fp16>
      %243 = add_ptr %242, %241 : tensor<1x32x*fp16>
      %244 = expand_dims [axis=1] %cols : tensor<32x1xi32>
      %245 = broadcast %243 : tensor<32x32x*fp16>
      %246 = broadcast %244 : tensor<32x32xi32>
      %247 = add_ptr %245, %246 : tensor<32x32x*fp16>
      %248 = broadcast %inside_236 : tensor<32x32xi1>
      %249 = convert_layout %247 : tensor<32x32x*fp16, #L4>
      %250 = convert_layout %248 : tensor<32x32xi1, #L4>
      %b_smem_251 = shared_index %b_smem_53, %210 : shared<32x32xfp16, #L5>
      async_copy_global_to_shared %b_smem_251, %249, %250
      yield
    } {
      yield
    }
    async_copy_commit_group
    %dq_252 = warpgroup_mma_wait [pending=0] %dq_204 : tensor<64x32xfp32, #L6>
    %dq_253 = convert_layout %dq_252 : tensor<64x32xfp32>
    %254 = constant [value=1] : i32
    %255 = binary [kind=add] %slot_145, %254 : i32
    %256 = constant [value=3] : i32
    %slot_257 = binary [kind=mod] %255, %256 : i32
    yield %dq_253, %slot_257
  }
"""


def tutorial_schedules(head_dim: int, causal: bool) -> list[list[str]]:
    """wgmma_schedule of each loop of the tutorial's backward (dK/dV loops first)."""
    from weft.highlevel import attention_backward_example as example

    from .test_attention_backward_source import LAUNCH, SIGNATURE, SPECIALIZATION, constexprs

    kernel = compile_kernel(example.attention_backward_kernel, SIGNATURE, constexprs(head_dim, causal),
                            SPECIALIZATION, {**LAUNCH, "target": "emulator"})
    return [wgmma_schedule(kernel.with_body(dataclasses.replace(kernel.body, ops=(loop,))))
            for loop in kernel.body.ops if isinstance(loop, For)]


def test_the_tutorial_loops_are_scheduled_where_the_registers_allow():
    """At head_dim 64 the dQ loops (dQ: 64 registers a thread) and the causal diagonal's
    dK/dV loop (16-query steps) issue dP with S; the full dK/dV loop (dK and dV: 128, S
    and dP 32 each) and everything at head_dim 128 keep their order."""
    early = ["dot", "dot", "wait(1)"]
    masked_kv, kv, masked_q, q = tutorial_schedules(64, True)
    assert masked_kv[:3] == early and q[:3] == early and masked_q[:3] == early
    assert kv[:2] == ["dot", "wait(0)"]
    assert all(loop[:2] == ["dot", "wait(0)"] for loop in tutorial_schedules(128, False))


# Triton 3.6's spill bytes (stores, loads) for the tutorial's source and config at head_dim
# 128, not causal: the dK and dV accumulators alone take 256 registers a thread.
TRITON_SPILLS_128 = (1356, 1060)


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not installed")
def test_the_tutorial_at_head_dim_128_spills_about_as_much_as_triton():
    from weft.highlevel import attention_backward_example as example

    from .test_attention_backward_source import LAUNCH, SIGNATURE, SPECIALIZATION, constexprs

    compiled = example.attention_backward_kernel.compile(signature=SIGNATURE, constexprs=constexprs(128, False),
                                                         specialization=SPECIALIZATION, **LAUNCH)
    spills = compiled.metadata["spill_stores"], compiled.metadata["spill_loads"]
    assert all(mine <= 1.3 * theirs for mine, theirs in zip(spills, TRITON_SPILLS_128)), spills
