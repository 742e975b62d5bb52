"""drop_unused_atomic_results: an atomic whose old value nothing reads loses its result
before allocation (so it needs no scratch), one whose old value is stored keeps it."""

import pytest

from weft import lowlevel as ll
from weft.compiler import ir
from weft.compiler.frontend import build_kernel
from weft.compiler.pipeline import run_layout_passes

L1 = ll.BlockedLayout([2], [32], [4], [0])  # 256 elements, 2 per thread: no copies


@ll.jit
def atomic_max(ptr, out_ptr, KEEP: ll.constexpr, L: ll.constexpr):
    offsets = ll.arange(0, 256, L)
    old = ll.atomic_max(ptr + offsets, offsets)
    if KEEP:
        ll.store(out_ptr + offsets, old)


def atomics(kernel):
    return [op for op in kernel.walk() if isinstance(op, ir.AtomicRMW)]


@pytest.mark.parametrize("keep", [False, True])
def test_unused_results_are_dropped_before_allocation(keep):
    built = build_kernel(atomic_max, {"ptr": "*i32", "out_ptr": "*i32"}, {"KEEP": keep, "L": L1}, 4)
    assert [op.result is not None for op in atomics(built)] == [True]  # the frontend always defines it
    kernel = run_layout_passes(built)
    (op,) = atomics(kernel)
    assert (op.result is not None) == keep
    if not keep:
        assert op.scratch_offset is None and kernel.shared_bytes == 0
