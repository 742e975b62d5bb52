"""Lowering state shared by every rule: the LLVM function, the value map, the rule table.

A lowered value is one of:
- a scalar: one `llvmlite.ir.Value`;
- a distributed tensor: a tuple with one `ir.Value` per register of its layout;
- a shared buffer: a `SharedView` (base address plus how coordinates become offsets).

Values that depend only on the thread's position (tid, lane, warp, the lane/warp part of a
layout's coordinates or shared offsets) are emitted once, in the entry block's prologue,
so they dominate every use wherever the first use sits (inside a loop or a branch).
The body of a loop marked `ll.range(..., rematerialize=True)` (a persistent kernel's tile
loop) gets its own prologue instead (`recompute_scope`): held from the kernel's entry,
those values (one shared offset per register of a stored tile, say) would stay live
across every inner loop, and ptxas spills them rather than recompute them.

Inside a warp_specialize partition (`partition_scope`), the thread and warp indices are
relative to the partition's first warp, `barrier()` is the partition's named barrier,
and the prologue is the partition's entry block: cached values are keyed per partition,
since the same layout gives other thread parts there (lower_warp_specialize.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Optional, Union

from llvmlite import ir

from ...layouts import LayoutError, LinearLayout
from ..errors import CompilationError
from ..ir import Block, Kernel, Op, Value
from ..types import SharedType, TensorType
from . import llvm_types as T
from . import ptx_asm

LoweringRule = Callable[["Lowering", Op], None]

# The rules every lowering starts from, filled by `@lowers` next to each op family.
# Callers that need other rules pass their own table to `lower_to_llvm`.
DEFAULT_RULES: dict[type, LoweringRule] = {}


def lowers(*op_classes: type, table: Optional[dict] = None):
    """Register the decorated function as the lowering rule of `op_classes`."""
    target = DEFAULT_RULES if table is None else table

    def register(rule: LoweringRule) -> LoweringRule:
        for op_class in op_classes:
            target[op_class] = rule
        return rule

    return register


@dataclass(frozen=True)
class SharedView:
    """A shared-memory buffer or a view of one.

    Element at coordinates c lives at byte `base + (addressing(c) XOR xor) * element bytes`,
    where `addressing` maps the view's dims to the `offset` (in elements) of the root
    buffer's shared layout. `base` is a `ptr addrspace(3)`, a multiple of `align` bytes
    (allocate_shared_memory aligns every buffer to at least 16; ldmatrix needs 16).
    """

    type: SharedType
    base: ir.Value
    addressing: LinearLayout
    xor: int = 0
    align: int = 16


Lowered = Union[ir.Value, tuple, SharedView]


@dataclass(frozen=True)
class Partition:
    """The warps one block of a warp_specialize runs on, while that block is lowered.

    `index` 0 is the default partition, i + 1 worker i; `region` numbers the
    warp_specialize ops of the kernel (prologue values of two ops must not mix).
    """

    index: int
    first_warp: int
    num_warps: int
    region: int
    replicas: int = 1  # copies of a replicated worker, on consecutive num_warps warps each
    barrier_id: int = 1  # named barrier of the (first copy of the) partition; copy k: + k


class Lowering:
    """Everything a rule needs while it lowers one kernel."""

    def __init__(self, kernel: Kernel, module: ir.Module, function: ir.Function,
                 rules: dict[type, LoweringRule], shared: Optional[ir.GlobalVariable]):
        self.kernel = kernel
        self.module = module
        self.function = function
        self.rules = rules
        self.shared_memory = shared
        self.values: dict[Value, Lowered] = {}
        entry = function.append_basic_block("entry")
        body = function.append_basic_block("body")
        self.prologue = ir.IRBuilder(entry)
        self.prologue.branch(body)
        self.prologue.position_before(entry.terminator)
        self.builder = ir.IRBuilder(body)
        self._cache: dict = {}
        self._opaque_tid = False  # inside a recompute_scope
        self.partition: Optional[Partition] = None
        # Threads a CTA barrier outside partitions waits for (None: all launched threads;
        # fewer once the extra warps of a warp_specialize have left, see lower_warp_specialize).
        self.barrier_threads: Optional[int] = None
        # Whether a cp.async copy went through registers (narrower than 4 bytes) so far:
        # the arrivals of async_copy_mbarrier_arrive then release those stores (lower_async_copy).
        self.plain_copies = False
        self._names: dict[str, int] = {}
        self._strings: list[ir.GlobalVariable] = []

    # ------------------------------------------------------------------ values
    def define(self, value: Value, lowered: Lowered) -> None:
        if isinstance(value.type, TensorType) and not isinstance(lowered, tuple):
            raise CompilationError(f"internal: tensor {value!r} lowered to a single value")
        if isinstance(lowered, tuple) and len(lowered) != T.register_count(value.type):
            raise CompilationError(
                f"internal: {value!r} lowered to {len(lowered)} registers, its layout has "
                f"{T.register_count(value.type)}")
        self.values[value] = lowered

    def get(self, value: Value) -> Lowered:
        try:
            return self.values[value]
        except KeyError:
            raise CompilationError(f"internal: {value!r} used before the backend lowered it") from None

    def registers(self, value: Value, count: Optional[int] = None) -> tuple:
        """A tensor's registers; a scalar repeated `count` times (splatted on the fly)."""
        lowered = self.get(value)
        if isinstance(lowered, tuple):
            if count is not None and len(lowered) != count:
                raise CompilationError(
                    f"internal: {value!r} has {len(lowered)} registers where {count} are needed")
            return lowered
        return (lowered,) * (count or 1)

    def scalar(self, value: Value) -> ir.Value:
        lowered = self.get(value)
        if isinstance(lowered, tuple):
            if len(lowered) != 1:
                raise CompilationError(f"internal: {value!r} is a tensor where a scalar is needed")
            return lowered[0]
        return lowered

    def shared(self, value: Value) -> SharedView:
        lowered = self.get(value)
        if not isinstance(lowered, SharedView):
            raise CompilationError(f"internal: {value!r} is not a shared-memory buffer")
        return lowered

    # ------------------------------------------------------------------ blocks
    def lower_block(self, block: Block) -> None:
        """Lower a block's ops in order. Inside a recompute scope, the ops after one that
        holds a loop compute thread-position values afresh, after it (`_restart_prologue`),
        for the rest of the block: a persistent kernel's epilogue then holds none of its
        addresses in registers across the key loop. (Without it, flash attention's
        replicated consumers with mma_v2's overflow path spilled.)"""
        saved = self.prologue, self._cache
        try:
            for i, op in enumerate(block.ops):
                self.lower_op(op)
                if self._opaque_tid and i + 1 < len(block.ops) and _holds_loop(op):
                    self._restart_prologue()
        finally:
            self.prologue, self._cache = saved

    def _restart_prologue(self) -> None:
        """A fresh prologue at the builder's position (as in lower_control._lower_body):
        values cached from here on are computed here, from another volatile %tid.x read."""
        b = self.builder
        entry, rest = b.block, self.new_block("after_loop")
        prologue = ir.IRBuilder(entry)
        prologue.branch(rest)
        prologue.position_before(entry.terminator)
        b.position_at_end(rest)
        self.prologue, self._cache = prologue, {}

    def lower_op(self, op: Op) -> None:
        rule = None
        for cls in type(op).__mro__:
            rule = self.rules.get(cls)
            if rule is not None:
                break
        if rule is None:
            raise CompilationError(
                f"the backend has no lowering for `{op.NAME}` ops", op.loc,
                suggestion="register one with compiler.backend.lowers, or pass a rule table")
        try:
            rule(self, op)
        except CompilationError as error:
            if error.loc.line == 0 and op.loc.line:
                raise CompilationError(error.message, op.loc, expected=error.expected,
                                       found=error.found, suggestion=error.suggestion) from error
            raise
        except LayoutError as error:
            raise CompilationError(f"`{op.NAME}`: {error}", op.loc) from error
        except Exception as error:  # a backend bug: keep the cause chained, show the op
            raise CompilationError(
                f"internal error in the backend while lowering `{op.NAME}`: "
                f"{type(error).__name__}: {error}", op.loc) from error

    def new_block(self, name: str) -> ir.Block:
        count = self._names.get(name, 0)
        self._names[name] = count + 1
        return self.function.append_basic_block(f"{name}{count}" if count else name)

    # --------------------------------------------------------------- declarations
    def declare(self, name: str, return_type: ir.Type, arg_types, var_arg: bool = False) -> ir.Function:
        existing = self.module.globals.get(name)
        if existing is not None:
            return existing
        return ir.Function(self.module, ir.FunctionType(return_type, list(arg_types), var_arg), name)

    def inline_asm(self, asm: tuple[str, str], args, result_types=()) -> list[ir.Value]:
        """Call side-effecting inline asm ((text, constraints), as ptx_asm builds them);
        its results as a list, one per result type."""
        text, constraints = asm
        if not result_types:
            return_type = ir.VoidType()
        elif len(result_types) == 1:
            return_type = result_types[0]
        else:
            return_type = ir.LiteralStructType(list(result_types))
        function_type = ir.FunctionType(return_type, [a.type for a in args])
        call = self.builder.call(ir.InlineAsm(function_type, text, constraints, side_effect=True), list(args))
        if not result_types:
            return []
        if len(result_types) == 1:
            return [call]
        return [self.builder.extract_value(call, i) for i in range(len(result_types))]

    def intrinsic(self, name: str, return_type: ir.Type, args, builder: Optional[ir.IRBuilder] = None):
        """Call an LLVM/NVVM intrinsic, declaring it on first use."""
        function = self.declare(name, return_type, [a.type for a in args])
        return (builder or self.builder).call(function, list(args))

    def global_string(self, text: str) -> ir.GlobalVariable:
        """A NUL-terminated constant string in global memory (one per distinct text)."""
        key = ("string", text)
        if key not in self._cache:
            data = bytearray(text.encode("utf-8")) + b"\0"
            array = ir.ArrayType(T.I8, len(data))
            variable = ir.GlobalVariable(self.module, array, f"weft_str{len(self._strings)}")
            variable.global_constant = True
            variable.linkage = "private"
            variable.unnamed_addr = True
            variable.initializer = ir.Constant(array, data)
            variable.type = T.GENERIC_PTR  # refer to it as an opaque pointer (llvmlite types it)
            self._strings.append(variable)
            self._cache[key] = variable
        return self._cache[key]

    def cached(self, key, make: Callable[[ir.IRBuilder], ir.Value]) -> ir.Value:
        """A value computed once in the prologue (so it dominates all uses) and reused;
        per partition inside a warp_specialize."""
        key = (self.partition, key)
        if key not in self._cache:
            self._cache[key] = make(self.prologue)
        return self._cache[key]

    @contextmanager
    def recompute_scope(self, prologue: ir.IRBuilder):
        """Lower a loop body whose thread-position values are computed afresh in each
        iteration, in `prologue` (the body's first block), from a volatile read of %tid.x
        that LLVM can neither hoist out of the loop nor merge with the entry block's: the
        values derived from it stay inside the loop too, instead of occupying registers
        across it. (Without the scope, flash attention's persistent loop spilled.)"""
        saved = self.prologue, self._cache, self._opaque_tid
        self.prologue, self._cache, self._opaque_tid = prologue, {}, True
        try:
            yield
        finally:
            self.prologue, self._cache, self._opaque_tid = saved

    @contextmanager
    def partition_scope(self, partition: Partition, prologue: ir.IRBuilder):
        """Lower a warp_specialize block: indices relative to its warps, its own prologue."""
        saved = self.partition, self.prologue
        self.partition, self.prologue = partition, prologue
        try:
            yield
        finally:
            self.partition, self.prologue = saved

    @property
    def num_warps(self) -> int:
        """Warps running the code being lowered (the partition's inside a warp_specialize)."""
        return self.partition.num_warps if self.partition is not None else self.kernel.num_warps

    def barrier(self, any_of: ir.Value | None = None) -> ir.Value | None:
        """Every thread running this code meets here: bar.sync 0 for the CTA, the
        partition's named barrier (`bar.sync id, threads`) inside a warp_specialize
        (each copy of a replicated worker its own: the id is a register there).

        With `any_of` (an i1), the barrier also ORs it over those threads and returns the
        answer, the same in each (`bar.red.or.pred`, the PTX ISA's barrier.cta.red)."""
        barrier_id, threads = self._barrier_operands()
        if any_of is not None:
            if barrier_id is None:  # the whole CTA as launched, at barrier 0
                barrier_id, threads = ir.Constant(T.I32, 0), ir.Constant(T.I32, 32 * self.kernel.total_warps)
            text, constraints = ptx_asm.barrier_red_or()
            answer = self.builder.asm(ir.FunctionType(T.I32, [T.I32, T.I32, T.I32]), text, constraints,
                                      [self.builder.zext(any_of, T.I32), barrier_id, threads], side_effect=True)
            return self.builder.icmp_unsigned("!=", answer, ir.Constant(T.I32, 0))
        if barrier_id is None:
            self.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.all", ir.VoidType(), [ir.Constant(T.I32, 0)])
            return None
        self.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.count", ir.VoidType(), [barrier_id, threads])
        return None

    def _barrier_operands(self) -> tuple[ir.Value | None, ir.Value | None]:
        """(id, threads) of the barrier `barrier` meets at; (None, None) for bar.sync 0
        over the whole CTA as launched."""
        if self.partition is not None:
            barrier_id, threads = self.partition.barrier_id, 32 * self.partition.num_warps
            if self.partition.replicas > 1:
                barrier_id = self.builder.add(self.replica_index(), ir.Constant(T.I32, barrier_id))
        elif self.barrier_threads is not None:
            barrier_id, threads = 0, self.barrier_threads
        else:
            return None, None
        if isinstance(barrier_id, int):
            barrier_id = ir.Constant(T.I32, barrier_id)
        return barrier_id, ir.Constant(T.I32, threads)

    # ------------------------------------------------------------------ thread ids
    def special_register(self, name: str) -> ir.Value:
        """%tid.x, %ctaid.y, ... read once in the prologue."""
        if self._opaque_tid and name == "tid.x":
            # LLVM may not hoist a volatile asm, nor merge it with the entry block's read.
            text, constraints = ptx_asm.read_special_register(name)
            return self.cached(("sreg", name), lambda b: b.asm(
                ir.FunctionType(T.I32, []), text, constraints, [], side_effect=True, name="tid"))
        return self.cached(("sreg", name), lambda b: self.intrinsic(
            f"llvm.nvvm.read.ptx.sreg.{name}", T.I32, [], builder=b))

    @property
    def thread_id(self) -> ir.Value:
        """%tid.x; inside a partition, relative to its first thread (thread 0 issues),
        in a replicated worker to its copy's first thread."""
        tid = self.special_register("tid.x")
        partition = self.partition
        if partition is None or not partition.first_warp:
            return tid
        first = ir.Constant(T.I32, 32 * partition.first_warp)
        if partition.replicas > 1:  # copies are num_warps (a power of two) warps each
            last = ir.Constant(T.I32, 32 * partition.num_warps - 1)
            return self.cached("partition_tid",
                               lambda b: b.and_(b.sub(tid, first), last, name="copy_tid"))
        return self.cached("partition_tid", lambda b: b.sub(tid, first, name="partition_tid"))

    def uniform_warp(self, tid: Optional[ir.Value] = None) -> ir.Value:
        """The CTA-wide warp index made warp-uniform (lane 0's, by shfl), so that branches
        and barrier ids on it are uniform; of %tid.x read once in the prologue, or of
        `tid`, computed where the builder is."""
        def make(b: ir.IRBuilder, tid: ir.Value) -> ir.Value:
            warp = b.lshr(tid, ir.Constant(T.I32, 5))
            return self.intrinsic("llvm.nvvm.shfl.sync.idx.i32", T.I32,
                                  [ir.Constant(T.I32, -1), warp, ir.Constant(T.I32, 0), ir.Constant(T.I32, 0x1F)],
                                  builder=b)
        if tid is not None:
            return make(self.builder, tid)
        return self.cached("cta_warp", lambda b: make(b, self.special_register("tid.x")))

    def replica_index(self) -> ir.Value:
        """Which copy of a replicated worker runs the code (0 elsewhere), computed where
        the builder is from a read of %tid.x that LLVM may not hoist: a kernel that asks
        for it where it uses it holds no register for it (nor for the addresses made from
        it) across loops. (The shfl is also what keeps ptxas from hoisting it: without
        it, flash attention's consumers spilled.)"""
        partition = self.partition
        if partition is None or partition.replicas == 1:
            return ir.Constant(T.I32, 0)
        b = self.builder
        text, constraints = ptx_asm.read_special_register("tid.x")
        tid = b.asm(ir.FunctionType(T.I32, []), text, constraints, [], side_effect=True, name="tid")
        copy = b.sub(self.uniform_warp(tid), ir.Constant(T.I32, partition.first_warp))
        return b.lshr(copy, ir.Constant(T.I32, partition.num_warps.bit_length() - 1), name="replica")

    def hardware_index(self, dim: str) -> ir.Value:
        """The thread's index along a hardware in-dim: lane, warp or block (cluster rank).

        Outside partitions of a kernel with warp_specialize workers, the extra warps run
        the code as copies of the first `num_warps` (warp index modulo num_warps)."""
        if dim == "lane":
            return self.cached(("hw", dim), lambda b: b.and_(self.thread_id, ir.Constant(T.I32, 31), name="lane"))
        if dim == "warp":
            def warp(b):
                index = b.lshr(self.thread_id, ir.Constant(T.I32, 5), name="warp")
                if self.partition is None and self.kernel.total_warps > self.kernel.num_warps:
                    index = b.urem(index, ir.Constant(T.I32, self.kernel.num_warps), name="mirror_warp")
                return index
            return self.cached(("hw", dim), warp)
        if dim == "block":
            return self.special_register("cluster.ctarank")
        raise CompilationError(f"internal: no hardware index for in-dim {dim!r}")

    def shared_pointer(self, byte_offset: Union[int, ir.Value]) -> ir.Value:
        """`ptr addrspace(3)` to a byte of the kernel's shared memory."""
        if self.shared_memory is None:
            raise CompilationError(
                "this kernel uses shared memory but its shared_bytes is 0",
                suggestion="run allocate_shared_memory before the backend")
        if isinstance(byte_offset, int):
            byte_offset = ir.Constant(T.I32, byte_offset)
        return self.builder.gep(self.shared_memory, [byte_offset], source_etype=T.I8)


def elementwise(ctx: Lowering, result: Value, operands, compute) -> None:
    """Define `result` register by register: compute(builder, *operand registers).

    Scalar operands of a tensor op are splatted on the fly.
    """
    if isinstance(result.type, TensorType):
        count = T.register_count(result.type)
        columns = [ctx.registers(v, count) for v in operands]
        ctx.define(result, tuple(compute(ctx.builder, *row) for row in zip(*columns)))
    else:
        ctx.define(result, compute(ctx.builder, *(ctx.scalar(v) for v in operands)))


def _holds_loop(op: Op) -> bool:
    return op.LOOP or any(inner.LOOP for block in op.nested_blocks() for inner in block.walk())
