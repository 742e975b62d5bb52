"""The emulator sees the two warpgroups of a turn-taking partition apart
(runtime/emulator/warpgroup_replay.py): pingpong_warpgroups' turns forced onto a 2-stage
K/V ring whose slots go back as deeper rings release them deadlock on the GPU (warpgroup 0, holding the turn, waits for a slot that
warpgroup 1 releases only after its next take) and are reported so, naming where each
unit waits; the same turns at 3 stages run and agree with numpy float64. Then the replay
alone on hand-made records: a partition-wide bar.sync inside a turn, and turns that
go around."""

import numpy as np
import pytest

from weft.compiler.errors import Loc
from weft.compiler.ir import WarpgroupTurn
from weft.compiler.passes import pingpong_warpgroups, pipeline_tma_warp_specialize
from weft.runtime.emulator import emulate
from weft.runtime.emulator.errors import EmulationError
from ..highlevel.test_attention_example import reference
from ..highlevel.test_attention_ws_rings import compiled, inputs


BLOCK = (128, 64)  # two consumer warpgroups of 64 rows each, 64-key blocks


def turned(causal: bool, stages: int, monkeypatch):
    """The descriptor attention, warp-specialized on 8 warps, its turns taken at any
    stage count of 2 or more."""
    monkeypatch.setattr(pingpong_warpgroups, "MIN_STAGES", 2)
    kernel = compiled(64, BLOCK, causal, warp_specialize=True, stages=stages, pingpong=True)
    assert any(isinstance(op, WarpgroupTurn) for op in kernel.walk())
    return kernel


