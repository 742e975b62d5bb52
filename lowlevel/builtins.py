"""The module-level ops of `weft.lowlevel` (Gluon's names): indices, constants, global
memory, elementwise math, reductions and shape ops, printing and assertions.

Every op runs at compile time inside the frontend, builds IR at the user's line, and
raises a CompilationError there when its arguments break a rule.
"""

from __future__ import annotations

import builtins as py
from typing import Any, Optional, Sequence

from ..compiler import ir
from ..compiler.builder import builtin
from ..compiler.types import PointerType, ScalarType, TensorType, i1, i32
from . import semantic as sem
from . import shape_ops
from .shape_ops import distributed_layout


def _constexpr_int(value: Any, what: str) -> int:
    if isinstance(value, py.bool) or not isinstance(value, py.int):
        raise sem.builder().error(f"{what} must be a compile-time int, found {sem.describe(value)}",
                                  suggestion="pass it as a constexpr parameter (NAME: ll.constexpr)")
    return value


def _shape(shape: Any, what: str) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)):
        raise sem.builder().error(f"{what} must be a list of compile-time ints, found {shape!r}")
    return tuple(_constexpr_int(s, f"{what} entry") for s in shape)


# ------------------------------------------------------------------ kernel facts
@builtin
def to_tensor(value: Any):
    """A Python number (or constexpr) as a runtime scalar of its own type (bool i1, int
    i32, float fp32); a runtime value is returned as it is. For state that starts as a
    number and is carried through loops or kept in an aggregate's runtime field."""
    return sem.to_value(value)


@builtin
def num_warps():
    """The warps running this code, a compile-time int: the kernel's num_warps, or inside
    a warp_specialize worker partition, that worker's warps."""
    return sem.builder().num_warps


# ------------------------------------------------------------------ indices
@builtin
def program_id(axis: int):
    """The index of this program (CTA) along grid `axis` (0, 1 or 2), an i32 scalar."""
    b = sem.builder()
    if _constexpr_int(axis, "program_id axis") not in (0, 1, 2):
        raise b.error(f"program_id axis must be 0, 1 or 2, found {axis}")
    return b.wrap(b.create(ir.ProgramId, i32, axis=axis))


@builtin
def num_programs(axis: int):
    """The number of programs along grid `axis`, an i32 scalar."""
    b = sem.builder()
    if _constexpr_int(axis, "num_programs axis") not in (0, 1, 2):
        raise b.error(f"num_programs axis must be 0, 1 or 2, found {axis}")
    return b.wrap(b.create(ir.NumPrograms, i32, axis=axis))


@builtin
def arange(start: int, end: int, layout: Any):
    """The i32 values start, start + 1, ..., end - 1 in a 1-D tensor of `layout`;
    end - start must be a power of two."""
    b = sem.builder()
    start = _constexpr_int(start, "arange start")
    end = _constexpr_int(end, "arange end")
    size = end - start
    if size <= 0 or size & (size - 1):
        raise b.error(f"arange({start}, {end}) has {size} elements; the count must be a "
                      f"positive power of two")
    encoding, linear = distributed_layout(layout, (size,), "arange layout")
    result_type = TensorType((size,), i32, linear, encoding)
    return b.wrap(b.create(ir.Arange, result_type, start=start, end=end))


@builtin
def full(shape: Sequence[int], value: Any, dtype: ScalarType, layout: Any):
    """A tensor of `shape` and `dtype` in `layout`, every element `value` (a number or a
    scalar)."""
    b = sem.builder()
    shape = _shape(shape, "full shape")
    if not isinstance(dtype, ScalarType):
        raise b.error(f"full dtype must be an element type such as ll.float32, found {dtype!r}")
    encoding, linear = distributed_layout(layout, shape, "full layout")
    template = TensorType(shape, dtype, linear, encoding)
    if sem.is_value(value):
        if sem.is_tensor(value):
            raise b.error(f"full needs a number or a scalar value, found {sem.describe(value)}")
        return sem.splat(sem.cast(value, dtype), template)
    return sem.constant(value, template)


