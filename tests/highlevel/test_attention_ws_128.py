"""The descriptor attention forward at head_dim 128 in 128 x 128 tiles, warp-specialized
over a 2-stage ring (3 stages of 64 KB K and V boxes do not fit beside Q and O): P V stays
in flight across the back edge, and the consumers hand the previous iteration's slot back
right after the wait that retires its P V, so the producer fills it while the softmax and
P V of this iteration run (pipeline_tma_loops, pipeline_tma_warp_specialize); with
dot_ahead, Q K^T of block j issued with P V of block j - 1 (issue_dot_ahead, whose
register budget is larger in a split's consumers); with pingpong=True, the two consumer
warpgroups taking turns at the tensor cores, which the early release makes safe at 2
stages (pingpong_warpgroups). On the CPU emulator (partitions
interleaved, race and deadlock checks on) against numpy float64, causal and not, tails
and shuffled TMA completions; the emulator catching a release placed before that wait;
the IR; ptxas without spills; the GPU against float32 torch."""

import dataclasses

import numpy as np
import pytest

from weft.compiler.ir import For, MBarrierArrive, MBarrierWait, WarpgroupMma, WarpgroupMmaWait, WarpgroupTurn
from weft.highlevel import attention_descriptor_example as example
from weft.runtime.emulator.errors import EmulationError

from ._compile import HAS_PTXAS
from .test_attention_ws_rings import check, compiled, constexprs, inputs, signature
from .test_attention_ws_split import split_of

WIDE = (128, 128)
SPLIT = {"warp_specialize": True, "pingpong": False}
TURNS = {"warp_specialize": True, "pingpong": True}


# (n_ctx, causal, dot_ahead, WEFT_EMULATE_SHUFFLE): a tail (n_ctx not a multiple of 128)
# and whole blocks, TMA completions in order or shuffled.
CASES = [(130, False, False, None), (256, True, False, 5), (200, True, False, None), (130, False, True, 7),
         (256, True, True, 3)]


@pytest.mark.parametrize("n_ctx,causal,dot_ahead,shuffle", CASES)
def test_wide_tiles_in_two_stages_match_numpy(monkeypatch, n_ctx, causal, dot_ahead, shuffle):
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    check(n_ctx, 128, causal, WIDE, 8, 2, dot_ahead=dot_ahead, **SPLIT)


# (n_ctx, causal, WEFT_EMULATE_SHUFFLE) with turns; the emulator replays the two
# warpgroups apart and reports a deadlock of turns against the ring's barriers.
TURN_CASES = [(512, False, None), (384, True, 5), (200, False, 7)]


@pytest.mark.parametrize("n_ctx,causal,shuffle", TURN_CASES)
def test_turns_in_two_stages_match_numpy(monkeypatch, n_ctx, causal, shuffle):
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    assert any(isinstance(op, WarpgroupTurn) for op in compiled(128, WIDE, causal, stages=2, **TURNS).walk())
    check(n_ctx, 128, causal, WIDE, 8, 2, **TURNS)


@pytest.mark.parametrize("causal", [False, True])
def test_two_stages_take_turns_by_default_at_head_dim_128(causal):
    """Not given, pingpong takes 2-stage turns where the first dot reduces over 128
    (head_dim 128), and matches numpy there with the warpgroups replayed apart."""
    kernel = compiled(128, WIDE, causal, stages=2, warp_specialize=True)
    assert any(isinstance(op, WarpgroupTurn) for op in kernel.walk())
    check(200, 128, causal, WIDE, 8, 2, warp_specialize=True)


def test_two_stages_take_turns_at_head_dim_64_only_when_asked():
    """At head_dim 64 the 2-stage turns measured slower: only pingpong=True takes them."""
    assert not any(isinstance(op, WarpgroupTurn)
                   for op in compiled(64, WIDE, False, stages=2, warp_specialize=True).walk())
    assert any(isinstance(op, WarpgroupTurn) for op in compiled(64, WIDE, False, stages=2, **TURNS).walk())


def consumer_loops(kernel) -> list[For]:
    return [op for op in split_of(kernel).default.ops if isinstance(op, For)]


@pytest.mark.parametrize("causal", [False, True])
def test_the_previous_slot_goes_back_before_the_softmax(causal):
    """Per loop: the slot's full barrier, Q K^T, one wait(0) (it retires the previous
    iteration's P V), the release, then P V left in flight (no wait after it)."""
    for loop in consumer_loops(compiled(128, WIDE, causal, stages=2, **SPLIT)):
        ops = [op for op in loop.body.ops if isinstance(op, (MBarrierWait, MBarrierArrive, WarpgroupMma,
                                                              WarpgroupMmaWait))]
        assert [type(op) for op in ops] == [MBarrierWait, WarpgroupMma, WarpgroupMmaWait, MBarrierArrive,
                                            WarpgroupMma]
        assert ops[2].pending == 0 and ops[3].per_warp


