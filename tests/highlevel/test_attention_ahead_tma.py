"""issue_dot_ahead on the descriptor attention's TMA rings (launch option dot_ahead=True):
Q K^T of block j issued with P V of block j - 1 right after the wait on block j's full
barrier, V of block j - 1's slot released (empty-barrier arrivals, and in one partition
refilled) only once that P V has been waited for; in one partition and in a
warp-specialized consumer partition, and with ping-pong turns covering the pair issued
together. Golden IR of the rewritten loop; the loop's form; on the CPU emulator (races,
deadlocks, turn orders, shuffled TMA completions) against numpy float64 over blocks,
stages, causal, tails, warp_specialize and pingpong; the emulator flagging the slot
released before P V's wait; the Hopper configs through ptxas without spills or
serialized wgmmas."""

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft.compiler import pipeline
from weft.compiler.frontend import build_kernel
from weft.compiler.ir import (Block, For, If, MBarrierArrive, MBarrierWait, TmaAsyncCopyGlobalToShared,
                              WarpgroupMma, WarpgroupMmaWait, WarpgroupTurn)
from weft.compiler.passes import issue_dot_ahead as ahead_pass
from weft.compiler.printer import print_kernel
from weft.compiler.verifier import verify
from weft.highlevel import attention_descriptor_example as example
from weft.runtime.emulator.errors import EmulationError

from ..compiler.golden import golden_checker
from ._compile import HAS_PTXAS
from .test_attention_ws_rings import check, compiled, constexprs, signature
from .test_attention_ws_split import run_kernel, split_of

check_golden = golden_checker(__file__, globals())
DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"


def shuffled(monkeypatch, seed):
    if seed is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(seed))


def until_ahead(head_dim=16, block=(64, 16), num_warps=4, causal=False, warp_specialize=False):
    """The descriptor attention after the tile passes up to issue_dot_ahead (verified
    after each), dot_ahead on, 3 stages."""
    kernel = build_kernel(example.attention_kernel, signature(head_dim, block),
                          constexprs(head_dim, block, causal, warp_specialize), num_warps, {}, language="highlevel")
    kernel = dataclasses.replace(kernel, num_stages=3, dot_ahead=True)
    for name, run in pipeline.TILE_PASSES:
        kernel = verify(run(kernel))
        if name == "issue_dot_ahead":
            return kernel
    raise AssertionError("issue_dot_ahead is not in TILE_PASSES")


def wgmmas(ops):
    return [op for op in ops if isinstance(op, WarpgroupMma)]


def test_golden():
    kernel = until_ahead()
    (loop,) = [op for op in kernel.body.ops if isinstance(op, For)]
    check_golden(print_kernel(kernel.with_body(Block(kernel.body.args, (loop,)))), "EXPECTED_LOOP")


def assert_issued_ahead(loop: For, refills: bool):
    """The loop body's order: block j's full-barrier wait, Q K^T of j and P V of j - 1
    issued together (only V's slot index between them), S waited with P V in flight,
    then P V waited, and only after it the slot's release (and refill)."""
    body = list(loop.body.ops)
    qk, pv = wgmmas(body)
    full = [op for op in body if isinstance(op, MBarrierWait) and not op.elected]
    assert len(full) == 1 and body.index(full[0]) < body.index(qk)
    assert all(not isinstance(op, (WarpgroupMmaWait, MBarrierWait)) for op in body[body.index(qk):body.index(pv)])
    waits = [op for op in body if isinstance(op, WarpgroupMmaWait)]
    assert [op.pending for op in waits] == [1, 0, 0]  # S of j; then P V of j - 1, and P through it
    assert waits[0].deps == (qk.result,) and waits[1].deps == (pv.result,)
    p_arg, acc_arg = loop.body.args[-2:]
    assert pv.a is p_arg and pv.acc is acc_arg  # carried from the iteration before
    (release,) = [op for op in body if isinstance(op, MBarrierArrive)]
    assert body.index(release) > body.index(waits[2])
    copies = [op for op in body if isinstance(op, TmaAsyncCopyGlobalToShared)]
    assert len(copies) == (2 if refills else 0)
    assert all(body.index(copy) > body.index(release) for copy in copies)