@builtin
def zeros(shape: Sequence[int], dtype: ScalarType, layout: Any):
    """`full(shape, 0, dtype, layout)`."""
    return full.__wrapped__(shape, 0, dtype, layout)


# ------------------------------------------------------------------ global memory
def _memory_operands(pointer: Any, mask: Any, what: str):
    b = sem.builder()
    if not sem.is_value(pointer) or not isinstance(sem.element_of(pointer.type), PointerType):
        raise b.error(f"{what} needs a pointer or a tensor of pointers, found {sem.describe(pointer)}")
    if mask is not None and not sem.is_value(mask):
        mask = sem.constant(py.bool(mask), i1)
    if mask is not None:
        mask = sem.to_bool(mask)
    return pointer, mask


# Triton's hint names -> PTX qualifiers, for ld.global and st.global.
_LOAD_CACHE_MODIFIERS = {"": "", ".ca": ".ca", ".cg": ".cg", ".cv": ".cv"}
_STORE_CACHE_MODIFIERS = {"": "", ".wb": ".wb", ".cg": ".cg", ".cs": ".cs", ".wt": ".wt"}
_EVICTION_POLICIES = {"": "", "evict_normal": ".L1::evict_normal", "evict_first": ".L1::evict_first",
                      "evict_last": ".L1::evict_last", "no_allocate": ".L1::no_allocate"}


def _cache_qualifier(what: str, cache_modifier: Any, eviction_policy: Any) -> str:
    """The PTX qualifiers of a load's or store's cache options (Triton's names)."""
    b = sem.builder()
    modifiers = _LOAD_CACHE_MODIFIERS if what == "load" else _STORE_CACHE_MODIFIERS
    if cache_modifier not in modifiers:
        raise b.error(f"{what} cache_modifier must be one of {sorted(modifiers)}, found {cache_modifier!r}")
    if eviction_policy not in _EVICTION_POLICIES:
        raise b.error(f"{what} eviction_policy must be one of {sorted(_EVICTION_POLICIES)}, "
                      f"found {eviction_policy!r}")
    if cache_modifier and eviction_policy:
        # PTX allows both only with an L2 cache policy operand, which weft does not emit.
        raise b.error(f"{what} takes a cache_modifier or an eviction_policy, not both",
                      suggestion="keep an L1 eviction_policy, or bypass L1 with cache_modifier='.cg'")
    return modifiers[cache_modifier] or _EVICTION_POLICIES[eviction_policy]


@builtin
def load(pointer: Any, mask: Any = None, other: Any = None, cache_modifier: str = "",
         eviction_policy: str = ""):
    """Elements at `pointer`; where `mask` is false, `other` (default 0) instead.

    `cache_modifier` (".ca", ".cg": L2 only, ".cv") and `eviction_policy` ("evict_first",
    "evict_last", "evict_normal", "no_allocate": L1 priority) are hints, as in Triton: e.g.
    stream data read once with "evict_first" so data read again (weights) stays in L1.
    """
    b = sem.builder()
    cache = _cache_qualifier("load", cache_modifier, eviction_policy)
    pointer, mask = _memory_operands(pointer, mask, "load")
    if mask is None:
        # As in Triton, `other` without a mask has nothing to fill; a kernel can then
        # drop its mask under a constexpr (mask=None) without touching the load.
        other = None
    element = sem.element_of(pointer.type).pointee
    values = [pointer, mask, other]
    names = ["pointer", "mask", "other value"]
    present = [i for i, v in enumerate(values) if v is not None]
    broadcast, template = sem.broadcast_values([values[i] for i in present],
                                               [names[i] for i in present], "load")
    for i, v in zip(present, broadcast):
        values[i] = v
    pointer = sem.coerce(values[0], sem.element_of(pointer.type), template)
    mask = sem.coerce(values[1], i1, template) if mask is not None else None
    other = sem.coerce(values[2], element, template) if other is not None else None
    result_type = template.with_element(element) if template else element
    return b.wrap(b.create(ir.Load, result_type, pointer=pointer.handle,
                           mask=mask.handle if mask is not None else None,
                           other=other.handle if other is not None else None, cache=cache))


