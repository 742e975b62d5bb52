"""The ops every kernel may hold: indices, constants, arithmetic, global memory and
atomics, shape ops, reductions, layout conversions, shared memory, control flow, printing
and assertions. (The Hopper async machinery is in `hopper`.)"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ...layouts import rules as layout_rules
from ..errors import CompilationError
from ..types import TensorType, element_of, i1
from .checks import check_broadcast, check_elementwise, check_result_layout, check_yield, strip
from .core import Block, Op, Value

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
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    value: Union[int, float, bool]

    def verify(self) -> None:
        check_elementwise(self)


@dataclass(frozen=True, kw_only=True)
class Splat(Op):
    """A tensor every element of which is one scalar value."""

    NAME = "splat"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    operand: Value

    def verify(self) -> None:
        check_elementwise(self)


@dataclass(frozen=True, kw_only=True)
class Arange(Op):
    NAME = "arange"
    IN_WARP = True
    result: Value
    start: int
    end: int


BINARY_KINDS = ("add", "sub", "mul", "div", "floordiv", "mod", "and", "or", "xor",
                "shl", "shr", "max", "min", "pow")
# sqrt rounds to nearest (IEEE); sqrt_approx is Triton's `tl.sqrt` (sqrt.approx.ftz.f32).
UNARY_KINDS = ("neg", "not", "exp", "exp2", "log", "log2", "sqrt", "sqrt_approx", "rsqrt", "abs", "erf",
               "sin", "cos", "floor", "ceil")
COMPARE_PREDICATES = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCE_KINDS = ("sum", "max", "min", "argmax", "argmin")


@dataclass(frozen=True, kw_only=True)
class Binary(Op):
    """Elementwise binary arithmetic; operands and result share shape and layout."""

    NAME = "binary"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    kind: str
    lhs: Value
    rhs: Value

    def verify(self) -> None:
        check_elementwise(self)


@dataclass(frozen=True, kw_only=True)
class Unary(Op):
    NAME = "unary"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    kind: str
    operand: Value
    # exp2 only: the share of each thread's registers computed by an FMA polynomial
    # instead of the exp unit (compiler/exp2_polynomial.py); 0 = all on the exp unit.
    fma_share: float = 0.0

    def verify(self) -> None:
        check_elementwise(self)
        if self.fma_share and (self.kind != "exp2" or not 0 <= self.fma_share <= 1):
            raise self.invalid(f"fma_share={self.fma_share} is for exp2 only, in [0, 1]; found it on {self.kind}")


@dataclass(frozen=True, kw_only=True)
class Compare(Op):
    NAME = "compare"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    predicate: str
    lhs: Value
    rhs: Value
    # Aligned runs of this many consecutive registers share one answer (proved by axis
    # analysis, e.g. `cols < n` with n divisible by 16): computed once per run.
    register_run: int = 1

    def verify(self) -> None:
        check_elementwise(self)


@dataclass(frozen=True, kw_only=True)
class Fma(Op):
    NAME = "fma"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    a: Value
    b: Value
    c: Value

    def verify(self) -> None:
        check_elementwise(self)


@dataclass(frozen=True, kw_only=True)
class MmaV2(Op):
    """result = a @ b + acc by mma.sync.aligned.m16n8k16, each warp on its own registers:
    `a` [M, K] and `b` [K, N] 16-bit tensors in the DotOperandLayouts of `acc`'s
    NVMMADistributedLayout v2, or shared buffers read fragment by fragment as if loaded
    in those layouts (`a_layout`, `b_layout`: the register layout of a shared operand);
    `acc`/`result` fp32. compiler/mma.py plans the fragments."""

    NAME = "mma_v2"
    IN_WARP = True
    result: Value
    a: Value
    b: Value
    acc: Value
    a_layout: Any = None
    b_layout: Any = None


@dataclass(frozen=True, kw_only=True)
class Dot(Op):
    """result = a @ b (+ acc): `a` [M, K] and `b` [K, N] tiles, `acc`/`result` [M, N] in
    the output type (Triton's `tl.dot`). A `tile`-stage op only: the accelerate_dots pass
    replaces it by wgmma on shared-memory operands or by multiply-and-sum tile ops.
    `input_precision` ("tf32", "tf32x3" or "ieee") is kept for fp32 inputs only."""

    NAME = "dot"
    TILE_ONLY = True
    result: Value
    a: Value
    b: Value
    acc: Optional[Value] = None
    input_precision: str = ""

    def verify(self) -> None:
        a, b, out = self.a.type, self.b.type, self.result.type
        if not all(isinstance(t, TensorType) and t.rank == 2 for t in (a, b, out)):
            raise self.invalid(f"needs 2-D tensors, found a {a}, b {b}, result {out}")
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2 or out.shape != (m, n):
            raise self.invalid(f"shapes do not chain: a {list(a.shape)} @ b {list(b.shape)} -> {list(out.shape)}")
        if self.acc is not None and (self.acc.type.shape, self.acc.type.element) != (out.shape, out.element):
            raise self.invalid(f"acc {self.acc.type} is not of the result's type {out}")


@dataclass(frozen=True, kw_only=True)
class Where(Op):
    NAME = "where"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    condition: Value
    true_value: Value
    false_value: Value

    def verify(self) -> None:
        check_elementwise(self)


@dataclass(frozen=True, kw_only=True)
class Cast(Op):
    """Numeric conversion to the result's element type (round to nearest even)."""

    NAME = "cast"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    operand: Value

    def verify(self) -> None:
        check_elementwise(self)


@dataclass(frozen=True, kw_only=True)
class Bitcast(Op):
    NAME = "bitcast"
    IN_WARP = True
    result: Value
    operand: Value


@dataclass(frozen=True, kw_only=True)
class AddPtr(Op):
    """pointer + offset elements (not bytes), elementwise."""

    NAME = "add_ptr"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    pointer: Value
    offset: Value

    def verify(self) -> None:
        check_elementwise(self, tensor_only=isinstance(self.result.type, TensorType))


@dataclass(frozen=True, kw_only=True)
class Load(Op):
    """Global load through a pointer (tensor); masked-off lanes take `other` (or 0)."""

    NAME = "load"
    ELEMENTWISE = True
    result: Value
    pointer: Value
    mask: Optional[Value] = None
    other: Optional[Value] = None
    vector: int = 1  # elements per access, chosen by the vectorize pass
    cache: str = ""  # PTX cache qualifiers after ld.global (".cg", ".L1::evict_first", ...)

    def verify(self) -> None:
        check_elementwise(self, tensor_only=isinstance(self.result.type, TensorType))


@dataclass(frozen=True, kw_only=True)
class Store(Op):
    NAME = "store"
    ELEMENTWISE = True
    pointer: Value
    value: Value
    mask: Optional[Value] = None
    vector: int = 1
    cache: str = ""  # PTX cache qualifiers after st.global (".cs", ".L1::evict_first", ...)

    def verify(self) -> None:
        check_elementwise(self)


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
    ELEMENTWISE = True
    USES_SCRATCH = True
    result: Optional[Value]
    kind: str
    pointer: Value
    value: Value
    mask: Optional[Value] = None
    sem: str = "acq_rel"
    scope: str = "gpu"
    scratch_offset: Optional[int] = None

    def verify(self) -> None:
        if self.kind not in ATOMIC_KINDS:
            raise self.invalid(f"unknown kind {self.kind!r}")
        verify_atomic(self)


@dataclass(frozen=True, kw_only=True)
class AtomicCAS(Op):
    """Compare-and-swap: where memory equals `compare`, write `value`; exactly once per
    element and program, with the old values as for AtomicRMW."""

    NAME = "atomic_cas"
    ELEMENTWISE = True
    USES_SCRATCH = True
    result: Optional[Value]
    pointer: Value
    compare: Value
    value: Value
    mask: Optional[Value] = None
    sem: str = "acq_rel"
    scope: str = "gpu"
    scratch_offset: Optional[int] = None

    def verify(self) -> None:
        verify_atomic(self)


ATOMICS = (AtomicRMW, AtomicCAS)


def verify_atomic(op) -> None:
    if op.sem not in MEMORY_SEMANTICS or op.scope not in MEMORY_SCOPES:
        raise op.invalid(f"unknown sem {op.sem!r} or scope {op.scope!r}")
    check_elementwise(op, tensor_only=isinstance(op.pointer.type, TensorType))


@dataclass(frozen=True, kw_only=True)
class ExpandDims(Op):
    """Insert a size-1 dim at `axis`; the operand's layout is a slice of the result's."""

    NAME = "expand_dims"
    IN_WARP = True
    result: Value
    operand: Value
    axis: int

    def verify(self) -> None:
        check_result_layout(self, lambda: layout_rules.expand_dims_layout(self.operand.type.layout, self.axis))


@dataclass(frozen=True, kw_only=True)
class Broadcast(Op):
    """Stretch size-1 dims to the result shape; each thread already holds what it needs."""

    NAME = "broadcast"
    IN_WARP = True
    result: Value
    operand: Value

    def verify(self) -> None:
        check_broadcast(self)


@dataclass(frozen=True, kw_only=True)
class Reshape(Op):
    NAME = "reshape"
    IN_WARP = True
    result: Value
    operand: Value

    def verify(self) -> None:
        check_result_layout(self, lambda: layout_rules.reshape_layout(self.operand.type.layout, self.result.type.shape))


@dataclass(frozen=True, kw_only=True)
class Permute(Op):
    NAME = "permute"
    IN_WARP = True
    result: Value
    operand: Value
    order: tuple[int, ...]

    def verify(self) -> None:
        check_result_layout(self, lambda: layout_rules.permute_layout(self.operand.type.layout, self.order))


@dataclass(frozen=True, kw_only=True)
class AxisHint(Op):
    """The operand, unchanged, with a fact the user promises about its values (Triton's
    `tl.multiple_of`, `tl.max_contiguous`, `tl.max_constancy`): per dim, every value (for
    contiguity, the first of each run) is a multiple of, runs in steps of +1 over, or
    stays equal over, `values[d]` elements. Axis analysis takes the promise; nothing
    checks it at run time, as in Triton."""

    NAME = "axis_hint"
    ELEMENTWISE = True
    IN_WARP = True
    result: Value
    operand: Value
    kind: str  # "multiple_of", "max_contiguous" or "max_constancy"
    values: tuple[int, ...]

    def verify(self) -> None:
        check_elementwise(self)
        if self.kind not in ("multiple_of", "max_contiguous", "max_constancy"):
            raise self.invalid(f"unknown axis hint {self.kind!r}")


@dataclass(frozen=True, kw_only=True)
class Reduce(Op):
    """Reduce along `axis`: in-thread, then lane shuffles, then across warps in shared memory.

    `plan` (a layouts.rules.ReductionPlan, with its scratch bytes) is recorded by the
    plan_data_movement pass; `scratch_offset` (bytes) is assigned by shared-memory
    allocation when warps must combine.
    """

    NAME = "reduce"
    USES_SCRATCH = True
    result: Value
    operand: Value
    axis: int
    kind: str
    plan: Any = field(default=None, metadata={"printed": False})
    scratch_offset: Optional[int] = None

    def recorded_plan(self):
        """The plan plan_data_movement recorded; a clear error when it did not run."""
        if self.plan is None:
            raise CompilationError("reduce has no plan", self.loc,
                                   suggestion="run the plan_data_movement pass first")
        return self.plan

    def verify(self) -> None:
        src, dst = self.operand.type, self.result.type
        plan = self.plan  # the verifier runs before planning too: checked once recorded
        if plan is not None and plan.axis != self.axis:
            raise self.invalid(f"its plan reduces axis {plan.axis}, the op axis {self.axis}")
        if not isinstance(dst, TensorType):
            if src.rank != 1:
                raise self.invalid(f"reducing a rank-{src.rank} tensor gives a tensor, not a scalar")
            return
        check_result_layout(self, lambda: layout_rules.reduce_layout(src.layout, self.axis))
        if plan is not None and dst.layout is not None and strip(plan.result_layout) != strip(dst.layout):
            raise self.invalid(f"its plan gives the result layout {plan.result_layout}, found {dst.layout}")


@dataclass(frozen=True, kw_only=True)
class WarpAny(Op):
    """Per warp: whether any element of the boolean tensor `operand` that the warp holds is
    true, in every element the warp holds of the result (same type). Its result is
    uniform over each warp, so it may be the condition of a per-warp `If`."""

    NAME = "warp_any"
    IN_WARP = True
    result: Value
    operand: Value

    def verify(self) -> None:
        if not isinstance(self.operand.type, TensorType) or self.operand.type.element != i1 \
                or self.result.type != self.operand.type:
            raise self.invalid(f"takes a boolean tensor to one of its type, found {self.operand.type} -> {self.result.type}")


@dataclass(frozen=True, kw_only=True)
class ConvertLayout(Op):
    """Move a tensor to another layout along a recorded `plan` (weft.layouts conversion)."""

    NAME = "convert_layout"
    USES_SCRATCH = True
    result: Value
    operand: Value
    plan: Any = None
    scratch_offset: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class AllocateSharedMemory(Op):
    """A shared-memory buffer, optionally initialised from a distributed tensor.

    `offset` (bytes from the start of the kernel's shared memory) is set by allocation.
    """

    NAME = "allocate_shared_memory"
    result: Value
    init: Optional[Value] = None
    offset: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class SharedLoad(Op):
    NAME = "shared_load"
    IN_WARP = True
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
    IN_WARP = True
    result: Value
    buffer: Value
    index: Value


@dataclass(frozen=True, kw_only=True)
class SharedSlice(Op):
    """A static window [start, start + size) along `dim` of a buffer."""

    NAME = "shared_slice"
    IN_WARP = True
    result: Value
    buffer: Value
    dim: int
    start: int


@dataclass(frozen=True, kw_only=True)
class SharedReinterpret(Op):
    """The bytes of a buffer seen as another buffer: the result's type (element, shape,
    shared layout) addresses the same bytes from the same first byte; it needs no more
    bytes than the buffer has (Gluon's `_reinterpret`)."""

    NAME = "shared_reinterpret"
    IN_WARP = True
    result: Value
    buffer: Value


@dataclass(frozen=True, kw_only=True)
class Barrier(Op):
    """bar.sync 0: all threads of the CTA, and their shared-memory accesses, meet here."""

    NAME = "barrier"
    SYNCS_THREADS = True


@dataclass(frozen=True, kw_only=True)
class BarrierAny(Op):
    """A barrier (as `Barrier`: the CTA's, or inside a partition its named one) that also
    ORs a boolean over the threads meeting there: `result` (an i1 scalar, the same in
    every thread) is whether `operand` (a boolean tensor or scalar) held anywhere in any
    of them (bar.red.or.pred)."""

    NAME = "barrier_any"
    SYNCS_THREADS = True
    result: Value
    operand: Value

    def verify(self) -> None:
        if element_of(self.operand.type) != i1 or self.result.type != i1:
            raise self.invalid(f"takes a boolean tensor or scalar to an i1, found {self.operand.type} -> {self.result.type}")


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
    TERMINATOR = True
    IN_WARP = True
    values: tuple[Value, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Condition(Op):
    """Ends a while's `before` block: continue while `condition`, passing `values` on."""

    NAME = "condition"
    TERMINATOR = True
    condition: Value
    values: tuple[Value, ...] = ()


@dataclass(frozen=True)
class LoopSchedule:
    """What a highlevel loop asks of the pipelining passes (Triton's `tl.range` keywords),
    recorded on its `For`: how many stages to pipeline its loads over, whether to split
    producer and consumer warps, whether to flatten it with an inner loop, how many times to
    unroll it, and whether a dot's accumulator may be double-buffered. None means the
    compiler decides."""

    num_stages: Optional[int] = None
    warp_specialize: Optional[bool] = None
    flatten: bool = False
    loop_unroll_factor: Optional[int] = None
    disallow_acc_multi_buffer: bool = False

    def describe(self) -> str:
        fields = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]
        return "{" + " ".join(f"{name}={value}" for name, value in fields
                              if value not in (None, False)) + "}"


@dataclass(frozen=True, kw_only=True)
class For(Op):
    """for iv in range(lower, upper, step) with loop-carried values.

    body.args = (iv, *carried); body ends with a Yield of the next carried values.
    """

    NAME = "for"
    LOOP = True
    results: tuple[Value, ...]
    lower: Value
    upper: Value
    step: Value
    inits: tuple[Value, ...]
    body: Block
    rematerialize: bool = False  # thread-position values recomputed per iteration (ll.range)
    schedule: Optional[LoopSchedule] = None  # what tl.range(num_stages=, ...) asked of the loop


    def verify(self) -> None:
        check_yield(self, self.body, self.results, "loop body")
        for init, arg in zip(self.inits, self.body.args[1:]):
            if init.type != arg.type:
                raise self.invalid(f"loop-carried value starts as {init.type} but the body takes {arg.type}")


@dataclass(frozen=True, kw_only=True)
class If(Op):
    """A branch on a scalar, taken alike by every thread of the partition; or, `per_warp`,
    on a WarpAny result (a boolean tensor uniform over each warp), taken warp by warp.
    A per-warp branch holds only `in_warp` ops (no memory, barrier or cross-warp op: the
    warps that skip it would leave those short) and merges only tensors (a scalar is one
    value for the whole partition)."""

    NAME = "if"
    IN_WARP = True
    results: tuple[Value, ...]
    condition: Value
    then_body: Block
    else_body: Block
    per_warp: bool = False

    def verify(self) -> None:
        if self.results:
            check_yield(self, self.then_body, self.results, "then branch")
            check_yield(self, self.else_body, self.results, "else branch")
        if self.per_warp:
            self._verify_per_warp()

    def _verify_per_warp(self) -> None:
        condition = self.condition.type
        if not isinstance(condition, TensorType) or condition.element != i1:
            raise self.invalid(f"a per-warp if branches on a boolean tensor (a warp_any result), found {condition}")
        for result in self.results:
            if not isinstance(result.type, TensorType):
                raise self.invalid(f"a per-warp if merges tensors only, found {result.type}")
        inner = first_non_register_op((self.then_body, self.else_body))
        if inner is not None:
            raise inner.invalid("is in a per-warp if, which holds register arithmetic (and in-warp reductions) only")


@dataclass(frozen=True, kw_only=True)
class While(Op):
    """before.args = carried, ends with Condition; after.args = its values, ends with Yield."""

    NAME = "while"
    LOOP = True
    results: tuple[Value, ...]
    inits: tuple[Value, ...]
    before: Block
    after: Block
    rematerialize: bool = False  # as For's: `while ll.condition(..., rematerialize=True)`

    def verify(self) -> None:
        check_yield(self, self.after, self.inits, "while body")


@dataclass(frozen=True, kw_only=True)
class DevicePrint(Op):
    NAME = "device_print"
    prefix: str
    values: tuple[Value, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DeviceAssert(Op):
    NAME = "device_assert"
    condition: Value
    message: str


def in_warp(op: Op) -> bool:
    """Whether `op` involves no thread outside its own warp and no barrier: an op of an
    IN_WARP class, a Reduce whose lanes shuffle within each warp, or a ConvertLayout that
    only renames registers."""
    if op.IN_WARP:
        return True
    if isinstance(op, ConvertLayout):
        return _register_only(op)
    if not isinstance(op, Reduce):
        return False
    if op.plan is not None:
        return not op.plan.warp_steps
    # Before planning (the frontend's check of a per-warp branch): the layout rule.
    layout = getattr(op.operand.type, "layout", None)
    return layout is not None and layout_rules.reduction_in_warp(layout, op.axis)


def _register_only(op: "ConvertLayout") -> bool:
    from ...layouts import NoOp, RegisterPermutation, plan_conversion

    plan = op.plan
    if plan is None:
        src, dst = op.operand.type.layout, op.result.type.layout
        if src is None or dst is None:
            return False
        bits = max(op.operand.type.element.bits, 8)
        plan = plan_conversion(src, dst, bits)
    return isinstance(plan, (NoOp, RegisterPermutation))


def first_non_register_op(blocks) -> Optional[Op]:
    """The first op of `blocks` (their nested regions included) that is not `in_warp`,
    or None: what a per-warp `If` must not hold."""
    return next((op for block in blocks for op in block.walk() if not in_warp(op)), None)
