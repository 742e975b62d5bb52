"""The IR: SSA values, one frozen dataclass per op, blocks, kernels.

An op's fields are typed: `result`/`results` are the values it defines, fields holding a
`Value` (or a tuple of them, or None) are its operands, fields holding a `Block` are its
regions, everything else is an attribute. Passes never mutate an op; they build a new one
with `dataclasses.replace` and a new block around it.

Values compare by identity: two values are the same value only if they are the same object.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Optional, Union

from .errors import UNKNOWN_LOC, Loc
from .types import PointerType, ScalarType, SharedType, TensorDescriptorType, TensorType, Type

_value_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Value:
    """An SSA value. `hint` is the Python name it was bound to, kept for readable dumps."""

    type: Type
    hint: str = ""
    id: int = field(default_factory=lambda: next(_value_ids), compare=False)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"Value(%{self.hint or self.id}: {self.type})"


@dataclass(frozen=True, kw_only=True)
class Op:
    """Base of all ops; `NAME` is the op's spelling in the printed IR."""

    NAME: ClassVar[str] = "op"
    loc: Loc = UNKNOWN_LOC

    def defines(self) -> tuple[Value, ...]:
        """The values this op defines (its `result` or `results` field)."""
        found = []
        for f in dataclasses.fields(self):
            if f.name == "result":
                if getattr(self, f.name) is not None:  # an atomic whose old value is unused
                    found.append(getattr(self, f.name))
            elif f.name == "results":
                found.extend(getattr(self, f.name))
        return tuple(found)

    def uses(self) -> tuple[Value, ...]:
        """The operand values this op reads, in field order."""
        found = []
        for f in dataclasses.fields(self):
            if f.name in ("result", "results"):
                continue
            item = getattr(self, f.name)
            if isinstance(item, Value):
                found.append(item)
            elif isinstance(item, tuple) and item and all(isinstance(v, Value) for v in item):
                found.extend(item)
        return tuple(found)

    def nested_blocks(self) -> tuple["Block", ...]:
        found = []
        for item in self._region_fields().values():
            found.extend(item if isinstance(item, tuple) else (item,))
        return tuple(found)

    def _region_fields(self) -> dict[str, Any]:
        """Fields holding a Block or a tuple of Blocks (warp_specialize's workers)."""
        out = {}
        for f in dataclasses.fields(self):
            item = getattr(self, f.name)
            if isinstance(item, Block) or (
                    isinstance(item, tuple) and item and all(isinstance(b, Block) for b in item)):
                out[f.name] = item
        return out

    def map_regions(self, fn) -> "Op":
        """This op with each nested block replaced by `fn(block)` (itself when it has none)."""
        changes = {name: tuple(fn(b) for b in item) if isinstance(item, tuple) else fn(item)
                   for name, item in self._region_fields().items()}
        return dataclasses.replace(self, **changes) if changes else self

    def attributes(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            item = getattr(self, f.name)
            if f.name in ("result", "results", "loc") or isinstance(item, (Value, Block)):
                continue
            if isinstance(item, tuple) and item and all(isinstance(v, (Value, Block)) for v in item):
                continue
            if item is None and f.name in _OPTIONAL_OPERANDS:
                continue
            if f.default is not dataclasses.MISSING and item == f.default:
                continue  # dumps show only what differs from an op's defaults
            out[f.name] = item
        return out


# Optional operand fields: when None they are simply absent, not an attribute.
_OPTIONAL_OPERANDS = {"mask", "other", "init", "index", "pred", "use_acc"}


@dataclass(frozen=True)
class Block:
    """A straight-line list of ops with block arguments (loop induction and carried values)."""

    args: tuple[Value, ...] = ()
    ops: tuple[Op, ...] = ()

    def walk(self) -> Iterator[Op]:
        """Every op in this block and its nested regions, in program order."""
        for op in self.ops:
            yield op
            for region in op.nested_blocks():
                yield from region.walk()


# ----------------------------------------------------------------------- the ops
@dataclass(frozen=True, kw_only=True)
class ProgramId(Op):
    NAME = "program_id"
    result: Value
    axis: int


@dataclass(frozen=True, kw_only=True)
class ReplicaIndex(Op):
    """Which copy of a replicated warp_specialize worker runs this code (an i32 scalar,
    uniform over the copy's warps): 0 .. replicas - 1, and 0 outside replicated workers."""

    NAME = "replica_index"
    result: Value


@dataclass(frozen=True, kw_only=True)
class NumPrograms(Op):
    NAME = "num_programs"
    result: Value
    axis: int


@dataclass(frozen=True, kw_only=True)
class Constant(Op):
    """A scalar constant, or a tensor filled with one value (`full`)."""

    NAME = "constant"
    result: Value
    value: Union[int, float, bool]


@dataclass(frozen=True, kw_only=True)
class Splat(Op):
    """A tensor every element of which is one scalar value."""

    NAME = "splat"
    result: Value
    operand: Value


@dataclass(frozen=True, kw_only=True)
class Arange(Op):
    NAME = "arange"
    result: Value
    start: int
    end: int


BINARY_KINDS = ("add", "sub", "mul", "div", "floordiv", "mod", "and", "or", "xor",
                "shl", "shr", "max", "min", "pow")
UNARY_KINDS = ("neg", "not", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "erf",
               "sin", "cos", "floor", "ceil")
COMPARE_PREDICATES = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCE_KINDS = ("sum", "max", "min", "argmax", "argmin")


@dataclass(frozen=True, kw_only=True)
class Binary(Op):
    """Elementwise binary arithmetic; operands and result share shape and layout."""

    NAME = "binary"
    result: Value
    kind: str
    lhs: Value
    rhs: Value


@dataclass(frozen=True, kw_only=True)
class Unary(Op):
    NAME = "unary"
    result: Value
    kind: str
    operand: Value
    # exp2 only: the share of each thread's registers computed by an FMA polynomial
    # instead of the exp unit (compiler/exp2_polynomial.py); 0 = all on the exp unit.
    fma_share: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Compare(Op):
    NAME = "compare"
    result: Value
    predicate: str
    lhs: Value
    rhs: Value
    # Aligned runs of this many consecutive registers share one answer (proved by axis
    # analysis, e.g. `cols < n` with n divisible by 16): computed once per run.
    register_run: int = 1


@dataclass(frozen=True, kw_only=True)
class Fma(Op):
    NAME = "fma"
    result: Value
    a: Value
    b: Value
    c: Value


@dataclass(frozen=True, kw_only=True)
class Select(Op):
    NAME = "select"
    result: Value
    condition: Value
    true_value: Value
    false_value: Value


@dataclass(frozen=True, kw_only=True)
class Cast(Op):
    """Numeric conversion to the result's element type (round to nearest even)."""

    NAME = "cast"
    result: Value
    operand: Value


@dataclass(frozen=True, kw_only=True)
class Bitcast(Op):
    NAME = "bitcast"
    result: Value
    operand: Value


@dataclass(frozen=True, kw_only=True)
class AddPtr(Op):
    """pointer + offset elements (not bytes), elementwise."""

    NAME = "add_ptr"
    result: Value
    pointer: Value
    offset: Value


@dataclass(frozen=True, kw_only=True)
class Load(Op):
    """Global load through a pointer (tensor); masked-off lanes take `other` (or 0)."""

    NAME = "load"
    result: Value
    pointer: Value
    mask: Optional[Value] = None
    other: Optional[Value] = None
    vector: int = 1  # elements per access, chosen by the vectorize pass
    cache: str = ""  # PTX cache qualifiers after ld.global (".cg", ".L1::evict_first", ...)


@dataclass(frozen=True, kw_only=True)
class Store(Op):
    NAME = "store"
    pointer: Value
    value: Value
    mask: Optional[Value] = None
    vector: int = 1
    cache: str = ""  # PTX cache qualifiers after st.global (".cs", ".L1::evict_first", ...)


ATOMIC_KINDS = ("add", "max", "min", "and", "or", "xor", "xchg")
MEMORY_SEMANTICS = ("relaxed", "acquire", "release", "acq_rel")  # PTX's .sem qualifiers
MEMORY_SCOPES = ("cta", "gpu", "sys")  # PTX's .scope qualifiers


@dataclass(frozen=True, kw_only=True)
class AtomicRMW(Op):
    """memory = kind(memory, value) at each element of `pointer` where `mask` holds, as
    one atomic per element and program (per partition inside a warp_specialize), however
    many threads hold the element: the replica with the lowest thread index issues it.

    `result`: the old values (0 where masked off), the same in every thread holding an
    element; None once nothing reads them (drop_unused_atomic_results), which lowers to
    `red` where PTX allows. `scratch_offset` (bytes, set by allocation): where the issuing
    threads pass the old values to the other replicas (see backend/lower_atomic.py).
    """

    NAME = "atomic_rmw"
    result: Optional[Value]
    kind: str
    pointer: Value
    value: Value
    mask: Optional[Value] = None
    sem: str = "acq_rel"
    scope: str = "gpu"
    scratch_offset: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class AtomicCAS(Op):
    """Compare-and-swap: where memory equals `compare`, write `value`; exactly once per
    element and program, with the old values as for AtomicRMW."""

    NAME = "atomic_cas"
    result: Optional[Value]
    pointer: Value
    compare: Value
    value: Value
    mask: Optional[Value] = None
    sem: str = "acq_rel"
    scope: str = "gpu"
    scratch_offset: Optional[int] = None


ATOMICS = (AtomicRMW, AtomicCAS)


@dataclass(frozen=True, kw_only=True)
class ExpandDims(Op):
    """Insert a size-1 dim at `axis`; the operand's layout is a slice of the result's."""

    NAME = "expand_dims"
    result: Value
    operand: Value
    axis: int


@dataclass(frozen=True, kw_only=True)
class Broadcast(Op):
    """Stretch size-1 dims to the result shape; each thread already holds what it needs."""

    NAME = "broadcast"
    result: Value
    operand: Value


@dataclass(frozen=True, kw_only=True)
class Reshape(Op):
    NAME = "reshape"
    result: Value
    operand: Value


@dataclass(frozen=True, kw_only=True)
class Permute(Op):
    NAME = "permute"
    result: Value
    operand: Value
    order: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Reduce(Op):
    """Reduce along `axis`: in-thread, then lane shuffles, then across warps in shared memory.

    `scratch_offset` (bytes) is assigned by shared-memory allocation when warps must combine.
    """

    NAME = "reduce"
    result: Value
    operand: Value
    axis: int
    kind: str
    scratch_offset: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class WarpAny(Op):
    """Per warp: whether any element of the boolean tensor `operand` that the warp holds is
    true, in every element the warp holds of the result (same type). Its result is
    uniform over each warp, so it may be the condition of a per-warp `If`."""

    NAME = "warp_any"
    result: Value
    operand: Value


@dataclass(frozen=True, kw_only=True)
class ConvertLayout(Op):
    """Move a tensor to another layout along a recorded `plan` (weft.layouts conversion)."""

    NAME = "convert_layout"
    result: Value
    operand: Value
    plan: Any = None
    scratch_offset: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class AllocShared(Op):
    """A shared-memory buffer, optionally initialised from a distributed tensor.

    `offset` (bytes from the start of the kernel's shared memory) is set by allocation.
    """

    NAME = "alloc_shared"
    result: Value
    init: Optional[Value] = None
    offset: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class SharedLoad(Op):
    NAME = "shared_load"
    result: Value
    buffer: Value


@dataclass(frozen=True, kw_only=True)
class SharedStore(Op):
    NAME = "shared_store"
    buffer: Value
    value: Value


@dataclass(frozen=True, kw_only=True)
class SharedIndex(Op):
    """Sub-buffer `index` along the leading dim of a multi-buffered allocation."""

    NAME = "shared_index"
    result: Value
    buffer: Value
    index: Value


@dataclass(frozen=True, kw_only=True)
class SharedSlice(Op):
    """A static window [start, start + size) along `dim` of a buffer."""

    NAME = "shared_slice"
    result: Value
    buffer: Value
    dim: int
    start: int


@dataclass(frozen=True, kw_only=True)
class Barrier(Op):
    """bar.sync 0: all threads of the CTA, and their shared-memory accesses, meet here."""

    NAME = "barrier"


@dataclass(frozen=True, kw_only=True)
class PrefetchL2(Op):
    """Ask L2 to fetch `nbytes` from global memory at `pointer` (a hint; no data returns).

    One thread issues it (cp.async.bulk.prefetch.L2, sm_90): a CTA can pull a later
    CTA's data into L2 without holding registers for it. The byte count is rounded down
    to a multiple of 16 and the address must be 16-byte aligned.
    """

    NAME = "prefetch_l2"
    pointer: Value
    nbytes: Value


@dataclass(frozen=True, kw_only=True)
class Yield(Op):
    NAME = "yield"
    values: tuple[Value, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Condition(Op):
    """Ends a while's `before` block: continue while `condition`, passing `values` on."""

    NAME = "condition"
    condition: Value
    values: tuple[Value, ...] = ()


@dataclass(frozen=True, kw_only=True)
class For(Op):
    """for iv in range(lower, upper, step) with loop-carried values.

    body.args = (iv, *carried); body ends with a Yield of the next carried values.
    """

    NAME = "for"
    results: tuple[Value, ...]
    lower: Value
    upper: Value
    step: Value
    inits: tuple[Value, ...]
    body: Block
    rematerialize: bool = False  # thread-position values recomputed per iteration (ll.range)


@dataclass(frozen=True, kw_only=True)
class If(Op):
    """A branch on a scalar, taken alike by every thread of the partition; or, `per_warp`,
    on a WarpAny result (a boolean tensor uniform over each warp), taken warp by warp.
    A per-warp branch holds only REGISTER_OPS (no memory, barrier or cross-warp op: the
    warps that skip it would leave those short) and merges only tensors (a scalar is one
    value for the whole partition)."""

    NAME = "if"
    results: tuple[Value, ...]
    condition: Value
    then_body: Block
    else_body: Block
    per_warp: bool = False


@dataclass(frozen=True, kw_only=True)
class While(Op):
    """before.args = carried, ends with Condition; after.args = its values, ends with Yield."""

    NAME = "while"
    results: tuple[Value, ...]
    inits: tuple[Value, ...]
    before: Block
    after: Block
    rematerialize: bool = False  # as For's: `while ll.condition(..., rematerialize=True)`


@dataclass(frozen=True, kw_only=True)
class Print(Op):
    NAME = "print"
    prefix: str
    values: tuple[Value, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Assert(Op):
    NAME = "assert"
    condition: Value
    message: str


# ------------------------------------------------------------ Hopper async machinery
# Semantics follow the PTX ISA; ../shared/HOPPER.md has the summary. An mbarrier operand
# (`barrier`) is a shared i64 buffer of shape [1]. `pred` operands are i1 scalars: the op
# happens only where they hold (None = always). "One thread issues" means the backend
# elects one thread of the partition running the op (thread 0 of its first warp).


@dataclass(frozen=True, kw_only=True)
class SharedPermute(Op):
    """A view of a buffer with its dims reordered (result dim i = buffer dim order[i]);
    e.g. a K-major [N, K] tile seen as the [K, N] B operand of a wgmma."""

    NAME = "shared_permute"
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
    """`count` arrivals on `barrier` (one thread issues; mbarrier.arrive). `per_warp`:
    one thread of every warp issues, once its own warp got there (no partition sync)."""

    NAME = "mbarrier_arrive"
    barrier: Value
    count: int = 1
    pred: Optional[Value] = None
    per_warp: bool = False


@dataclass(frozen=True, kw_only=True)
class MBarrierWait(Op):
    """Every thread waits until the phase of parity `phase & 1` of `barrier` has
    completed (mbarrier.try_wait.parity in a loop). `phase` is an i32 scalar."""

    NAME = "mbarrier_wait"
    barrier: Value
    phase: Value


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


@dataclass(frozen=True, kw_only=True)
class TmaLoad(Op):
    """Copy the box at element `coords` (coords[i] along tensor dim i, outermost first as
    in Gluon; the backend reverses them for PTX) of `descriptor`'s tensor into `buffer`;
    completes on `barrier` as transaction bytes (one thread issues; cp.async.bulk.tensor). Out-of-range
    elements land as zeros."""

    NAME = "tma_load"
    descriptor: Value
    coords: tuple[Value, ...]
    barrier: Value
    buffer: Value
    pred: Optional[Value] = None


@dataclass(frozen=True, kw_only=True)
class BulkCopyLoad(Op):
    """Copy `nbytes` contiguous bytes (an i32 scalar, a multiple of 16) from the global
    address `pointer` (a scalar pointer, 16-byte aligned) to the start of `buffer`, whose
    layout is plain row-major; completes on `barrier` as transaction bytes (one thread
    issues; cp.async.bulk without a tensor map)."""

    NAME = "bulk_copy_load"
    pointer: Value
    nbytes: Value
    barrier: Value
    buffer: Value
    pred: Optional[Value] = None


@dataclass(frozen=True, kw_only=True)
class TmaStore(Op):
    """Copy `buffer` to the box at `coords` of `descriptor`'s tensor (one thread issues;
    cp.async.bulk.tensor .global.shared::cta + commit_group). Out-of-range elements are
    not written."""

    NAME = "tma_store"
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
class AsyncCopy(Op):
    """cp.async: each thread copies its elements of the pointer tensor `pointer` (layout
    L) into the same coordinates of `buffer`; masked-off elements are zero-filled.
    `vector` elements per instruction (4, 8 or 16 bytes), chosen by the vectorize pass."""

    NAME = "async_copy"
    buffer: Value
    pointer: Value
    mask: Optional[Value] = None
    vector: int = 1


@dataclass(frozen=True, kw_only=True)
class AsyncCommitGroup(Op):
    """cp.async.commit_group: the thread's outstanding cp.async copies form one group."""

    NAME = "async_commit_group"


@dataclass(frozen=True, kw_only=True)
class AsyncWaitGroup(Op):
    """cp.async.wait_group: wait until at most `pending` groups of this thread are in flight."""

    NAME = "async_wait_group"
    pending: int = 0


@dataclass(frozen=True, kw_only=True)
class WarpGroupDot(Op):
    """result = a @ b + (acc if use_acc else 0) by wgmma.mma_async over the warpgroups of
    the partition.

    `a`: a shared [M, K] buffer (or view), or a tensor in a DotOperandLayout (register A);
    `b`: a shared [K, N] buffer (or view); `acc`/`result`: an fp32 (or fp16) tensor in an
    NVMMADistributedLayout v3. `use_acc` an i1 scalar (None = true). With `is_async` the
    result may only be read after a WarpGroupDotWait that lists it; otherwise the op
    waits for itself.
    """

    NAME = "warpgroup_dot"
    result: Value
    a: Value
    b: Value
    acc: Value
    use_acc: Optional[Value] = None
    is_async: bool = False


@dataclass(frozen=True, kw_only=True)
class WarpGroupDotWait(Op):
    """wgmma.wait_group `pending`: results[i] is deps[i] once at most `pending` async
    wgmma groups are still in flight (the returned values are the ones safe to read)."""

    NAME = "warpgroup_dot_wait"
    results: tuple[Value, ...]
    deps: tuple[Value, ...]
    pending: int


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


@dataclass(frozen=True)
class Kernel:
    """One kernel: parameters (values), body, and launch facts.

    `shared_bytes` is the kernel's total shared memory, set by allocation.
    """

    name: str
    params: tuple[Value, ...]
    body: Block
    num_warps: int
    source: str = ""
    constexprs: tuple[tuple[str, Any], ...] = ()
    shared_bytes: int = 0
    stage: str = "layout"
    # Per parameter, a power of two known to divide it (integers: the value; pointers: the
    # address in bytes), from launch specialization; 1 when nothing is known.
    param_divisibility: tuple[int, ...] = ()
    language: str = "lowlevel"  # the language it was written in (its registered layout classes)

    def walk(self) -> Iterator[Op]:
        return self.body.walk()

    @property
    def total_warps(self) -> int:
        """Warps the CTA launches with: num_warps plus the workers of its warp_specialize
        (the largest, when there are several)."""
        workers = [op.worker_warps() for op in self.walk() if isinstance(op, WarpSpecialize)]
        return self.num_warps + max(workers, default=0)

    def with_body(self, body: Block, **changes) -> "Kernel":
        return dataclasses.replace(self, body=body, **changes)


def is_tensor(value: Value) -> bool:
    return isinstance(value.type, TensorType)


def is_shared(value: Value) -> bool:
    return isinstance(value.type, SharedType)


__all__ = [name for name in dir() if not name.startswith("_")] + [
    "PointerType", "ScalarType", "TensorDescriptorType",
]


# Ops that act on a thread's registers alone (a lane's own values, or, WarpAny, its own
# warp's): what a per-warp `If` may hold.
REGISTER_OPS = (Constant, Splat, Arange, Binary, Unary, Compare, Fma, Select, Cast, Bitcast, AddPtr, ExpandDims,
                Broadcast, WarpAny, If, Yield)