@builtin
def store(pointer: Any, value: Any, mask: Any = None, cache_modifier: str = "", eviction_policy: str = ""):
    """Write `value` (converted to the pointee type) at `pointer` where `mask` is true.

    `cache_modifier` (".wb", ".cg", ".cs": streaming, ".wt") and `eviction_policy` (as for
    load) are hints, as in Triton.
    """
    b = sem.builder()
    cache = _cache_qualifier("store", cache_modifier, eviction_policy)
    pointer, mask = _memory_operands(pointer, mask, "store")
    element = sem.element_of(pointer.type).pointee
    values = [pointer, value, mask]
    names = ["pointer", "value", "mask"]
    present = [i for i, v in enumerate(values) if v is not None]
    broadcast, template = sem.broadcast_values([values[i] for i in present],
                                               [names[i] for i in present], "store")
    for i, v in zip(present, broadcast):
        values[i] = v
    pointer = sem.coerce(values[0], sem.element_of(pointer.type), template)
    value = sem.coerce(values[1], element, template)
    mask = sem.coerce(values[2], i1, template) if mask is not None else None
    b.emit(ir.Store(pointer=pointer.handle, value=value.handle,
                    mask=mask.handle if mask is not None else None, cache=cache, loc=b.loc))


# ------------------------------------------------------------------ elementwise
@builtin
def where(condition: Any, x: Any, y: Any):
    """Elementwise `x` where `condition` else `y` (all broadcast to one shape and layout)."""
    return sem.where(condition, x, y)


def _math(kind: str):
    def op(x):
        return sem.unary(kind, x, kind)

    op.__name__ = op.__qualname__ = kind
    op.__doc__ = f"Elementwise {kind} of a floating-point tensor or scalar."
    return builtin(op)


exp, log, log2 = _math("exp"), _math("log"), _math("log2")
sqrt, rsqrt, erf = _math("sqrt"), _math("rsqrt"), _math("erf")


@builtin
def exp2(x: Any, fma_share: float = 0.0):
    """Elementwise 2^x of a floating-point tensor or scalar, on the exp unit (MUFU.EX2,
    2 ulp, results below 2^-126 flush to 0).

    fma_share (a compile-time number in [0, 1]): the share of each thread's registers
    computed instead by a polynomial on the FMA pipe (FlashAttention-4's trick; relative
    error at most 8.6e-5, below half a bf16/fp16 ulp; inf and NaN as above), for kernels
    whose exp unit, not issue slots, limits throughput and whose result is rounded to 16
    bits. Each exp moved costs nine more issued instructions, so it pays only where the
    exp unit alone limits the kernel (weft's flash attention ran slower with any share:
    docs/attention-journal.md). Which registers is fixed per
    layout (compiler/exp2_polynomial.py)."""
    b = sem.builder()
    if isinstance(fma_share, py.bool) or not isinstance(fma_share, (py.int, py.float)) \
            or not 0 <= fma_share <= 1:
        raise b.error(f"exp2 fma_share must be a compile-time number in [0, 1], found "
                      f"{sem.describe(fma_share)}",
                      suggestion="pass a Python float such as 0.25, or a constexpr parameter")
    return sem.unary("exp2", x, "exp2", fma_share=float(fma_share))
sin, cos, floor, ceil = _math("sin"), _math("cos"), _math("floor"), _math("ceil")


@builtin
def abs(x: Any):
    """Elementwise absolute value."""
    return sem.unary("abs", x, "abs")


