"""Run a `layout`-stage kernel: each program (CTA) of the grid in turn, each op by its rule.

Within a CTA a distributed tensor is a numpy array (num_warps, 32, num_registers) laid out
by its layout (see registers.py); a scalar is a numpy scalar of its storage dtype; a pointer
is an int64 byte address (memory.py); a shared buffer is a `SharedRef` (byte offset + type).
Every op runs for all threads at once, vectorised; control flow is uniform across the CTA.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...compiler import ir
from ...compiler.errors import UNKNOWN_LOC
from ...compiler.types import PointerType, ScalarType, SharedType, TensorDescriptorType, TensorType
from ...layouts import LinearLayout
from .dtypes import finish, storage_dtype
from .errors import EmulationError
from .host_pointers import reachable_arrays
from .memory import GlobalMemory, SharedMemory
from .registers import LANES, num_registers, thread_coordinates
from .rules import EMULATION_RULES, RuleTable

_ALIGN = 1024  # placement of buffers the allocation pass has not placed yet (128B swizzle)


@dataclass(frozen=True)
class SharedRef:
    """A shared-memory buffer or view: element c at byte
    `offset + (addressing(c) XOR xor) * element bytes` (see shared_memory.py)."""

    offset: int
    type: SharedType
    addressing: LinearLayout  # the view's dims -> element offset in the root buffer
    xor: int = 0
    end: int = 0  # the byte after the root buffer (views keep their allocation's)


class InFlight:
    """A value an async op is still computing (an async wgmma's accumulator): it may be
    passed on (loop-carried, chained into the next wgmma) but not read until retired."""

    __slots__ = ("registers", "op", "group")

    def __init__(self, registers, op: ir.Op, group):
        self.registers = registers
        self.op = op
        self.group = group

    def error(self) -> EmulationError:
        if self.group.retired:
            # The registers are final, but the backend orders only reads of the value the
            # wait returns after the wait; a read of this one may be scheduled above it.
            return EmulationError(
                f"reads the result of an async `{self.op.NAME}` itself after a "
                f"warpgroup_mma_wait retired it: read the value the wait returns instead "
                f"(`acc = ll.warpgroup_mma_wait(0, deps=[acc])`); only reads of that value are "
                f"ordered after the wait", other_loc=self.op.loc, other_what="issued")
        return EmulationError(
            f"reads the result of an async `{self.op.NAME}` before a warpgroup_mma_wait that "
            f"lists it has retired it (wgmma results are undefined until then)",
            other_loc=self.op.loc, other_what="issued")


class OutOfRangeView:
    """A shared view at an index outside its buffer. Computing its address is harmless on
    the GPU (an op predicated off never uses it: `mbarrier.arrive(bars.index(i - 1),
    pred=i > 0)`), so the error waits for an op that runs and uses the view; views of it
    stay out of range."""

    __slots__ = ("problem", "op")

    def __init__(self, problem: str, op: ir.Op):
        self.problem = problem
        self.op = op

    def error(self) -> EmulationError:
        return EmulationError(f"uses a view with {self.problem}",
                              other_loc=self.op.loc, other_what="view taken")


class CTA:
    """One program of the grid (or, inside warp_specialize, one partition of it): its
    values, shared memory and identity. `warp_base` is the CTA warp of its warp 0."""

    def __init__(self, kernel: ir.Kernel, program_id: tuple, grid: tuple, memory: GlobalMemory,
                 shared: SharedMemory, rules: RuleTable, stream, placements: dict, memo: dict):
        self.kernel = kernel
        self.num_warps = kernel.num_warps
        self.program_id = program_id
        self.grid = grid
        self.memory = memory
        self.shared = shared
        self.rules = rules
        self.stream = stream
        self.placements = placements  # id(AllocateSharedMemory) -> byte offset, for unplaced buffers
        self.env: dict[ir.Value, object] = {}
        self.warp_base = 0
        self.partition = "default partition"
        self.replica = 0         # which copy of a replicated worker partition this is
        self.scheduler = None    # partitions.Scheduler while warp_specialize runs (clusters: always)
        self.in_partition = False
        self.rank = 0            # in the cluster; its shared bytes start at shared_base
        self.shared_base = 0
        self.async_state = None  # async_common.PartitionAsync: this partition's async groups
        self.current_op: Optional[ir.Op] = None  # the op running (or last run), for reports
        self._rule_cache: dict[type, object] = {}
        self._memo = memo  # shared by the CTAs of one launch

    def memo(self, op: ir.Op, name: str, compute):
        """`compute()` once per op and launch (register maps, plans, address tables)."""
        key = (id(op), name)
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = compute()
            return value

    # ------------------------------------------------------------------ values
    def __getitem__(self, value: ir.Value):
        try:
            x = self.env[value]
        except KeyError:
            raise EmulationError(f"value {value!r} is used before it is defined") from None
        kind = type(x)
        if kind is InFlight or kind is OutOfRangeView:
            raise x.error()
        return x

    def peek(self, value: ir.Value):
        """The value as bound, even one still in flight or an out-of-range view (for ops
        that only pass it on)."""
        try:
            return self.env[value]
        except KeyError:
            raise EmulationError(f"value {value!r} is used before it is defined") from None

    def bind(self, value: ir.Value, x) -> None:
        self.env[value] = x

    def register_shape(self, type_: TensorType) -> tuple[int, int, int]:
        return (self.num_warps, LANES, num_registers(self.layout(type_)))

    @staticmethod
    def layout(type_: TensorType):
        if type_.layout is None:
            raise EmulationError(
                f"{type_} has no layout: the emulator runs the `layout` stage; run the layout "
                f"passes first")
        return type_.layout

    def full(self, type_, value):
        """A value of `type_` (tensor or scalar) every element of which is `value`."""
        element = type_.element if isinstance(type_, TensorType) else type_
        scalar = finish(element, value)
        if isinstance(type_, TensorType):
            return np.full(self.register_shape(type_), scalar, dtype=storage_dtype(element))
        return scalar

    def describe(self, type_):
        """A function naming the thread, register and element at an index of a value."""
        if not isinstance(type_, TensorType):
            return lambda position: "scalar access"

        def where(position: tuple) -> str:
            if len(position) != 3:
                return f"{type_} access"
            coords = thread_coordinates(self.layout(type_), self.num_warps)
            w, l, r = position
            element = tuple(int(c[w, l, r]) for c in coords)
            return f"tensor element {element} held by warp {w} lane {l} register {r}"
        return where

    # ------------------------------------------------------------------- blocks
    def run_block(self, block: ir.Block, args=()) -> Optional[ir.Op]:
        """Run a block's ops; return its terminator (Yield/Condition), its operands unevaluated."""
        if len(args) != len(block.args):
            raise EmulationError(f"block expects {len(block.args)} arguments, got {len(args)}")
        for value, x in zip(block.args, args):
            self.env[value] = x
        scheduler = self.scheduler
        for op in block.ops:
            if op.TERMINATOR:
                return op
            self.current_op = op
            if scheduler is not None and scheduler.unwinding:
                scheduler.stop_here()  # an op boundary: where an abandoned partition ends
            rule = self._rule_cache.get(type(op))
            if rule is None:
                rule = self._rule_cache[type(op)] = self.rules.lookup(op)
            try:
                rule(self, op)
            except EmulationError as error:
                if error.loc == UNKNOWN_LOC:
                    raise EmulationError(error.message, op.loc, other_loc=error.other_loc,
                                         other_what=error.other_what, program=error.program) from None
                raise
            except Exception as error:  # a numpy or layout failure: name the op's line
                raise EmulationError(f"`{op.NAME}` failed: {type(error).__name__}: {error}",
                                     op.loc) from error
        return None


def _host_array(arg, name: str) -> np.ndarray:
    """A numpy view of a host array argument (numpy, or a CPU torch tensor)."""
    if isinstance(arg, np.ndarray):
        return arg
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(arg, torch.Tensor):
        tensor = arg.detach()
        if tensor.device.type != "cpu":
            raise EmulationError(f"argument `{name}` is a {tensor.device} tensor; the emulator "
                                 f"needs host memory (move it with .cpu())")
        if tensor.dtype in (torch.bfloat16,) or "float8" in str(tensor.dtype):
            same_width = {1: torch.uint8, 2: torch.int16}[tensor.element_size()]
            tensor = tensor.view(same_width)
        return tensor.numpy()
    raise EmulationError(f"argument `{name}` is a {type(arg).__name__}; a pointer parameter "
                         f"needs a numpy array or a CPU torch tensor")


def _scalar_argument(arg, element: ScalarType, name: str):
    if element.is_int:
        if not isinstance(arg, (int, np.integer, bool, np.bool_)):
            raise EmulationError(f"argument `{name}` is {arg!r}; the kernel expects an {element}")
        if not element.is_bool:
            info = np.iinfo(storage_dtype(element))
            if not info.min <= int(arg) <= info.max:
                raise EmulationError(f"argument `{name}` = {arg} does not fit in {element}")
        return finish(element, int(arg))
    if not isinstance(arg, (int, float, np.integer, np.floating)):
        raise EmulationError(f"argument `{name}` is {arg!r}; the kernel expects an {element}")
    return finish(element, np.float64(arg))


def _place_unallocated(kernel: ir.Kernel) -> tuple[dict, int]:
    """Byte offsets for AllocateSharedMemory ops the allocation pass has not placed (offset None)."""
    placements, top = {}, -(-kernel.shared_bytes // _ALIGN) * _ALIGN
    for op in kernel.walk():
        if isinstance(op, ir.AllocateSharedMemory) and op.offset is None:
            placements[id(op)] = top
            top += -(-op.result.type.num_bytes // _ALIGN) * _ALIGN
    return placements, (top if placements else kernel.shared_bytes)


def _total_warps(kernel: ir.Kernel) -> int:
    """Warps the CTA launches with: num_warps plus the largest warp_specialize's workers."""
    workers = [op.worker_warps() for op in kernel.walk() if isinstance(op, ir.WarpSpecialize)]
    return kernel.num_warps + max(workers, default=0)


def emulate(kernel: ir.Kernel, grid, args, *, rules: Optional[RuleTable] = None,
            stream=None) -> None:
    """Run `kernel` (layout stage) over `grid` on host arrays; results land in `args` in place.
    CTAs run one at a time, or, launched in clusters (`kernel.cluster`), a cluster at a
    time, its CTAs taking turns (partitions.run_cluster).

    `args` follow `kernel.params`: a numpy array (or CPU torch tensor) per pointer parameter,
    whose element 0 the pointer addresses, and a Python/numpy number per scalar parameter.
    `print` ops write to `stream` (default sys.stdout). Raises EmulationError for faults,
    races and failed asserts, naming the source line.
    """
    if kernel.stage != "layout":
        raise EmulationError(f"kernel `{kernel.name}` is at stage `{kernel.stage}`; the emulator "
                             f"runs the `layout` stage (run the layout passes first)")
    grid = (grid,) if isinstance(grid, (int, np.integer)) else tuple(grid)
    grid = tuple(int(g) for g in (grid + (1, 1, 1))[:3])
    passed = kernel.params[:len(kernel.params) - len(kernel.hidden_params)]
    if len(args) != len(passed):
        raise EmulationError(f"kernel `{kernel.name}` takes {len(passed)} arguments "
                             f"({', '.join(p.hint or '?' for p in passed)}), got {len(args)}")
    if kernel.hidden_params:
        from .descriptors import hidden_arguments
        args = tuple(args) + hidden_arguments(kernel, args, grid)
    rules = rules or EMULATION_RULES
    stream = stream or sys.stdout
    memory = GlobalMemory()
    bound = []
    for index, (param, arg) in enumerate(zip(kernel.params, args)):
        name = param.hint or f"arg{index}"
        if isinstance(param.type, PointerType):
            array = _host_array(arg, name)
            bound.append(memory.add(name, array, param.type.pointee))
        elif isinstance(param.type, ScalarType):
            bound.append(_scalar_argument(arg, param.type, name))
        elif isinstance(param.type, TensorDescriptorType):
            from .descriptors import bind_descriptor
            bound.append(bind_descriptor(arg, param.type, name, memory,
                                         lambda base: _host_array(base, name)))
        else:
            raise EmulationError(f"parameter `{name}` of type {param.type} is not supported")
    for index, array in enumerate(reachable_arrays()):
        memory.add(f"reachable[{index}]", _host_array(array, f"reachable[{index}]"), ScalarType("u8"))
    placements, shared_size = _place_unallocated(kernel)
    memo: dict = {}
    cluster = tuple(kernel.cluster)
    if cluster != (1, 1, 1):
        _emulate_clusters(kernel, grid, cluster, bound, memory, shared_size, rules, stream, placements, memo)
        return
    shared = SharedMemory(shared_size, kernel.num_warps, _total_warps(kernel))  # reset per CTA
    with np.errstate(all="ignore"):
        for program in program_order(grid):
            shared.reset()
            cta = CTA(kernel, program, grid, memory, shared, rules, stream, placements, memo)
            try:
                if kernel.body.args:
                    cta.run_block(kernel.body, tuple(bound))
                else:
                    cta.env.update(zip(kernel.params, bound))
                    cta.run_block(kernel.body)
            except EmulationError as error:
                raise error.with_program(program) from error.__cause__


def program_order(grid: tuple):
    """The order CTAs run in (an iterable of program ids): x fastest, as the GPU numbers
    them. Tests that must see other orders (the CTA that arrives last at a counter being
    a low one) replace this."""
    return ((x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0]))


def _emulate_clusters(kernel, grid, cluster, bound, memory, shared_size, rules, stream, placements,
                      memo) -> None:
    """Each cluster of the grid in turn: its CTAs side by side in one SharedMemory (rank r's
    window at r * window bytes), run by one scheduler."""
    from ..arguments import check_grid
    from .partitions import run_cluster

    check_grid(kernel.name, grid, cluster)  # whole clusters, as a launch checks them
    ctas = cluster[0] * cluster[1] * cluster[2]
    total_warps = _total_warps(kernel)
    shared = SharedMemory(shared_size, kernel.num_warps, total_warps, ctas=ctas)
    with np.errstate(all="ignore"):
        for cz in range(grid[2] // cluster[2]):
            for cy in range(grid[1] // cluster[1]):
                for cx in range(grid[0] // cluster[0]):
                    shared.reset()
                    members = []
                    for rank in range(ctas):  # x fastest, as %cluster_ctarank counts
                        i, j, k = rank % cluster[0], rank // cluster[0] % cluster[1], rank // (cluster[0] * cluster[1])
                        program = (cx * cluster[0] + i, cy * cluster[1] + j, cz * cluster[2] + k)
                        cta = CTA(kernel, program, grid, memory, shared, rules, stream, placements, memo)
                        cta.rank, cta.shared_base, cta.warp_base = rank, rank * shared.window, rank * total_warps
                        if not kernel.body.args:
                            cta.env.update(zip(kernel.params, bound))
                        members.append(cta)
                    run_cluster(shared, members, kernel.body, tuple(bound) if kernel.body.args else ())
