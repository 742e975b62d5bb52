"""The lowlevel passes on hand-built IR: allocation, barriers, axis facts, vector widths."""

import pytest

from weft.compiler.errors import CompilationError
from weft.compiler.ir import (AddPtr, AllocateSharedMemory, Arange, Block, Compare, For, Kernel, Load, Reduce,
                              SharedLoad, SharedStore, Splat, Store, Value, Yield)
from weft.compiler.passes.allocate_shared_memory import allocate_shared_memory
from weft.compiler.passes.axis_analysis import analyze_axes
from weft.compiler.passes.insert_barriers import insert_barriers
from weft.compiler.passes.vectorize_memory import vectorize_memory
from weft.compiler.types import PointerType, SharedType, TensorType, fp32, i1, i32
from weft.compiler.verifier import verify
from weft.layouts import LinearLayout

from .backend_kernels import blocked_1d, row_major_shared


def vector_add_kernel(per_thread, n_divisibility, masked=True):
    layout = blocked_1d(1024, per_thread)
    x = Value(PointerType(fp32), "x")
    n = Value(i32, "n")
    offs = Value(TensorType((1024,), i32, layout), "offs")
    ptrs0 = Value(TensorType((1024,), PointerType(fp32), layout), "xs")
    ptrs = Value(TensorType((1024,), PointerType(fp32), layout), "ptrs")
    nn = Value(TensorType((1024,), i32, layout), "nn")
    mask = Value(TensorType((1024,), i1, layout), "mask")
    val = Value(TensorType((1024,), fp32, layout), "val")
    ops = [Arange(result=offs, start=0, end=1024), Splat(result=ptrs0, operand=x),
           AddPtr(result=ptrs, pointer=ptrs0, offset=offs), Splat(result=nn, operand=n),
           Compare(result=mask, predicate="lt", lhs=offs, rhs=nn)]
    ops += [Load(result=val, pointer=ptrs, mask=mask if masked else None),
            Store(pointer=ptrs, value=val, mask=mask if masked else None)]
    return Kernel("k", (x, n), Block((), tuple(ops)), 4, param_divisibility=(16, n_divisibility))


def test_axis_analysis_of_arange_plus_pointer():
    kernel = vector_add_kernel(4, 16)
    infos = analyze_axes(kernel)
    by_name = {v.hint: info for v, info in infos.items()}
    assert by_name["offs"].contiguity == (1024,)
    assert by_name["ptrs"].contiguity == (1024,)
    assert by_name["ptrs"].divisibility == (16,)
    assert by_name["mask"].constancy == (16,)


@pytest.mark.parametrize("per_thread, n_div, masked, expected", [
    (4, 16, True, 4),    # 4 fp32 = 128 bits, mask constant over 16
    (8, 16, True, 4),    # capped at 128 bits
    (4, 1, True, 1),     # n unknown: mask may change inside a vector
    (4, 1, False, 4),    # no mask: only alignment matters
    (2, 16, True, 2),
    (1, 16, True, 1),
])
def test_vector_width_follows_layout_alignment_and_mask(per_thread, n_div, masked, expected):
    kernel = vectorize_memory(vector_add_kernel(per_thread, n_div, masked))
    widths = [op.vector for op in kernel.walk() if isinstance(op, (Load, Store))]
    assert widths == [expected, expected]


def shared_kernel(reuse_in_loop=False):
    layout = LinearLayout({"register": [(0, 1), (0, 2)], "lane": [(0, 4), (0, 8), (1, 0), (2, 0), (4, 0)],
                           "warp": [(8, 0), (16, 0)], "block": []}, {"dim0": 32, "dim1": 16})
    tensor = TensorType((32, 16), fp32, layout)
    a_type = SharedType((32, 16), fp32, row_major_shared(32, 16))
    x, a, b = Value(tensor, "x"), Value(a_type, "a"), Value(a_type, "b")
    y, z = Value(tensor, "y"), Value(tensor, "z")
    ops = (AllocateSharedMemory(result=a, init=None), SharedStore(buffer=a, value=x), SharedLoad(result=y, buffer=a),
           AllocateSharedMemory(result=b, init=None), SharedStore(buffer=b, value=y), SharedLoad(result=z, buffer=b))
    return Kernel("s", (x,), Block((), ops), 4)


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


def test_loop_back_edge_gets_a_barrier():
    base = shared_kernel()
    x = base.params[0]
    ops = base.body.ops
    a = ops[0].result
    y = Value(x.type, "y")
    iv = Value(i32, "i")
    lo = Value(i32, "lo")
    body = Block((iv,), (SharedStore(buffer=a, value=x), SharedLoad(result=y, buffer=a), Yield(values=())))
    loop = For(results=(), lower=lo, upper=lo, step=lo, inits=(), body=body)
    kernel = Kernel("l", (x, lo), Block((), (ops[0], loop)), 4)
    kernel = insert_barriers(allocate_shared_memory(kernel))
    loop = kernel.body.ops[-1]
    # The store of iteration i+1 must wait for every warp's load of iteration i.
    assert [op.NAME for op in loop.body.ops] == ["barrier", "shared_store", "barrier", "shared_load", "yield"]


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