@builtin
def maximum(x: Any, y: Any):
    """Elementwise maximum (promoted like arithmetic)."""
    return sem.binary("max", x, y, "maximum")


@builtin
def minimum(x: Any, y: Any):
    """Elementwise minimum (promoted like arithmetic)."""
    return sem.binary("min", x, y, "minimum")


@builtin
def fma(x: Any, y: Any, z: Any):
    """Elementwise x * y + z with one rounding."""
    return sem.fma(x, y, z)


@builtin
def cdiv(x: Any, y: Any):
    """ceil(x / y) for non-negative ints: computed now for compile-time ints."""
    if not sem.is_value(x) and not sem.is_value(y):
        return -(-x // y)
    return (x + y - 1) // y


@builtin
def warp_any(mask: Any):
    """Per warp: whether any element of the boolean tensor `mask` that the warp holds is
    true, in every element the warp holds (vote.sync.any; the same shape and layout).

    Being uniform over each warp, the result may be the condition of an `if` that each
    warp takes or skips on its own, `if ll.warp_any(mask):`, so that warps with nothing
    to do skip the work (flash attention rescales O only in warps whose running max
    grew). Such a branch holds register arithmetic only, and reductions along an axis
    that each warp holds whole (lane shuffles within the warp, e.g. a row max of a wgmma
    accumulator)."""
    b = sem.builder()
    if not sem.is_tensor(mask) or mask.type.element != i1:
        raise b.error(f"warp_any needs a boolean tensor, found {sem.describe(mask)}",
                      suggestion="compare first, e.g. ll.warp_any(x > limit)")
    result = b.wrap(b.create(ir.WarpAny, mask.type, operand=mask.handle))
    b.warp_uniform.add(result.handle)
    return result


# ------------------------------------------------------------------ reductions and shapes
@builtin
def sum(x: Any, axis: Optional[int] = None, keep_dims: bool = False, dtype=None):
    """Sum along `axis` (every dim when None); the result is in SliceLayout(axis, ...)."""
    return shape_ops.reduce(x, axis, "sum", keep_dims, dtype)


@builtin
def max(x: Any, axis: Optional[int] = None, keep_dims: bool = False):
    """Maximum along `axis` (every dim when None). For two tensors use ll.maximum."""
    return shape_ops.reduce(x, axis, "max", keep_dims)


@builtin
def min(x: Any, axis: Optional[int] = None, keep_dims: bool = False):
    """Minimum along `axis` (every dim when None). For two tensors use ll.minimum."""
    return shape_ops.reduce(x, axis, "min", keep_dims)


@builtin
def argmax(x: Any, axis: int, keep_dims: bool = False):
    """Index (i32) of the maximum along `axis`."""
    return shape_ops.reduce(x, axis, "argmax", keep_dims)


@builtin
def argmin(x: Any, axis: int, keep_dims: bool = False):
    """Index (i32) of the minimum along `axis`."""
    return shape_ops.reduce(x, axis, "argmin", keep_dims)


@builtin
def expand_dims(x: Any, axis: int):
    """A size-1 dim at `axis`; `x` must be in SliceLayout(axis, parent), the result is in parent."""
    return sem.expand_dims(x, axis)


@builtin
def reshape(x: Any, shape: Sequence[int]):
    """The same elements, row-major, under `shape`; no data moves."""
    return shape_ops.reshape(x, shape)


@builtin
def permute(x: Any, order: Sequence[int]):
    """Dims reordered: result dim i is operand dim order[i]; no data moves."""
    return shape_ops.permute(x, order)


@builtin
def convert_layout(x: Any, layout: Any, assert_trivial: bool = False):
    """`x` in another distributed layout; with assert_trivial, fail unless no data moves."""
    return shape_ops.convert_layout(x, layout, assert_trivial)


# ------------------------------------------------------------------ synchronisation, debugging
@builtin
def barrier():
    """All threads of the CTA wait here; their shared-memory writes become visible."""
    b = sem.builder()
    b.emit(ir.Barrier(loc=b.loc))


@builtin
def barrier_any(mask: Any):
    """`ll.barrier()` that also tells every thread whether any element of the boolean
    `mask` (a tensor or scalar) was true in any thread meeting there (bar.red.or.pred):
    a scalar, one value for all of them, so it may be the condition of an `if` that the
    whole CTA (inside a partition: the whole partition) takes together, e.g. a rare slow
    path that needs a warpgroup-wide wgmma when any warp asks for it."""
    b = sem.builder()
    if not (sem.is_tensor(mask) or sem.is_value(mask)) or sem.element_of(mask.type) != i1:
        raise b.error(f"barrier_any needs a boolean tensor or scalar, found {sem.describe(mask)}",
                      suggestion="compare first, e.g. ll.barrier_any(x > limit)")
    return b.wrap(b.create(ir.BarrierAny, i1, operand=mask.handle))


@builtin
def cluster_barrier():
    """Every thread of every CTA of the cluster (launch with `cluster=`) waits for all the
    others, outside warp_specialize. Before the first remote mbarrier arrive or multicast
    TMA load: the peers' barriers are initialised. Before the kernel ends: no peer still
    arrives on or loads into this CTA's shared memory."""
    b = sem.builder()
    b.emit(ir.ClusterBarrier(loc=b.loc))


@builtin
def prefetch_l2(pointer: Any, nbytes: Any):
    """Ask L2 to fetch `nbytes` bytes at `pointer` (a scalar pointer, 16-byte aligned).

    A hint for memory-bound kernels: one thread issues a bulk prefetch
    (cp.async.bulk.prefetch.L2), so a CTA can pull a later CTA's data into L2 without
    holding registers for it. The count is rounded down to a multiple of 16.
    """
    b = sem.builder()
    pointer_value = sem.to_value(pointer)
    size_value = sem.to_value(nbytes)
    if not isinstance(pointer_value.type, PointerType):
        raise b.error("prefetch_l2 needs a scalar pointer", expected="a pointer such as x_ptr + row * stride",
                      found=str(pointer_value.type))
    if not (isinstance(size_value.type, ScalarType) and size_value.type.is_int):
        raise b.error("prefetch_l2 needs an integer byte count", found=str(size_value.type))
    size_value = sem.cast(size_value, i32) if size_value.type != i32 else size_value
    b.emit(ir.PrefetchL2(pointer=pointer_value.handle, nbytes=size_value.handle, loc=b.loc))


@builtin
def device_print(prefix: str, *values: Any):
    """Print `prefix` and the values from every thread at run time."""
    b = sem.builder()
    if not isinstance(prefix, str):
        raise b.error(f"device_print prefix must be a string, found {prefix!r}")
    handles = tuple(sem.to_value(v).handle for v in values)
    b.emit(ir.DevicePrint(prefix=prefix, values=handles, loc=b.loc))


@builtin
def device_assert(condition: Any, message: str = ""):
    """Stop the kernel with `message` where `condition` is false (at run time)."""
    b = sem.builder()
    if not sem.is_value(condition):
        if not condition:
            raise b.error(f"device_assert on a compile-time false condition: {message}")
        return
    condition = sem.to_bool(condition)
    b.emit(ir.DeviceAssert(condition=condition.handle, message=str(message), loc=b.loc))


@builtin
def static_assert(condition: Any, message: str = ""):
    """Fail compilation with `message` unless the compile-time `condition` holds."""
    b = sem.builder()
    if sem.is_value(condition):
        raise b.error("static_assert needs a compile-time condition, found "
                      + sem.describe(condition), suggestion="use ll.device_assert for runtime checks")
    if not condition:
        raise b.error(f"static_assert failed{': ' + str(message) if message else ''}")


@builtin
def static_print(*values: Any):
    """Print compile-time values while the kernel compiles."""
    print(*values)
