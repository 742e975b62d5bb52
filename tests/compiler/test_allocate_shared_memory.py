"""allocate_shared_memory on hand-built IR: offsets, reuse of dead buffers, reduction scratch, the limit."""

import pytest

from weft.compiler.errors import CompilationError
from weft.compiler.ir import AllocateSharedMemory, Block, Kernel, Reduce, Value
from weft.compiler.passes.allocate_shared_memory import allocate_shared_memory
from weft.compiler.passes.insert_barriers import insert_barriers
from weft.compiler.types import SharedType, TensorType, fp32
from weft.compiler.verifier import verify
from weft.layouts import LinearLayout

from .backend_kernels import row_major_shared, shared_kernel


def test_allocation_reuses_dead_buffers_and_barriers_cover_hazards():
    kernel = insert_barriers(allocate_shared_memory(shared_kernel()))
    allocs = [op for op in kernel.walk() if isinstance(op, AllocateSharedMemory)]
    # `a` is dead once loaded, so `b` takes its bytes...
    assert [op.offset for op in allocs] == [0, 0]
    assert kernel.shared_bytes == 32 * 16 * 4
    names = [op.NAME for op in kernel.body.ops]
    # ...which needs a barrier before b's store (WAR on a) as well as store->load barriers.
    assert names == ["allocate_shared_memory", "shared_store", "barrier", "shared_load", "allocate_shared_memory",
                     "barrier", "shared_store", "barrier", "shared_load"]
    verify(kernel)


def test_allocation_over_the_limit_is_a_clear_error():
    layout = row_major_shared(256, 256)
    big = Value(SharedType((256, 256), fp32, layout), "big")
    kernel = Kernel("huge", (), Block((), (AllocateSharedMemory(result=big),)), 4)
    with pytest.raises(CompilationError, match="262144 bytes of shared memory"):
        allocate_shared_memory(kernel)


def test_reduction_scratch_is_allocated_only_across_warps():
    layout = LinearLayout({"register": [(0, 1)], "lane": [(0, 2), (0, 4), (0, 8), (1, 0), (2, 0)],
                           "warp": [(0, 16), (0, 32)], "block": []}, {"dim0": 4, "dim1": 64})
    from weft.layouts.rules import plan_reduction
    from weft.compiler.passes.plan_data_movement import plan_data_movement

    x = Value(TensorType((4, 64), fp32, layout), "x")
    across = Value(TensorType((4,), fp32, plan_reduction(layout, 1).result_layout), "row_sum")
    within = Value(TensorType((64,), fp32, plan_reduction(layout, 0).result_layout), "col_sum")
    ops = (Reduce(result=across, operand=x, axis=1, kind="sum"),
           Reduce(result=within, operand=x, axis=0, kind="sum"))
    kernel = allocate_shared_memory(plan_data_movement(Kernel("r", (x,), Block((), ops), 4)))
    scratch = [op.scratch_offset for op in kernel.body.ops]
    assert scratch == [0, None]
    assert kernel.shared_bytes == 4 * 32 * 1 * 4
    verify(kernel)
