"""cp.async (Gluon's `async_copy` module): each thread copies its elements of a pointer
tensor into shared memory without going through registers.

    async_copy.async_copy_global_to_shared(smem, ptrs, mask)   # masked-off -> zeros
    async_copy.commit_group()                                  # close this group
    async_copy.wait_group(1)                                   # all but 1 group landed
    async_copy.mbarrier_arrive(bar)     # each thread arrives on bar once its copies landed

After wait_group, a CTA barrier (inserted automatically before the first read) makes
the copies of other threads visible. `mbarrier_arrive` hands the copies to another
partition instead: the barrier's count must include one arrival per thread that runs it
(cp.async.mbarrier.arrive.noinc), and the waiters see the copies once the phase completes.
"""

from __future__ import annotations

from typing import Any

from ..compiler import ir
from ..compiler.builder import builtin
from ..compiler.types import PointerType, TensorType
from . import semantic as sem
from .shared import SharedMemoryDescriptor

__all__ = ["async_copy_global_to_shared", "commit_group", "mbarrier_arrive", "wait_group"]


@builtin
def async_copy_global_to_shared(smem: Any, pointer: Any, mask: Any = None) -> None:
    """Copy the elements at `pointer` (a pointer tensor of smem's shape) into `smem`."""
    b = sem.builder()
    what = "async_copy_global_to_shared"
    if not isinstance(smem, SharedMemoryDescriptor):
        raise b.error(f"{what} needs a shared-memory buffer first, found {sem.describe(smem)}")
    if not sem.is_tensor(pointer) or not isinstance(pointer.type.element, PointerType):
        raise b.error(f"{what} needs a tensor of pointers, found {sem.describe(pointer)}")
    if pointer.type.shape != smem.shape or pointer.type.element.pointee != smem.dtype:
        raise b.error(f"{what}: pointers {pointer.type} do not match the buffer {smem.type}",
                      suggestion="build the pointers with the buffer's shape and element type")
    if smem.dtype.bits < 8:
        raise b.error(f"{what}: cp.async copies whole bytes; {smem.dtype} elements are smaller")
    handle = None
    if mask is not None:
        mask = mask if sem.is_value(mask) else sem.constant(bool(mask), sem.i1)
        mask = sem.to_bool(mask)
        if isinstance(mask.type, TensorType):
            if mask.type.shape != pointer.type.shape or mask.type.layout != pointer.type.layout:
                raise sem.layout_mismatch(what, pointer, mask, "pointer", "mask")
        else:
            mask = sem.splat(mask, pointer.type.with_element(sem.i1))
        handle = mask.handle
    b.emit(ir.AsyncCopyGlobalToShared(buffer=smem.handle, pointer=pointer.handle, mask=handle, loc=b.loc))


@builtin
def commit_group() -> None:
    """Close this thread's outstanding cp.async copies into one group."""
    b = sem.builder()
    b.emit(ir.AsyncCopyCommitGroup(loc=b.loc))


@builtin
def wait_group(num_outstanding: int = 0) -> None:
    """Wait until at most `num_outstanding` of this thread's groups are still in flight."""
    b = sem.builder()
    if isinstance(num_outstanding, bool) or not isinstance(num_outstanding, int) \
            or not 0 <= num_outstanding <= 7:
        raise b.error(f"wait_group num_outstanding must be a compile-time int in [0, 7], "
                      f"found {num_outstanding!r}")
    b.emit(ir.AsyncCopyWaitGroup(pending=num_outstanding, loc=b.loc))


@builtin
def mbarrier_arrive(bar: Any) -> None:
    """Every thread arrives once on the mbarrier `bar` when its earlier copies have landed
    (the barrier counts these arrivals: init it with one per thread)."""
    from .mbarrier import _barrier

    b = sem.builder()
    b.emit(ir.AsyncCopyMBarrierArrive(barrier=_barrier(bar, "async_copy.mbarrier_arrive"), loc=b.loc))
