"""mbarriers (Gluon's `mbarrier` module): 8-byte shared-memory barriers that count thread
arrivals and async-copy bytes per phase.

    bars = mbarrier.allocate_mbarrier(batch=STAGES)    # i64 [STAGES, 1]
    mbarrier.init(bars.index(s), count=1)
    mbarrier.expect(bar, desc.nbytes)                   # one arrival + bytes to wait for
    mbarrier.wait(bar, phase)                           # until that phase has completed

"One thread issues" ops (init, expect, arrive, invalidate) count once per partition,
whatever its warp count. A fresh barrier counts as having completed the phase before
phase 0, so `wait(bar, 1)` on it returns at once (a producer's first wait on an empty
slot).
"""

from __future__ import annotations

from typing import Any, Optional

from ..compiler import ir
from ..compiler.builder import builtin
from ..compiler.types import SharedType, i64
from . import semantic as sem
from ..layouts import MBarrierLayout
from .shared import SharedMemoryDescriptor, allocate_shared_memory

__all__ = ["MBarrierLayout", "allocate_mbarrier", "arrive", "expect", "init", "invalidate", "wait"]


def _barrier(bar: Any, what: str) -> ir.Value:
    b = sem.builder()
    if not isinstance(bar, SharedMemoryDescriptor) or not isinstance(bar.handle.type, SharedType) \
            or bar.type.element != i64 or bar.type.shape != (1,):
        found = sem.describe(bar) if not isinstance(bar, SharedMemoryDescriptor) else str(bar.type)
        raise b.error(f"{what} needs one mbarrier (a shared i64 buffer of shape [1]), found {found}",
                      suggestion="allocate with mbarrier.allocate_mbarrier(); for a batch pass "
                                 "bars.index(i)")
    return bar.handle


def _count(value: Any, what: str, low: int = 1, high: int = (1 << 20) - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise sem.builder().error(f"{what} must be a compile-time int in [{low}, {high}], found {value!r}")
    return value


def _count_or_scalar(value: Any, what: str) -> Any:
    """A count as `_count` takes it, or an i32 scalar known only at run time (the
    hardware's range, up to 2^20 - 1, is then checked by the emulator)."""
    if sem.is_value(value):
        return sem.i32_scalar(value, what)
    return _count(value, what)


@builtin
def allocate_mbarrier(batch: Optional[int] = None) -> SharedMemoryDescriptor:
    """One mbarrier (i64 [1]), or `batch` of them (i64 [batch, 1], pick with `.index(i)`)."""
    shape = [1] if batch is None else [_count(batch, "allocate_mbarrier batch", 1, 1024), 1]
    return allocate_shared_memory.__wrapped__(i64, shape, MBarrierLayout(rank=1))


@builtin
def init(bar: Any, count: int) -> None:
    """Start `bar` with phases of `count` arrivals."""
    b = sem.builder()
    b.emit(ir.MBarrierInit(barrier=_barrier(bar, "mbarrier.init"),
                           count=_count(count, "mbarrier.init count"), loc=b.loc))


@builtin
def expect(bar: Any, nbytes: int, pred: Any = True) -> None:
    """Arrive once on `bar` and make its current phase also wait for `nbytes` bytes of
    async copies (TMA loads) to land; `nbytes` is a compile-time int or an i32 scalar."""
    b = sem.builder()
    barrier = _barrier(bar, "mbarrier.expect")
    nbytes = _count_or_scalar(nbytes, "mbarrier.expect nbytes")  # run time: a row's bytes
    b.emit(ir.MBarrierExpect(barrier=barrier, nbytes=nbytes,
                             pred=sem.predicate(pred, "mbarrier.expect"), loc=b.loc))


@builtin
def arrive(bar: Any, count: int = 1, pred: Any = True, per_warp: bool = False, cta: Any = None,
           scope: Any = None, per_thread: bool = False) -> None:
    """`count` arrivals on `bar` (a compile-time int or an i32 scalar), once the
    partition's threads have all got here (a named barrier over them first).
    `per_warp=True`: `count` arrivals from every warp of the partition, each once its own
    threads got here, with no partition-wide sync; init
    the barrier for warps * count arrivals a phase. A warp that is done with a buffer
    then frees it without waiting for the others (a consumer warpgroup's release).
    `per_thread=True`: `count` arrivals from every thread of the partition, with no sync
    at all; init the barrier for threads * count arrivals a phase. Each arrival releases
    its own thread's shared-memory writes, so a waiter may read what every thread wrote
    (the other arrivals release what the partition's named barrier or a warp's sync
    orders before them, which compute-sanitizer's racecheck does not follow).

    `cta` (an int or i32 scalar): arrive instead on the barrier at `bar`'s offset in the
    CTA of that rank in the cluster (launch with `cluster=`): a consumer frees a slot its
    peer's multicast TMA loads write into. `scope` says whom the arrival releases this
    thread's memory accesses to: "cluster" (the default) orders them before whatever the
    peer's threads do after their wait, as data written for the peer needs; "cta" orders
    them for this CTA only, which is enough when the arrival hands back a buffer this CTA
    has finished reading (a completed wgmma or load: nothing of it is left to order), as
    CUTLASS's cluster pipelines do, and is much cheaper: the cluster-scope release costs
    the attention kernel a fifth of its speed, releasing every K/V slot twice per tile."""
    b = sem.builder()
    if per_warp is not True and per_warp is not False:
        raise b.error(f"mbarrier.arrive per_warp must be a compile-time True or False, found {per_warp!r}")
    if per_thread is not True and per_thread is not False:
        raise b.error(f"mbarrier.arrive per_thread must be a compile-time True or False, found {per_thread!r}")
    if per_thread and (per_warp or cta is not None):
        raise b.error("mbarrier.arrive per_thread=True arrives from every thread on this CTA's barrier: leave "
                      "per_warp and cta out")
    if isinstance(cta, int) and not isinstance(cta, bool) and not 0 <= cta < 16:
        raise b.error(f"mbarrier.arrive cta must be a cluster rank in [0, 16), found {cta}")
    if scope is not None and cta is None:
        raise b.error(f"mbarrier.arrive scope={scope!r} applies to arrivals on another CTA's barrier: "
                      f"pass cta= as well, or leave scope out (an arrival on this CTA's barrier "
                      f"releases at CTA scope)")
    if scope not in (None, "cta", "cluster"):
        raise b.error(f"mbarrier.arrive scope must be \"cta\" or \"cluster\", found {scope!r}")
    b.emit(ir.MBarrierArrive(barrier=_barrier(bar, "mbarrier.arrive"),
                             count=_count_or_scalar(count, "mbarrier.arrive count"),
                             pred=sem.predicate(pred, "mbarrier.arrive"), per_warp=per_warp,
                             per_thread=per_thread,
                             cta=None if cta is None else sem.i32_scalar(cta, "mbarrier.arrive cta"),
                             scope=scope or "cluster", loc=b.loc))


@builtin
def wait(bar: Any, phase: Any) -> None:
    """Wait until the phase of `bar` with the parity of `phase` has completed."""
    b = sem.builder()
    barrier = _barrier(bar, "mbarrier.wait")
    b.emit(ir.MBarrierWait(barrier=barrier, phase=sem.i32_scalar(phase, "mbarrier.wait phase"),
                           loc=b.loc))


@builtin
def invalidate(bar: Any) -> None:
    """Retire `bar` before its shared memory is used for anything else."""
    b = sem.builder()
    b.emit(ir.MBarrierInvalidate(barrier=_barrier(bar, "mbarrier.invalidate"), loc=b.loc))
