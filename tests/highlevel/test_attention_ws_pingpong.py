"""The warp-specialized descriptor attention launched with `pingpong=True`: its two
consumer warpgroups take turns at the tensor cores (compiler/passes/pingpong_warpgroups.py,
WarpgroupTurn on named barriers). On the CPU emulator against numpy float64 (causal and
not, tails, stages, shuffled TMA completions); the emulator's turn checks catching the
orders that deadlock or pass a turn twice (runtime/emulator/turns.py), on kernels and on
bare turn sequences; the IR; the Hopper configs through ptxas without spills and without
ptxas serializing the wgmmas."""

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft.compiler.ir import For, WarpgroupMma, WarpgroupMmaWait, WarpgroupTurn, WarpSpecialize
from weft.compiler.errors import Loc
from weft.highlevel import attention_descriptor_example as example
from weft.runtime.emulator.errors import EmulationError
from weft.runtime.emulator.turns import TurnOrder

from ._compile import HAS_PTXAS
from .test_attention_ws_rings import check, compiled, constexprs, signature
from .test_attention_ws_split import run_kernel, split_of, without


DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"

# (n_ctx, head_dim, causal, BLOCK_M, num_stages, WEFT_EMULATE_SHUFFLE, pingpong): 8 warps,
# BLOCK_N 64; at BLOCK_M 256 each warpgroup holds 128 rows.
CASES = [(200, 64, True, 128, 3, None, True), (130, 128, True, 128, 3, None, True), (100, 64, False, 128, 4, 7, True),
         (300, 64, True, 256, 3, 3, "after_wait")]


@pytest.mark.parametrize("n_ctx,head_dim,causal,block_m,stages,shuffle,pingpong", CASES)
def test_pingpong_attention_matches_numpy(monkeypatch, n_ctx, head_dim, causal, block_m, stages, shuffle, pingpong):
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    check(n_ctx, head_dim, causal, (block_m, 64), 8, stages, warp_specialize=True, pingpong=pingpong)


@settings(max_examples=100 if DEEP else 4, deadline=None, suppress_health_check=list(HealthCheck))
@given(block=st.sampled_from([(128, 64), (128, 128), (256, 64)]), stages=st.integers(3, 4), causal=st.booleans(),
       m_blocks=st.integers(1, 2), tail=st.sampled_from([0, 1, 33]), shuffle=st.sampled_from([None, 5]),
       pingpong=st.sampled_from([True, "after_wait"]))
def test_pingpong_property(monkeypatch, block, stages, causal, m_blocks, tail, shuffle, pingpong):
    """Any block, stage count, causal or not, tail, completion order and turn hand-over:
    the emulator (turn order checked) agrees with numpy."""
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    check(m_blocks * block[0] - tail, 64, causal, block, 8, stages, warp_specialize=True, pingpong=pingpong)


def turns_in(ops) -> list[str]:
    return [op.action for op in ops if isinstance(op, WarpgroupTurn)]


@pytest.mark.parametrize("causal, pingpong", [(False, True), (True, True), (True, "after_wait")])
def test_the_turns_go_around_the_issue_of_both_dots(causal, pingpong):
    kernel = compiled(64, (128, 64), causal, warp_specialize=True, pingpong=pingpong)
    consumer = split_of(kernel).default
    loops = [op for op in consumer.ops if isinstance(op, For)]
    assert len(loops) == (2 if causal else 1)
    # Once: open; per loop: take before it, pass after it (and its drain).
    assert turns_in(consumer.ops) == ["open"] + ["take", "pass"] * len(loops)
    for loop in loops:
        body = list(loop.body.ops)
        first, second = [i for i, op in enumerate(body) if isinstance(op, WarpgroupMma)]
        turns = [(i, op.action) for i, op in enumerate(body) if isinstance(op, WarpgroupTurn)]
        (pass_at, passed), (take_at, taken) = turns
        assert (passed, taken) == ("pass", "take")
        assert first < pass_at < take_at == second - 1
        waits_before = sum(isinstance(op, WarpgroupMmaWait) for op in body[first:pass_at])
        assert (pass_at == first + 1) if pingpong is True else waits_before >= 1
    # The named barriers come after the partitions' own (1 .. 4 here).
    assert {op.barrier for op in kernel.walk() if isinstance(op, WarpgroupTurn)} == {5}


def test_turns_by_default_in_a_split_and_none_when_refused_or_unsplit():
    """Not given, pingpong is taken wherever a split's two-dot loop has two consumer
    warpgroups and 3 or more stages; pingpong=False, or no split, takes no turns."""
    def turns(kernel):
        return any(isinstance(op, WarpgroupTurn) for op in kernel.walk())
    assert turns(compiled(64, (128, 64), True, warp_specialize=True))
    for kernel in (compiled(64, (128, 64), True, warp_specialize=True, pingpong=False),
                   compiled(64, (128, 64), True, pingpong=True)):
        assert not turns(kernel)