@pytest.mark.parametrize("causal", [False, True])
def test_dot_ahead_issues_both_dots_together_in_two_stages(causal):
    """With dot_ahead the release stays after P V's wait (issue_dot_ahead's order): Q K^T
    of block j and P V of block j - 1 issued together, then wait(1) and wait(0)."""
    for loop in consumer_loops(compiled(128, WIDE, causal, stages=2, dot_ahead=True, **SPLIT)):
        ops = [op for op in loop.body.ops if isinstance(op, (MBarrierArrive, WarpgroupMma, WarpgroupMmaWait))]
        assert [type(op) for op in ops] == [WarpgroupMma, WarpgroupMma, WarpgroupMmaWait, WarpgroupMmaWait,
                                            MBarrierArrive]
        assert [op.pending for op in ops[2:4]] == [1, 0]


def test_the_emulator_catches_a_release_before_the_wait():
    """The release moved above the wait that retires the previous P V: the producer's
    refill lands on V while that P V may still read it."""
    kernel = compiled(128, WIDE, False, stages=2, **SPLIT)
    emulate_wide(kernel, 512)  # as compiled: no race

    def early(region):
        ops = [op.map_regions(early) for op in region.ops]
        releases = [op for op in ops if isinstance(op, MBarrierArrive) and op.per_warp]
        waits = [op for op in ops if isinstance(op, WarpgroupMmaWait)]
        if releases and waits and any(isinstance(op, WarpgroupMma) for op in ops):
            start, end = ops.index(waits[0]), ops.index(releases[0])
            needed, moved = set(releases[0].uses()), [releases[0]]
            for op in reversed(ops[start + 1:end]):  # the release's predicate and barrier
                if needed & set(op.defines()):
                    needed |= set(op.uses())
                    moved.insert(0, op)
            ids = {id(op) for op in moved}
            ops = ops[:start] + moved + [op for op in ops[start:] if id(op) not in ids]
        return dataclasses.replace(region, ops=tuple(ops))

    with pytest.raises(EmulationError, match="shared-memory race"):
        emulate_wide(kernel.with_body(early(kernel.body)), 512)


def emulate_wide(kernel, n_ctx: int) -> None:
    """`kernel` (attention_kernel compiled for 128 x 128 tiles at head_dim 128, not causal)
    launched on the emulator over one head."""
    from weft.highlevel.tools.tensor_descriptor import TensorDescriptor
    from weft.runtime.emulator import emulate

    q, k, v = inputs(n_ctx, 128, heads=1)
    out, lse = np.empty_like(q), np.empty((1, 1, n_ctx), np.float32)
    descs = [TensorDescriptor(t, [n_ctx, 128], [128, 1], [128, 128]) for t in (q, k, v, out)]
    emulate(kernel, (n_ctx // 128, 1), (*descs, out, lse, 128 ** -0.5, n_ctx))


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found")
@pytest.mark.parametrize("causal,dot_ahead,pingpong", [(False, False, False), (True, False, False),
                                                      (False, True, False), (False, False, True),
                                                      (True, False, True)])
def test_wide_tiles_assemble_without_spills(causal, dot_ahead, pingpong):
    kernel = example.attention_kernel.compile(signature=signature(128, WIDE), num_warps=8, num_stages=2,
                                              constexprs=constexprs(128, WIDE, causal, True), pingpong=pingpong,
                                              dot_ahead=dot_ahead)
    ptx = kernel.asm["ptx"]
    for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global", "setmaxnreg.inc.sync.aligned.u32 232"):
        assert instruction in ptx, instruction
    assert kernel.metadata["spill_stores"] == 0 and kernel.metadata["spill_loads"] == 0, kernel.metadata


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dot_ahead,pingpong", [(False, False), (True, False), (False, True)])
def test_on_the_gpu_against_float32_torch(causal, dot_ahead, pingpong):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    q, k, v = (torch.randn(2, 3, 1000, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    out, _ = example.attention(q, k, v, causal, block=WIDE, num_warps=8, num_stages=2, dot_ahead=dot_ahead,
                               warp_specialize=True, pingpong=pingpong)
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=1e-2)
