"""The Hopper async machinery's ops: mbarriers, TMA and bulk copies, cp.async, wgmma and
warp specialization."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..errors import CompilationError
from .core import Block, Op, Value, is_shared

# Semantics follow the PTX ISA; ../shared/HOPPER.md has the summary. An mbarrier operand
# (`barrier`) is a shared i64 buffer of shape [1]. `pred` operands are i1 scalars: the op
# happens only where they hold (None = always). "One thread issues" means the backend
# elects one thread of the partition running the op (thread 0 of its first warp).


@dataclass(frozen=True, kw_only=True)
class SharedPermute(Op):
    """A view of a buffer with its dims reordered (result dim i = buffer dim order[i]);
    e.g. a K-major [N, K] tile seen as the [K, N] B operand of a wgmma."""

    NAME = "shared_permute"
    IN_WARP = True
    result: Value
    buffer: Value
    order: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class MBarrierInit(Op):
    """Initialise `barrier` for phases of `count` arrivals (one thread issues;
    mbarrier.init.shared::cta.b64). The kernel fences and barriers before first use."""

    NAME = "mbarrier_init"
    barrier: Value
    count: int


@dataclass(frozen=True, kw_only=True)
class MBarrierExpect(Op):
    """One arrival on `barrier` that also expects `nbytes` more transaction bytes in the
    current phase (one thread issues; mbarrier.arrive.expect_tx). `nbytes` is an int, or
    an i32 scalar when the byte count is known only at run time (a row's length)."""

    NAME = "mbarrier_expect"
    barrier: Value
    nbytes: Union[int, Value]
    pred: Optional[Value] = None


@dataclass(frozen=True, kw_only=True)
class MBarrierArrive(Op):
    """`count` arrivals (an int, or an i32 scalar known at run time) on `barrier` (one
    thread issues; mbarrier.arrive). `per_warp`: one thread of every warp issues, once
    its own warp got there (no partition sync). `per_thread`: every thread issues, with
    no sync.
    `cta` (an i32 scalar): the arrivals go to the barrier at the same offset in the CTA of
    that rank in the cluster (mapa), releasing at `scope` ("cluster" or "cta")."""

    NAME = "mbarrier_arrive"
    barrier: Value
    count: Union[int, Value] = 1
    pred: Optional[Value] = None
    per_warp: bool = False
    cta: Optional[Value] = None
    scope: str = "cluster"
    per_thread: bool = False


@dataclass(frozen=True, kw_only=True)
class MBarrierWait(Op):
    """Every thread waits until the phase of parity `phase & 1` of `barrier` has
    completed (mbarrier.try_wait.parity in a loop). `phase` is an i32 scalar.
    `elected`: only the partition's elected thread (thread 0, the one that issues TMA and
    mbarrier ops) waits and the others go on: its next issue (a ring slot's refill) is
    ordered after the phase's arrivals without holding the other warps back."""

    NAME = "mbarrier_wait"
    barrier: Value
    phase: Value
    elected: bool = False


@dataclass(frozen=True, kw_only=True)
class WarpgroupTurn(Op):
    """Ping-pong: the two warpgroups of the partition running this code take turns (at
    issuing their wgmmas), on the named barriers `barrier` + g, g the warpgroup's index
    in the partition. `action`: "take" waits for this warpgroup's turn (bar.sync on its
    own barrier, over both warpgroups' threads); "pass" hands the turn to the other
    warpgroup (bar.arrive on the other's barrier); "open" gives warpgroup 0 the first
    turn (warpgroup 1 arrives on warpgroup 0's barrier; warpgroup 0 does nothing). Each
    barrier takes one pass between two takes: a turn passed twice before it is taken
    would complete the barrier with no one waiting (the emulator reports it)."""

    NAME = "warpgroup_turn"
    ACTIONS = ("open", "take", "pass")
    action: str
    barrier: int

    def verify(self) -> None:
        if self.action not in self.ACTIONS or not 1 <= self.barrier <= 14:
            raise self.invalid(f"takes an action of {self.ACTIONS} and named barriers 1..15 (barrier, barrier + 1), "
                               f"found {self.action!r} at {self.barrier}")


@dataclass(frozen=True, kw_only=True)
class MBarrierInvalidate(Op):
    """Retire `barrier` before its memory is reused (one thread issues; mbarrier.inval)."""

    NAME = "mbarrier_invalidate"
    barrier: Value


@dataclass(frozen=True, kw_only=True)
class FenceAsyncShared(Op):
    """fence.proxy.async.shared::cta: this thread's generic-proxy shared-memory writes
    become visible to the async proxy (wgmma, TMA) once a barrier publishes them."""

    NAME = "fence_async_shared"
    IN_WARP = True  # a thread's own, after its reads of a buffer TMA writes next


@dataclass(frozen=True, kw_only=True)
class TmaAsyncCopyGlobalToShared(Op):
    """Copy the box at element `coords` (coords[i] along tensor dim i, outermost first as
    in Gluon; the backend reverses them for PTX) of `descriptor`'s tensor into `buffer`;
    completes on `barrier` as transaction bytes (one thread issues; cp.async.bulk.tensor). Out-of-range
    elements land as zeros."""

    NAME = "tma_async_copy_global_to_shared"
    descriptor: Value
    coords: tuple[Value, ...]
    barrier: Value
    buffer: Value
    pred: Optional[Value] = None
    multicast: Optional[Value] = None  # i32 mask of cluster ranks: the box lands in each, at
    #                                    the same offsets, and completes on each one's barrier


@dataclass(frozen=True, kw_only=True)
class ClusterBarrier(Op):
    """Every thread of every CTA of the cluster waits for all the others (barrier.cluster
    arrive.release + wait.acquire): before it, barriers the peers will arrive on are
    initialised; after it, no peer still writes to or arrives in this CTA's shared memory."""

    NAME = "cluster_barrier"
    SYNCS_THREADS = True  # the CTA's threads too


@dataclass(frozen=True, kw_only=True)
class AsyncBulkCopyGlobalToShared(Op):
    """Copy `nbytes` contiguous bytes (an i32 scalar, a multiple of 16) from the global
    address `pointer` (a scalar pointer, 16-byte aligned) to the start of `buffer`, whose
    layout is plain row-major; completes on `barrier` as transaction bytes (one thread
    issues; cp.async.bulk without a tensor map)."""

    NAME = "async_bulk_copy_global_to_shared"
    pointer: Value
    nbytes: Value
    barrier: Value
    buffer: Value
    pred: Optional[Value] = None


@dataclass(frozen=True, kw_only=True)
class TmaAsyncCopySharedToGlobal(Op):
    """Copy `buffer` to the box at `coords` of `descriptor`'s tensor (one thread issues;
    cp.async.bulk.tensor .global.shared::cta + commit_group). Out-of-range elements are
    not written."""

    NAME = "tma_async_copy_shared_to_global"
    descriptor: Value
    coords: tuple[Value, ...]
    buffer: Value


@dataclass(frozen=True, kw_only=True)
class TmaAsyncReduceAdd(Op):
    """Add `buffer` into the box at `coords` of `descriptor`'s tensor, element by element
    and atomically with respect to other adds (one thread issues;
    cp.reduce.async.bulk.tensor .add + commit_group). Out-of-range elements are not
    written. A bulk group like a TMA store: TmaStoreWait retires its read of `buffer`."""

    NAME = "tma_async_reduce_add"
    descriptor: Value
    coords: tuple[Value, ...]
    buffer: Value


@dataclass(frozen=True, kw_only=True)
class TmaStoreWait(Op):
    """Wait until at most `pending` TMA stores of this thread still read shared memory
    (cp.async.bulk.wait_group.read)."""

    NAME = "tma_store_wait"
    pending: int = 0


@dataclass(frozen=True, kw_only=True)
class TensormapReplace(Op):
    """Write a tensor map into the 128 bytes of global memory at `slot` (64-byte
    aligned): `template`'s map (element type, box, swizzle) with its global address, dims
    and strides (elements, outermost first, the innermost 1) replaced by `address`,
    `shape` (i32) and `strides` (i64). `result` is the slot as a descriptor. One thread
    writes (tensormap.replace); the TMA unit may read stale bytes until a TensormapFence."""

    NAME = "tensormap_replace"
    result: Value
    slot: Value
    template: Value
    address: Value
    shape: tuple[Value, ...]
    strides: tuple[Value, ...]


@dataclass(frozen=True, kw_only=True)
class TensormapFence(Op):
    """Publish the tensor map at `descriptor` (a TensormapReplace result) to the TMA unit:
    a release fence by the thread that wrote it, a barrier of the threads running the op,
    then an acquire fence of the map's 128 bytes by each (fence.proxy.tensormap::generic)."""

    NAME = "tensormap_fence"
    descriptor: Value


@dataclass(frozen=True, kw_only=True)
class AsyncCopyGlobalToShared(Op):
    """cp.async: each thread copies its elements of the pointer tensor `pointer` (layout
    L) into the same coordinates of `buffer`; masked-off elements are zero-filled.
    `vector` elements per instruction (4, 8 or 16 bytes), chosen by the vectorize pass."""

    NAME = "async_copy_global_to_shared"
    buffer: Value
    pointer: Value
    mask: Optional[Value] = None
    vector: int = 1


@dataclass(frozen=True, kw_only=True)
class AsyncCopyCommitGroup(Op):
    """cp.async.commit_group: the thread's outstanding cp.async copies form one group."""

    NAME = "async_copy_commit_group"


@dataclass(frozen=True, kw_only=True)
class AsyncCopyWaitGroup(Op):
    """cp.async.wait_group: wait until at most `pending` groups of this thread are in flight."""

    NAME = "async_copy_wait_group"
    pending: int = 0


@dataclass(frozen=True, kw_only=True)
class AsyncCopyMBarrierArrive(Op):
    """cp.async.mbarrier.arrive.noinc: every thread arrives once on `barrier` when all of
    its earlier cp.async copies have landed; the barrier's count must include these
    arrivals (noinc), one per thread of the partition."""

    NAME = "async_copy_mbarrier_arrive"
    barrier: Value


@dataclass(frozen=True, kw_only=True)
class WarpgroupMma(Op):
    """result = a @ b + (acc if use_acc else 0) by wgmma.mma_async over the warpgroups of
    the partition.

    `a`: a shared [M, K] buffer (or view), or a tensor in a DotOperandLayout (register A);
    `b`: a shared [K, N] buffer (or view); `acc`/`result`: an fp32 (or fp16) tensor in an
    NVMMADistributedLayout v3. `use_acc` an i1 scalar (None = true). With `is_async` the
    result may only be read after a WarpgroupMmaWait that lists it; otherwise the op
    waits for itself.

    `plan` (a warpgroup_mma_plan.DotPlan: accumulator tiling, register-A packing, the static part
    of the shared operands' descriptors) is recorded by the plan_data_movement pass.
    """

    NAME = "warpgroup_mma"
    result: Value
    a: Value
    b: Value
    acc: Value
    use_acc: Optional[Value] = None
    is_async: bool = False
    plan: Any = field(default=None, metadata={"printed": False})

    def recorded_plan(self):
        """The plan plan_data_movement recorded; a clear error when it did not run."""
        if self.plan is None:
            raise CompilationError("warpgroup_mma has no plan", self.loc,
                                   suggestion="run the plan_data_movement pass first")
        return self.plan

    def verify(self) -> None:
        plan = self.plan  # the verifier runs before planning too: checked once recorded
        if plan is None:
            return
        if (plan.a is not None) != is_shared(self.a):
            where = "shared memory" if plan.a is not None else "registers"
            raise self.invalid(f"its plan reads A from {where}, but a is {self.a.type}")
        k_total = self.a.type.shape[-1]
        if plan.steps * plan.k != k_total:
            raise self.invalid(f"its plan runs {plan.steps} K steps of {plan.k}, but a has K = {k_total}")


@dataclass(frozen=True, kw_only=True)
class WarpgroupMmaWait(Op):
    """wgmma.wait_group `pending`: results[i] is deps[i] once at most `pending` async
    wgmma groups are still in flight (the returned values are the ones safe to read).
    `anchor` (one of ANCHORS, "" for none) names an instruction emitted right before the
    wait that ptxas does not move the wait above: ptxas otherwise hoists a wait to the
    earliest point its registers allow, above independent work written before it (the
    softmax that issue_dot_ahead puts beside a running P V)."""

    NAME = "warpgroup_mma_wait"
    ANCHORS = ("volatile", "sleep", "fence")
    results: tuple[Value, ...]
    deps: tuple[Value, ...]
    pending: int
    anchor: str = ""


@dataclass(frozen=True, kw_only=True)
class WarpSpecialize(Op):
    """Split the CTA's warps into partitions that run different code at the same time.

    The `default` partition runs on the kernel's `num_warps` warps (0 .. num_warps-1);
    worker i runs on the next `worker_num_warps[i]` warps, each a separate block. Every
    block's args receive `captures` (values defined before the op); layouts inside a
    worker are over its own warps. `default` ends with a Yield of the op's results; each
    worker ends with an empty Yield. `worker_num_regs[i]` (0 = no change) is the register
    budget set with setmaxnreg; `default_num_regs` likewise for the default partition.
    `worker_replicas[i]` (empty: all 1) runs worker i as that many copies of one block,
    each on its own `worker_num_warps[i]` warps, told apart by ReplicaIndex: one copy of
    the code for several warpgroups doing the same job (instruction cache).
    """

    NAME = "warp_specialize"
    results: tuple[Value, ...]
    captures: tuple[Value, ...]
    default: Block
    workers: tuple[Block, ...]
    worker_num_warps: tuple[int, ...]
    worker_num_regs: tuple[int, ...]
    default_num_regs: int = 0
    worker_replicas: tuple[int, ...] = ()

    def replicas(self) -> tuple[int, ...]:
        """Copies of each worker (1 each unless worker_replicas says otherwise)."""
        return self.worker_replicas or (1,) * len(self.workers)

    def worker_warps(self) -> int:
        """Warps the workers take in all, every copy of a replicated worker counted."""
        return sum(w * r for w, r in zip(self.worker_num_warps, self.replicas()))