def launch(kernel, n_ctx: int):
    from weft.highlevel.tools.tensor_descriptor import TensorDescriptor

    q, k, v = inputs(n_ctx, 64, heads=1)
    out, lse = np.zeros_like(q), np.zeros((1, 1, n_ctx), np.float32)
    descs = [TensorDescriptor(t, [n_ctx, 64], [64, 1], [rows, 64])
             for t, rows in ((q, BLOCK[0]), (k, BLOCK[1]), (v, BLOCK[1]), (out, BLOCK[0]))]
    emulate(kernel, (-(-n_ctx // BLOCK[0]), 1), (*descs, out, lse, 64 ** -0.5, n_ctx))
    return (q, k, v), out, lse


def test_turns_on_a_two_stage_ring_are_a_deadlock(monkeypatch):
    """Four key blocks, each slot released after the next iteration's reads (as deeper
    rings release it): block 2 refills the slot of block 0, which warpgroup 1 releases
    after its P V_1, behind the take that warpgroup 0 (waiting for block 2) holds."""
    monkeypatch.setattr(pipeline_tma_warp_specialize, "releases_early", lambda split, dot_ahead: False)
    kernel = turned(False, 2, monkeypatch)
    with pytest.raises(EmulationError) as caught:
        launch(kernel, 256)
    message = str(caught.value)
    assert "deadlock on the GPU" in message
    lines = message.splitlines()
    group0 = next(i for i, line in enumerate(lines) if "warpgroup 0 (warps 0-3) waits" in line)
    group1 = next(i for i, line in enumerate(lines) if "warpgroup 1 (warps 4-7) waits" in line)
    producer = next(i for i, line in enumerate(lines) if "worker 0 waits" in line)
    assert "mbarrier_wait for phase 1 of mbarrier `bars[0]`" in lines[group0]
    assert "warpgroup_turn take" in lines[group1] and "acc = tl.dot(p.to(v.dtype), v, acc)" in lines[group1 + 1]
    assert "mbarrier_wait for phase 0 of mbarrier `empties[0]`" in lines[producer]
    assert "3 or more stages" in message


@pytest.mark.parametrize("causal, n_ctx", [(False, 256), (True, 384)])
def test_the_same_turns_on_three_stages_match_numpy(monkeypatch, causal, n_ctx):
    kernel = turned(causal, 3, monkeypatch)
    (q, k, v), out, lse = launch(kernel, n_ctx)
    expected, expected_lse = reference(q, k, v, causal, 64 ** -0.5)
    np.testing.assert_allclose(out.astype(np.float64), expected, atol=2e-3, rtol=0)
    np.testing.assert_allclose(lse, expected_lse, atol=1e-4, rtol=1e-5)


class _Bar:
    """What SyncReplay reads of an mbarrier.MBarrier."""

    def __init__(self, name: str, count: int):
        self.name, self.count, self.pending, self.tx, self.completed = name, count, count, 0, 0
        self.invalidated_by = None


class _Shared:
    def __init__(self, *in_flight, **bars):
        self.mbarriers = bars
        self.in_flight = list(in_flight)  # TMA loads issued and not landed (mbarrier.TmaInFlight's fields)


class _Load:
    def __init__(self, barrier: str, nbytes: int):
        self.barrier, self.nbytes = barrier, nbytes


def _op(action: str, line: int):
    return WarpgroupTurn(action=action, barrier=5, loc=Loc("kernel.py", line, 4, f"turn {action}\n"))


def _replay(shared):
    from weft.runtime.emulator.warpgroup_replay import SyncReplay

    return SyncReplay(shared, [("default partition", 0, 8, True), ("worker 0", 8, 4, False)])


def test_replay_turns_that_go_around_finish():
    replay = _replay(_Shared())
    for action, line in [("open", 1), ("take", 2), ("pass", 3), ("take", 4), ("pass", 5)]:
        replay.turn(0, _op(action, line))
    replay.check()


def test_replay_a_partition_sync_inside_a_turn_is_a_deadlock():
    """Warpgroup 0 holds the turn at a bar.sync of the whole partition that warpgroup 1,
    waiting for the turn, never reaches."""
    class Running:
        current_op = _op("take", 7)  # stands for the op whose rule syncs the partition

    replay = _replay(_Shared())
    replay.running = Running()
    replay.turn(0, _op("open", 1))
    replay.turn(0, _op("take", 2))
    replay.sync(0, 8)
    replay.turn(0, _op("pass", 3))
    with pytest.raises(EmulationError, match="deadlock on the GPU") as caught:
        replay.check()
    message = str(caught.value)
    assert "warpgroup 0 (warps 0-3) waits at kernel.py:7:4: bar.sync of the partition" in message
    assert "warpgroup 1 (warps 4-7) waits at kernel.py:2:4: warpgroup_turn take" in message


def test_replay_a_wait_on_a_phase_nobody_completes_names_the_barrier():
    bar = _Bar("`full[0]`", 1)
    replay = _replay(_Shared(**{"64": bar}))
    replay.record(range(8, 12), "wait", "64", 1, _op("take", 9))
    with pytest.raises(EmulationError, match=r"worker 0 waits at kernel.py:9:4: mbarrier_wait for phase 0 of "
                                             r"mbarrier `full\[0\]` \(0 phases completed\)"):
        replay.check()
    replay = _replay(_Shared(**{"64": bar}))
    replay.record([0], "expect", "64", 128, _op("take", 9))
    replay.record([0], "arrive", "64", 1, _op("take", 9))
    replay.record([8], "load", "64", 128, _op("take", 9))
    replay.record(range(8, 12), "wait", "64", 1, _op("take", 9))
    replay.check()  # the expect's arrival and the load's bytes complete phase 0


def test_replay_lands_a_load_in_flight_at_the_split():
    """A box whose copy and expect came before the split (wait_boxes_in_consumers: Q waited
    for inside the consumers): its bytes land in the replay as a load issued within it does."""
    def started():
        bar = _Bar("`q`", 1)
        bar.pending, bar.tx = 0, 128  # the expect arrived, its bytes not landed
        return bar

    replay = _replay(_Shared(_Load("64", 128), **{"64": started()}))
    replay.record(range(8), "wait", "64", 1, _op("take", 9))
    replay.check()
    replay = _replay(_Shared(**{"64": started()}))  # nothing in flight: the phase never completes
    replay.record(range(8), "wait", "64", 1, _op("take", 9))
    with pytest.raises(EmulationError, match="deadlock on the GPU"):
        replay.check()
