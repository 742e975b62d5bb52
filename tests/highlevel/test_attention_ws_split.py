"""The descriptor attention forward launched with WARP_SPECIALIZE (its key loops written
`tl.range(..., warp_specialize=True)`): a producer partition fills the K and V ring and
the consumer warps run the loop bodies with the carried m, l and acc
(pipeline_tma_warp_specialize). Causal attention's two key loops are one split: one
producer walks both loops' boxes through one ring, (slot, phase) carried on from the
first loop into the second on both sides. On the CPU emulator (partitions interleaved,
race and deadlock checks on) against numpy float64 over blocks, stages, causal, tails
and shuffled TMA completions; the emulator catching a consumer that does not hand the
first loop's last slot back and a producer that does not wait for the release; the IR;
the Hopper configs through ptxas without spills."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weft.compiler.ir import (AllocateSharedMemory, For, MBarrierArrive, MBarrierWait, TmaAsyncCopyGlobalToShared,
                              WarpgroupMma, WarpSpecialize)
from weft.highlevel import attention_descriptor_example as example
from weft.runtime.emulator.errors import EmulationError

from ._compile import HAS_PTXAS
from .test_attention_ws_rings import check, compiled, constexprs, inputs, signature


DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"

# (BLOCK_M, BLOCK_N, num_warps): a warpgroup, and two stacked along M.
BLOCKS = [(64, 32, 4), (64, 64, 4), (128, 64, 8)]


@settings(max_examples=200 if DEEP else 6, deadline=None, suppress_health_check=list(HealthCheck))
@given(blocks=st.sampled_from(BLOCKS), stages=st.integers(2, 4), causal=st.booleans(), m_blocks=st.integers(1, 3),
       tail=st.sampled_from([0, 1, 17]), shuffle=st.sampled_from([None, 5]))
def test_split_attention_property(monkeypatch, blocks, stages, causal, m_blocks, tail, shuffle):
    """Any block, stage count, causal or not, tail and TMA completion order: the emulator
    agrees with numpy."""
    if shuffle is None:
        monkeypatch.delenv("WEFT_EMULATE_SHUFFLE", raising=False)
    else:
        monkeypatch.setenv("WEFT_EMULATE_SHUFFLE", str(shuffle))
    block_m, block_n, num_warps = blocks
    n_ctx = m_blocks * block_m - tail
    check(n_ctx, 64, causal, (block_m, block_n), num_warps, stages, warp_specialize=True)


@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_128_matches_numpy(causal):
    check(130, 128, causal, (128, 64), 8, 3, warp_specialize=True)


def split_of(kernel) -> WarpSpecialize:
    (split,) = [op for op in kernel.walk() if isinstance(op, WarpSpecialize)]
    return split


@pytest.mark.parametrize("causal", [False, True])
def test_one_producer_fills_one_ring_for_every_key_loop(causal):
    kernel = compiled(64, (128, 64), causal, warp_specialize=True)
    split = split_of(kernel)
    loops = 2 if causal else 1
    consumer_loops = [op for op in split.default.ops if isinstance(op, For)]
    producer_loops = [op for op in split.workers[0].ops if isinstance(op, For)]
    assert len(consumer_loops) == len(producer_loops) == loops
    # The second loop starts at the (slot, phase) where the first stopped, on both sides.
    for side in (consumer_loops, producer_loops):
        if causal:
            assert side[1].inits[-2:] == side[0].results[-2:]
    producer = list(split.workers[0].walk())
    assert sum(isinstance(op, TmaAsyncCopyGlobalToShared) for op in producer) == 2 * loops  # K and V
    assert not any(isinstance(op, WarpgroupMma) for op in producer)
    consumer = list(split.default.walk())
    assert not any(isinstance(op, TmaAsyncCopyGlobalToShared) for op in consumer)
    assert sum(isinstance(op, WarpgroupMma) for op in consumer) == 2 * loops
    # One K ring and one V ring ([stages, 64, 64] boxes), whatever the number of loops.
    rings = [op for op in kernel.body.ops if isinstance(op, AllocateSharedMemory) and op.result.type.shape == (3, 64, 64)]
    assert len(rings) == 2
    # The first loop's last slot goes back between the loops.
    between = [op for op in split.default.ops if isinstance(op, MBarrierArrive)]
    assert len(between) == loops - 1 and all(op.per_warp for op in between)


def without(kernel, unwanted):
    """`kernel` with the ops `unwanted(op)` picks dropped, wherever they are."""
    def block(region):
        ops = [op.map_regions(block) for op in region.ops if not unwanted(op)]
        return type(region)(region.args, tuple(ops))
    return kernel.with_body(block(kernel.body))


def run_kernel(kernel, n_ctx: int, block, num_warps: int = 4):
    """`kernel` (a compiled causal attention_kernel, head_dim 64) launched on the emulator."""
    from weft.runtime.emulator import emulate

    q, k, v = inputs(n_ctx, 64, heads=1)
    out, lse = np.empty_like(q), np.empty((1, 1, n_ctx), np.float32)
    from weft.highlevel.tools.tensor_descriptor import TensorDescriptor

    descs = [TensorDescriptor(t, [n_ctx, 64], [64, 1], [rows, 64])
             for t, rows in ((q, block[0]), (k, block[1]), (v, block[1]), (out, block[0]))]
    emulate(kernel, (n_ctx // block[0], 1), (*descs, out, lse, 0.125, n_ctx))


def test_the_emulator_catches_a_first_loop_whose_last_slot_is_never_released():
    """Without the arrival between the loops, the producer's second lap of the shared
    ring waits for that slot forever."""
    block = (64, 32)
    kernel = compiled(64, block, True, warp_specialize=True, stages=2, num_warps=4)
    split = split_of(kernel)
    between = {id(op) for op in split.default.ops if isinstance(op, MBarrierArrive)}
    with pytest.raises(EmulationError, match="deadlock"):
        run_kernel(without(kernel, lambda op: id(op) in between), 256, block)


def test_the_emulator_catches_a_producer_that_does_not_wait_for_the_release():
    block = (64, 32)
    kernel = compiled(64, block, True, warp_specialize=True, stages=2, num_warps=4)
    kernel = without(kernel, lambda op: isinstance(op, MBarrierWait) and op.barrier.hint.startswith("empty"))
    with pytest.raises(EmulationError, match="shared-memory race|more arrivals than init"):
        run_kernel(kernel, 256, block)


@pytest.mark.skipif(not HAS_PTXAS, reason="ptxas not found")
@pytest.mark.parametrize("head_dim, block, causal", [(64, (128, 64), False), (64, (128, 64), True),
                                                     (128, (128, 64), False), (128, (128, 64), True)])
def test_the_hopper_configs_assemble_without_spills(head_dim, block, causal):
    kernel = example.attention_kernel.compile(signature=signature(head_dim, block), num_warps=8, num_stages=3,
                                              constexprs=constexprs(head_dim, block, causal, True))
    ptx = kernel.asm["ptx"]
    for instruction in ("cp.async.bulk.tensor.2d.shared::cluster.global", "setmaxnreg.dec.sync.aligned.u32 40",
                        "setmaxnreg.inc.sync.aligned.u32 232"):
        assert instruction in ptx, instruction
    assert kernel.metadata["spill_stores"] == 0 and kernel.metadata["spill_loads"] == 0, kernel.metadata


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
                               warp_specialize=warp_specialize)
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=1e-2)
