"""warp_specialize's replicated workers (`worker_replicas`, `ll.replica_index`) and per-warp
mbarrier arrivals: one block run by several copies, each on its own warps with its own
named barrier, on the emulator and through ptxas; and the errors for what they cannot do."""

import numpy as np
import pytest

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.errors import CompilationError
from weft.compiler.frontend import build_kernel
from weft.lowlevel import mbarrier
from weft.compiler.backend import ptxas

RNG = np.random.default_rng(5)
ROWS = 32
TILE = ll.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])  # [ROWS, 32] over one warpgroup
COPIES = 3


@ll.jit
def wait_for_copies(done):
    mbarrier.wait(done, 0)


@ll.jit
def scale_rows(src, dst, done, LAYOUT: ll.constexpr):
    """Copy k scales rows [ROWS k, ROWS (k + 1)) by k + 1, syncs its own warps between the
    load and the store, and each of its warps arrives on `done`."""
    copy = ll.replica_index()
    rows = copy * 32 + ll.arange(0, 32, ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, 32, ll.SliceLayout(0, LAYOUT))
    offsets = rows[:, None] * 32 + cols[None, :]
    x = ll.load(src + offsets)
    ll.barrier()
    ll.store(dst + offsets, x * (copy + 1).to(ll.float32))
    mbarrier.arrive(done, per_warp=True)


@ll.jit
def replicated_kernel(src, dst, COPIES: ll.constexpr):
    done = mbarrier.allocate_mbarrier()
    mbarrier.init(done, count=4 * COPIES)  # every warp of every copy arrives once
    ll.warp_specialize((done,), wait_for_copies, (src, dst, done, TILE), [scale_rows],
                       worker_num_warps=[4], worker_num_regs=[0], worker_replicas=[COPIES])
    mbarrier.invalidate(done)


def test_copies_run_one_block_each_with_its_own_index_on_the_emulator():
    src = RNG.standard_normal((COPIES * ROWS, 32)).astype(np.float32)
    dst = np.full_like(src, np.nan)
    replicated_kernel[(1,)](src, dst, COPIES, num_warps=4)
    scale = np.repeat(np.arange(1, COPIES + 1, dtype=np.float32), ROWS)[:, None]
    np.testing.assert_array_equal(dst, src * scale)


def test_replicated_worker_is_one_block_in_the_ir():
    kernel = build_kernel(replicated_kernel, {"src": "*fp32", "dst": "*fp32"}, {"COPIES": COPIES}, 4)
    ops = [op for op in kernel.walk() if isinstance(op, ir.WarpSpecialize)]
    assert len(ops) == 1 and len(ops[0].workers) == 1 and ops[0].worker_replicas == (COPIES,)
    assert kernel.total_warps == 4 + 4 * COPIES


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
def test_copies_share_code_and_sync_on_their_own_named_barriers():
    compiled = replicated_kernel.compile(signature={"src": "*fp32", "dst": "*fp32"},
                                         constexprs={"COPIES": COPIES}, num_warps=4)
    ptx = compiled.asm["ptx"]
    assert ptx.count("st.global") == ptx.count("ld.global") > 0  # the worker's code, once
    assert "bar.sync \t%r" in ptx or "bar.sync %r" in ptx  # the copy's barrier id is a register
    assert "bar.warp.sync" in ptx  # a per-warp arrive: the warp synced, then its lane 0 arrives
    assert compiled.metadata["total_warps"] == 4 + 4 * COPIES


def _error(fn, signature=None, constexprs=None) -> str:
    with pytest.raises(CompilationError) as info:
        fn.compile(signature=signature or {}, constexprs=constexprs or {}, num_warps=4)
    return str(info.value)


@ll.jit
def wrong_copy_count(src, dst):
    done = mbarrier.allocate_mbarrier()
    ll.warp_specialize((done,), wait_for_copies, (src, dst, done, TILE), [scale_rows],
                       worker_num_warps=[4], worker_num_regs=[0], worker_replicas=[2, 2])


@ll.jit
def column_sums(LAYOUT: ll.constexpr):
    ll.sum(ll.zeros([32, 32], ll.float32, LAYOUT), axis=0)  # across the copy's warps: scratch


@ll.jit
def replicated_scratch():
    ll.warp_specialize((TILE,), column_sums, (TILE,), [column_sums], worker_num_warps=[4],
                       worker_num_regs=[0], worker_replicas=[2])


@ll.jit
def per_warp_outside_partitions(src, dst):
    done = mbarrier.allocate_mbarrier()
    mbarrier.init(done, count=4)
    ll.warp_specialize((done,), wait_for_copies, (src, dst, done, TILE), [scale_rows],
                       worker_num_warps=[4], worker_num_regs=[0], worker_replicas=[1])
    mbarrier.arrive(done, per_warp=True)


def test_misuse_gets_errors_that_say_what_to_change():
    text = _error(wrong_copy_count, {"src": "*fp32", "dst": "*fp32"})
    assert "worker_replicas must list 1 compile-time ints" in text
    text = _error(replicated_scratch)
    assert "shared scratch memory" in text and "replicated" in text and "ll.sum" in text
    text = _error(per_warp_outside_partitions, {"src": "*fp32", "dst": "*fp32"})
    assert "per-warp mbarrier arrive outside warp_specialize" in text
    with pytest.raises(CompilationError, match="per_warp must be a compile-time True or False"):
        mbarrier_arrive_bad.compile(signature={}, constexprs={}, num_warps=4)


@ll.jit
def mbarrier_arrive_bad():
    done = mbarrier.allocate_mbarrier()
    mbarrier.init(done, count=1)
    mbarrier.arrive(done, per_warp=1)