def test_two_stages_by_default_take_no_turns_silently():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel = compiled(64, (128, 64), True, warp_specialize=True, stages=2)
    assert not any(isinstance(op, WarpgroupTurn) for op in kernel.walk())


def test_two_stages_take_no_turns_and_warn():
    """With 2 stages whose slots go back after P V's wait (dot_ahead's order) the turns
    would deadlock on the GPU against the ring's releases (pingpong_warpgroups' docstring;
    tests/runtime/test_emulator_turns.py has the emulator report it): no turns, and a
    warning at the loop."""
    from weft.compiler.errors import CompilationWarning

    with pytest.warns(CompilationWarning, match="pingpong is not applied"):
        kernel = compiled(64, (128, 64), True, warp_specialize=True, stages=2, pingpong=True, dot_ahead=True)
    assert not any(isinstance(op, WarpgroupTurn) for op in kernel.walk())


def test_the_emulator_catches_a_turn_order_that_deadlocks():
    """Without the open, warpgroup 0's first take waits for warpgroup 1, which waits for
    warpgroup 0's first pass."""
    kernel = compiled(64, (128, 64), True, warp_specialize=True, stages=3, pingpong=True, num_warps=8)
    kernel = without(kernel, lambda op: isinstance(op, WarpgroupTurn) and op.action == "open")
    with pytest.raises(EmulationError, match="deadlock"):
        run_kernel(kernel, 256, (128, 64))


def test_the_emulator_catches_a_loop_that_keeps_the_turn():
    kernel = compiled(64, (128, 64), False, warp_specialize=True, stages=3, pingpong=True, num_warps=8)
    split = split_of(kernel)
    (loop,) = [op for op in split.default.ops if isinstance(op, For)]
    in_loop = {id(op) for op in loop.body.ops if isinstance(op, WarpgroupTurn) and op.action == "pass"}
    with pytest.raises(EmulationError, match="deadlock"):
        run_kernel(without(kernel, lambda op: id(op) in in_loop), 256, (128, 64))


def turn(action: str) -> WarpgroupTurn:
    return WarpgroupTurn(action=action, barrier=5, loc=Loc("turns.py", 1, 0))


@pytest.mark.parametrize("actions", [["open", "take", "pass", "take", "pass"], ["open", "take", "pass"],
                                     ["open"], []])
def test_turn_orders_that_run(actions):
    order = TurnOrder()
    for action in actions:
        order.record(turn(action))


@pytest.mark.parametrize("actions, error", [(["take"], "deadlock"), (["open", "take", "take"], "deadlock"),
                                            (["open", "pass"], "again"), (["open", "take", "pass", "pass"], "again")])
def test_turn_orders_the_emulator_refuses(actions, error):
    order = TurnOrder()
    with pytest.raises(EmulationError, match=error):
        for action in actions:
            order.record(turn(action))


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found")
@pytest.mark.parametrize("head_dim, block, causal, pingpong",
                         [(64, (128, 64), False, True), (64, (128, 64), True, True), (128, (128, 64), False, True),
                          (128, (128, 64), True, True), (64, (128, 64), True, "after_wait"),
                          (64, (256, 64), True, True)])
def test_the_hopper_configs_assemble_without_spills_or_serialized_wgmmas(head_dim, block, causal, pingpong):
    kernel = example.attention_kernel.compile(signature=signature(head_dim, block), num_warps=8, num_stages=3,
                                              constexprs=constexprs(head_dim, block, causal, True),
                                              pingpong=pingpong)
    ptx = kernel.asm["ptx"]
    assert "bar.arrive 6, 256" in ptx and "bar.arrive 5, 256" in ptx
    assert kernel.metadata["spill_stores"] == 0 and kernel.metadata["spill_loads"] == 0, kernel.metadata
    assert not kernel.metadata["performance_warnings"], kernel.metadata["performance_warnings"]


def test_turns_need_a_partition_of_two_warpgroups():
    kernel = compiled(64, (64, 64), False, warp_specialize=True, num_warps=4)
    split = split_of(kernel)
    stray = dataclasses.replace(split, default=type(split.default)(
        split.default.args, (turn("open"),) + split.default.ops))
    kernel = kernel.with_body(type(kernel.body)(kernel.body.args, tuple(
        stray if isinstance(op, WarpSpecialize) else op for op in kernel.body.ops)))
    with pytest.raises(EmulationError, match="two warpgroups"):
        run_kernel(kernel, 128, (64, 64))


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, block, pingpong", [(64, (128, 64), True), (128, (128, 64), True),
                                                       (64, (256, 64), True), (128, (128, 64), "after_wait")])
@pytest.mark.parametrize("causal", [False, True])
def test_on_the_gpu_against_float32_torch(head_dim, block, pingpong, causal):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    q, k, v = (torch.randn(2, 3, 1000, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    out, _ = example.attention(q, k, v, causal, block=block, num_warps=8, num_stages=3, warp_specialize=True,
                               pingpong=pingpong)
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=1e-2)