@pytest.mark.parametrize("causal", [False, True])
def test_one_partition_issues_qk_of_j_with_pv_of_j_minus_1(causal):
    kernel = until_ahead(64, (128, 64), 8, causal)
    top = kernel.body.ops
    loops = [op for op in top if isinstance(op, For)]
    assert len(loops) == (2 if causal else 1)
    for loop in loops:
        peel, last = top[top.index(loop) - 2], top[top.index(loop) + 1]
        assert isinstance(peel, If) and isinstance(last, If)
        assert len(wgmmas(peel.then_body.walk())) == 1 and len(wgmmas(last.then_body.walk())) == 1
        assert_issued_ahead(loop, refills=True)


@pytest.mark.parametrize("causal", [False, True])
def test_the_warp_specialized_consumers_issue_qk_of_j_with_pv_of_j_minus_1(causal):
    kernel = until_ahead(64, (128, 64), 8, causal, warp_specialize=True)
    consumer = split_of(kernel).default
    loops = [op for op in consumer.ops if isinstance(op, For)]
    assert len(loops) == (2 if causal else 1)
    for loop in loops:
        assert_issued_ahead(loop, refills=False)  # the producer partition refills


def turns_in(ops) -> list[str]:
    return [op.action for op in ops if isinstance(op, WarpgroupTurn)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pingpong", [True, "after_wait"])
def test_a_turn_covers_the_pair_issued_together(causal, pingpong):
    """Ping-pong with the dots issued ahead: block 0's Q K^T, each (Q K^T of j, P V of
    j - 1) pair and the last P V are each one turn, taken right before the issue and
    passed right after it (after_wait: after the wait that follows)."""
    kernel = compiled(64, (128, 64), causal, warp_specialize=True, pingpong=pingpong, dot_ahead=True)
    consumer = split_of(kernel).default
    loops = [op for op in consumer.ops if isinstance(op, For)]
    assert turns_in(consumer.ops) == ["open"]
    for loop in loops:
        body = list(loop.body.ops)
        qk, pv = [i for i, op in enumerate(body) if isinstance(op, WarpgroupMma)]
        (take, taken), (pass_at, passed) = [(i, op.action) for i, op in enumerate(body)
                                            if isinstance(op, WarpgroupTurn)]
        assert (taken, passed) == ("take", "pass") and take == qk - 1
        if pingpong is True:
            assert pass_at == pv + 1
        else:
            assert isinstance(body[pass_at - 1], (WarpgroupMmaWait,)) or pass_at > pv + 1
            assert body[pv + 1:pass_at] and isinstance(body[pv + 1], WarpgroupMmaWait)
    ifs = [op for op in consumer.ops if isinstance(op, If) and wgmmas(op.then_body.ops)]
    assert len(ifs) == 2 * len(loops)
    for branch in ifs:
        ops = list(branch.then_body.ops)
        assert turns_in(ops) == ["take", "pass"]
        (dot,) = wgmmas(ops)
        assert isinstance(ops[ops.index(dot) - 1], WarpgroupTurn)


# (n_ctx, head_dim, causal, (BLOCK_M, BLOCK_N), num_warps, stages, warp_specialize, pingpong, shuffle)
CASES = [(200, 64, True, (128, 64), 8, 3, False, None, None), (130, 128, False, (128, 64), 8, 3, False, None, 7),
         (192, 64, True, (64, 32), 4, 4, False, None, 7), (100, 64, False, (64, 32), 4, 3, True, None, 5),
         (200, 64, True, (128, 64), 8, 3, True, False, 3), (200, 64, True, (128, 64), 8, 3, True, True, None),
         (300, 64, True, (256, 64), 8, 4, True, "after_wait", 3), (130, 128, True, (128, 64), 8, 3, True, True, 7)]


@pytest.mark.parametrize("n_ctx,head_dim,causal,block,num_warps,stages,warp_specialize,pingpong,shuffle", CASES)
def test_ahead_attention_matches_numpy(monkeypatch, n_ctx, head_dim, causal, block, num_warps, stages,
                                       warp_specialize, pingpong, shuffle):
    shuffled(monkeypatch, shuffle)
    check(n_ctx, head_dim, causal, block, num_warps, stages, warp_specialize=warp_specialize, dot_ahead=True,
          **({} if pingpong is None else {"pingpong": pingpong}))


@settings(max_examples=200 if DEEP else 6, deadline=None, suppress_health_check=list(HealthCheck))
@given(config=st.sampled_from([((64, 32), 4), ((64, 64), 4), ((128, 64), 8), ((128, 128), 8), ((256, 64), 8)]),
       stages=st.integers(3, 4), causal=st.booleans(), m_blocks=st.integers(1, 2), tail=st.sampled_from([0, 1, 33]),
       warp_specialize=st.booleans(), pingpong=st.sampled_from([False, True, "after_wait"]),
       shuffle=st.sampled_from([None, 5]))
def test_ahead_attention_property(monkeypatch, config, stages, causal, m_blocks, tail, warp_specialize, pingpong,
                                  shuffle):
    """Any block, warps, stages, causal or not, tail, one partition or split, turns or
    not, TMA completion order: the emulator (races, deadlocks, turns) agrees with numpy."""
    shuffled(monkeypatch, shuffle)
    block, num_warps = config
    check(max(1, m_blocks * block[0] - tail), 64, causal, block, num_warps, stages, warp_specialize=warp_specialize,
          dot_ahead=True, pingpong=pingpong)


def release_first(monkeypatch):
    """issue_dot_ahead with each rewritten loop's waits for P V (and every op reading what
    they return) moved to the end of the body, after the slot's release and refill."""
    rewrite = ahead_pass.rewrite

    def late_wait(loop, split):
        ops = rewrite(loop, split)
        (new_loop,) = [op for op in ops if isinstance(op, For)]
        body = list(new_loop.body.ops)
        waits = [op for op in body if isinstance(op, WarpgroupMmaWait)][1:]
        waited, late = set(), []
        for op in body[body.index(waits[0]):-1]:
            if any(op is wait for wait in waits) or waited & set(op.uses()):
                late.append(op)
                waited |= set(op.defines())
        body = [op for op in body[:-1] if all(op is not moved for moved in late)] + late + body[-1:]
        replaced = dataclasses.replace(new_loop, body=Block(new_loop.body.args, tuple(body)))
        return [replaced if op is new_loop else op for op in ops]

    monkeypatch.setattr(ahead_pass, "rewrite", late_wait)


@pytest.mark.parametrize("warp_specialize", [False, True])
def test_the_emulator_flags_v_released_before_pv_is_waited_for(monkeypatch, warp_specialize):
    """The refill of V's slot (by this partition or the producer) may then land while P V
    of block j - 1 reads it: the emulator reports the race. (Compiled here, outside the
    launch caches, so no other test runs the broken kernel.)"""
    release_first(monkeypatch)
    monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", "5")
    kernel = compiled(64, (64, 32), False, warp_specialize=warp_specialize, num_warps=4, dot_ahead=True,
                      pingpong=False)
    with pytest.raises(EmulationError, match="shared-memory race"):
        run_kernel(kernel, 512, (64, 32))


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found")
@pytest.mark.parametrize("head_dim, block, causal, warp_specialize", [
    (64, (128, 64), False, False), (64, (128, 128), True, False), (128, (128, 64), True, False),
    (64, (128, 64), True, True), (64, (128, 128), False, True), (128, (128, 64), True, True)])
def test_the_hopper_configs_assemble_without_spills_or_serialized_wgmmas(head_dim, block, causal, warp_specialize):
    kernel = example.attention_kernel.compile(signature=signature(head_dim, block), num_warps=8, num_stages=3,
                                              constexprs=constexprs(head_dim, block, causal, warp_specialize),
                                              dot_ahead=True)
    loops = 2 if causal else 1
    assert kernel.asm["layout"].count("warpgroup_mma_wait [pending=1") == loops  # rewritten
    assert kernel.metadata["spill_stores"] == 0 and kernel.metadata["spill_loads"] == 0, kernel.metadata
    assert not kernel.metadata["performance_warnings"], kernel.metadata["performance_warnings"]


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("warp_specialize", [False, True])
def test_on_the_gpu_against_float32_torch(head_dim, causal, warp_specialize):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    q, k, v = (torch.randn(2, 3, 1000, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    out, _ = example.attention(q, k, v, causal, block=(128, 64), num_warps=8, num_stages=3,
                               warp_specialize=warp_specialize, dot_ahead=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=1e-2)
EXPECTED_LOOP = """\
#L0 = {register=[(0,1), (8,0), (0,8)] lane=[(0,2), (0,4), (1,0), (2,0), (4,0)] warp=[(16,0), (32,0)]} -> [64x16]
#L1 = {} -> [1]
#L2 = {offset=[(0,1), (0,2), (0,4), (0,8), (1,0), (2,0), (4,8), (8,0)]} -> [16x16]
#L3 = {offset=[(1,0), (2,0), (4,0), (8,0), (0,1), (0,2), (8,4), (0,8)]} -> [16x16]
kernel @attention_kernel(%desc_q: tensordesc<64x16xfp16>, %desc_k: tensordesc<16x16xfp16>, %desc_v: tensordesc<16x16xfp16>, %desc_o: tensordesc<64x16xfp16>, %Out: *fp16, %Lse: *fp32, %sm_scale: fp32, %n_ctx: i32) num_warps=4 {
  %acc, %l_i, %m_i, %slot, %phase, %13, %14 = for [schedule={}] %15, %n_ctx, %16, %acc_17, %l_i_18, %m_ij, %slot_20, %phase_21, %22, %23 : tensor<64x16xfp32>, tensor<64xfp32>, tensor<64xfp32>, i32, i32, tensor<64x16xfp16>, tensor<64x16xfp32, #L0> {
    ^(%start_n: i32, %acc_25: tensor<64x16xfp32>, %l_i_26: tensor<64xfp32>, %m_i_27: tensor<64xfp32>, %slot_28: i32, %phase_29: i32, %30: tensor<64x16xfp16>, %31: tensor<64x16xfp32, #L0>)
    %start_n_32 = axis_hint [kind=multiple_of values=(16,)] %start_n : i32
    %33 = binary [kind=add] %head_row, %start_n_32 : i32
    %bar = shared_index %bars, %slot_28 : shared<1xi64, #L1>
    mbarrier_wait %bar, %phase_29
    %37 = shared_index %38, %slot_28 : shared<16x16xfp16, #L2>
    %39 = shared_index %40, %slot_28 : shared<16x16xfp16, #L2>
    %41 = constant [value=0] : i32
    %42 = constant [value=0] : i32
    %43 = shared_permute [order=(1, 0)] %37 : shared<16x16xfp16, #L3>
    %44 = constant [value=0.0] : tensor<64x16xfp32>
    %45 = convert_layout %44 : tensor<64x16xfp32, #L0>
    %qk = warpgroup_mma [is_async=True] %47, %43, %45 : tensor<64x16xfp32, #L0>
    %48 = constant [value=2] : i32
    %49 = constant [value=3] : i32
    %50 = binary [kind=add] %slot_28, %48 : i32
    %slot_51 = binary [kind=mod] %50, %49 : i32
    %52 = shared_index %40, %slot_51 : shared<16x16xfp16, #L2>
    %acc_53 = warpgroup_mma [is_async=True] %30, %52, %31 : tensor<64x16xfp32, #L0>
    %qk_54 = warpgroup_mma_wait [pending=1] %qk : tensor<64x16xfp32, #L0>
    %qk_55 = convert_layout %qk_54 : tensor<64x16xfp32>
    %56 = reduce [axis=1 kind=max] %qk_55 : tensor<64xfp32>
    %57 = splat %qk_scale : tensor<64xfp32>
    %59 = binary [kind=mul] %56, %57 : tensor<64xfp32>
    %m_ij_60 = binary [kind=max] %m_i_27, %59 : tensor<64xfp32>
    %61 = splat %qk_scale : tensor<64x16xfp32>
    %62 = binary [kind=mul] %qk_55, %61 : tensor<64x16xfp32>
    %63 = expand_dims [axis=1] %m_ij_60 : tensor<64x1xfp32>
    %64 = broadcast %63 : tensor<64x16xfp32>
    %65 = binary [kind=sub] %62, %64 : tensor<64x16xfp32>
    %p = unary [kind=exp2] %65 : tensor<64x16xfp32>
    %67 = binary [kind=sub] %m_i_27, %m_ij_60 : tensor<64xfp32>
    %alpha = unary [kind=exp2] %67 : tensor<64xfp32>
    %69 = binary [kind=mul] %l_i_26, %alpha : tensor<64xfp32>
    %70 = reduce [axis=1 kind=sum] %p : tensor<64xfp32>
    %l_i_71 = binary [kind=add] %69, %70 : tensor<64xfp32>
    %72 = binary [kind=add] %head_row, %start_n_32 : i32
    %73 = constant [value=0] : i32
    %74 = constant [value=0] : i32
    %acc_75 = warpgroup_mma_wait [pending=0 anchor=volatile] %acc_53 : tensor<64x16xfp32, #L0>
    %76 = warpgroup_mma_wait [pending=0] %30 : tensor<64x16xfp16>
    %acc_77 = convert_layout %acc_75 : tensor<64x16xfp32>
    %78 = expand_dims [axis=1] %alpha : tensor<64x1xfp32>
    %79 = broadcast %78 : tensor<64x16xfp32>
    %acc_80 = binary [kind=mul] %acc_77, %79 : tensor<64x16xfp32>
    %81 = cast %p : tensor<64x16xfp16>
    %82 = convert_layout %acc_80 : tensor<64x16xfp32, #L0>
    %83 = constant [value=32] : i32
    %84 = binary [kind=add] %start_n, %83 : i32
    %85 = constant [value=2] : i32
    %86 = binary [kind=add] %slot_28, %85 : i32
    %87 = constant [value=3] : i32
    %88 = binary [kind=mod] %86, %87 : i32
    %89 = compare [predicate=ne] %start_n, %90 : i1
    %empty = shared_index %empties, %88 : shared<1xi64, #L1>
    mbarrier_arrive [per_warp=True] %empty, %89
    %93 = constant [value=0] : i32
    %94 = compare [predicate=eq] %slot_28, %93 : i1
    %95 = cast %94 : i32
    %released = binary [kind=xor] %phase_29, %95 : i32
    %empty_97 = shared_index %empties, %88 : shared<1xi64, #L1>
    mbarrier_wait [elected=True] %empty_97, %released
    %98 = compare [predicate=lt] %84, %n_ctx : i1
    %bar_99 = shared_index %bars, %88 : shared<1xi64, #L1>
    mbarrier_expect [nbytes=1024] %bar_99, %98
    %start_n_100 = axis_hint [kind=multiple_of values=(16,)] %84 : i32
    %101 = binary [kind=add] %head_row, %start_n_100 : i32
    %102 = constant [value=0] : i32
    %103 = shared_index %38, %88 : shared<16x16xfp16, #L2>
    tma_async_copy_global_to_shared %desc_k, %101, %102, %bar_99, %103, %98
    %start_n_104 = axis_hint [kind=multiple_of values=(16,)] %84 : i32
    %105 = binary [kind=add] %head_row, %start_n_104 : i32
    %106 = constant [value=0] : i32
    %107 = shared_index %40, %88 : shared<16x16xfp16, #L2>
    tma_async_copy_global_to_shared %desc_v, %105, %106, %bar_99, %107, %98
    %108 = constant [value=1] : i32
    %109 = binary [kind=add] %slot_28, %108 : i32
    %110 = constant [value=3] : i32
    %slot_111 = binary [kind=mod] %109, %110 : i32
    %112 = constant [value=0] : i32
    %113 = compare [predicate=eq] %slot_111, %112 : i1
    %114 = cast %113 : i32
    %phase_115 = binary [kind=xor] %phase_29, %114 : i32
    yield %acc_25, %l_i_71, %m_ij_60, %slot_111, %phase_115, %81, %82
  }
}
"""
