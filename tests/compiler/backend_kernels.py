"""Small `layout`-stage kernels built by hand from ir.py classes and LinearLayouts.

Shared by the backend tests (PTX text and ptxas) and usable by GPU tests: each builder
returns a Kernel before the lowlevel passes; `prepare` runs them.
"""

from __future__ import annotations

import contextlib
import dataclasses

from weft.compiler.config import current
from weft.compiler.ir import (AddPtr, AllocateSharedMemory, Arange, Binary, Block, Broadcast, Compare, Condition,
                              Constant, ConvertLayout, ExpandDims, For, If, Kernel, Load, Reduce, SharedIndex,
                              SharedLoad, SharedSlice, SharedStore, Splat, Store, Value, While, Yield)
from weft.layouts.rules import expand_dims_layout, plan_reduction
from weft.compiler.pipeline import run_layout_passes
from weft.compiler.types import PointerType, SharedType, TensorType, fp32, i1, i32
from weft.layouts import LinearLayout, blocked


def blocked_1d(size, per_thread, warps=4):
    """A 1-D blocked layout built directly: per_thread registers, then lanes, then warps."""
    bits = lambda n: n.bit_length() - 1  # noqa: E731
    reg = [(1 << b,) for b in range(bits(per_thread))]
    lane = [(per_thread << b,) for b in range(5)]
    warp = [(per_thread * 32 << b,) for b in range(bits(warps))]
    covered = per_thread * 32 * warps
    reg += [(covered << b,) for b in range(bits(size // covered))] if size > covered else []
    return LinearLayout({"register": reg, "lane": lane, "warp": warp, "block": []}, {"dim0": size})


def row_major_shared(rows, cols):
    bits = lambda n: n.bit_length() - 1  # noqa: E731
    offset = [(0, 1 << b) for b in range(bits(cols))] + [(1 << b, 0) for b in range(bits(rows))]
    return LinearLayout({"offset": offset, "block": []}, {"dim0": rows, "dim1": cols})


def tensor(shape, element, layout):
    return TensorType(tuple(shape), element, layout)


class KernelBuilder:
    """Appends ops to the innermost open region; `add` returns the op's result value."""

    def __init__(self, name: str, num_warps: int = 4):
        self.name, self.num_warps = name, num_warps
        self.params: list[Value] = []
        self.regions: list[list] = [[]]

    def param(self, type_, hint: str) -> Value:
        value = Value(type_, hint)
        self.params.append(value)
        return value

    def add(self, op_class, type_=None, hint: str = "", **fields):
        result = None
        if type_ is not None:
            result = fields["result"] = Value(type_, hint)
        self.regions[-1].append(op_class(**fields))
        return result

    @contextlib.contextmanager
    def region(self):
        ops: list = []
        self.regions.append(ops)
        try:
            yield ops
        finally:
            self.regions.pop()

    def build(self, **changes) -> Kernel:
        return Kernel(self.name, tuple(self.params), Block((), tuple(self.regions[0])), self.num_warps, **changes)

    # ----------------------------------------------------------- small helpers
    def pointers(self, base: Value, offsets: Value) -> Value:
        t = offsets.type
        splat = self.add(Splat, tensor(t.shape, base.type, t.layout), operand=base)
        return self.add(AddPtr, tensor(t.shape, base.type, t.layout), pointer=splat, offset=offsets)

    def splat(self, scalar: Value, like: TensorType) -> Value:
        return self.add(Splat, tensor(like.shape, scalar.type, like.layout), operand=scalar)

    def full(self, value, element, like: TensorType) -> Value:
        return self.add(Constant, tensor(like.shape, element, like.layout), value=value)

    def binary(self, kind: str, lhs: Value, rhs: Value) -> Value:
        return self.add(Binary, lhs.type, kind=kind, lhs=lhs, rhs=rhs)


def prepare(kernel: Kernel) -> Kernel:
    """The lowlevel passes (plans, vector widths, shared offsets, barriers), verified."""
    return run_layout_passes(kernel, dataclasses.replace(current(), verify=True, dump=frozenset()))


# ------------------------------------------------------------------------ kernels
def vector_add(per_thread=4, masked=True, size=1024, element=fp32) -> Kernel:
    """out[i] = x[i] + y[i] for i < n over a 1-D blocked layout."""
    kb = KernelBuilder("vector_add")
    layout = blocked_1d(size, per_thread)
    ptr = PointerType(element)
    x, y, out, n = (kb.param(ptr, "x"), kb.param(ptr, "y"), kb.param(ptr, "out"), kb.param(i32, "n"))
    offs = kb.add(Arange, tensor((size,), i32, layout), "offs", start=0, end=size)
    mask = kb.add(Compare, tensor((size,), i1, layout), "mask", predicate="lt", lhs=offs, rhs=kb.splat(n, offs.type))
    mask = mask if masked else None
    a = kb.add(Load, tensor((size,), element, layout), "a", pointer=kb.pointers(x, offs), mask=mask)
    b = kb.add(Load, tensor((size,), element, layout), "b", pointer=kb.pointers(y, offs), mask=mask)
    kb.add(Store, pointer=kb.pointers(out, offs), value=kb.binary("add", a, b), mask=mask)
    return kb.build(param_divisibility=(16, 16, 16, 16))


def _grid_offsets(kb: KernelBuilder, layout: LinearLayout, rows: int, cols: int, stride: Value):
    """offs[r, c] = r * stride + c in a 2-D layout, through expand_dims and broadcast."""
    row_layout = _slice(layout, 1)
    col_layout = _slice(layout, 0)
    r = kb.add(Arange, tensor((rows,), i32, row_layout), "r", start=0, end=rows)
    c = kb.add(Arange, tensor((cols,), i32, col_layout), "c", start=0, end=cols)
    r2 = kb.add(ExpandDims, tensor((rows, 1), i32, expand_dims_layout(row_layout, 1)), operand=r, axis=1)
    c2 = kb.add(ExpandDims, tensor((1, cols), i32, expand_dims_layout(col_layout, 0)), operand=c, axis=0)
    r2 = kb.binary("mul", r2, kb.splat(stride, r2.type))
    rb = kb.add(Broadcast, tensor((rows, cols), i32, layout), operand=r2)
    cb = kb.add(Broadcast, tensor((rows, cols), i32, layout), operand=c2)
    return kb.binary("add", rb, cb), r


def _slice(layout: LinearLayout, axis: int) -> LinearLayout:
    return plan_reduction(layout, axis).result_layout


def row_reduce(kind="sum", rows=16, cols=128, warps=(1, 4), per_thread=(1, 4), element=fp32, out_element=None):
    """out[r] = reduce(x[r, :]) with warps splitting the columns: lanes and warps combine."""
    kb = KernelBuilder(f"row_{kind}", num_warps=warps[0] * warps[1])
    layout = blocked((rows, cols), per_thread, (32 // min(32, cols // per_thread[1]), min(32, cols // per_thread[1])),
                     warps, (1, 0))
    x, out, stride = kb.param(PointerType(element), "x"), kb.param(PointerType(out_element or element), "out"), \
        kb.param(i32, "stride")
    offs, r = _grid_offsets(kb, layout, rows, cols, stride)
    values = kb.add(Load, tensor((rows, cols), element, layout), "values", pointer=kb.pointers(x, offs))
    result_layout = _slice(layout, 1)
    total = kb.add(Reduce, tensor((rows,), out_element or element, result_layout), "total",
                   operand=values, axis=1, kind=kind)
    kb.add(Store, pointer=kb.pointers(out, r), value=total)
    return kb.build(param_divisibility=(16, 16, 16))


def loop_accumulate(size=512, per_thread=4, element=fp32) -> Kernel:
    """acc = sum over i < steps of x[i * size + offs], a for loop carrying a tensor."""
    kb = KernelBuilder("loop_accumulate")
    layout = blocked_1d(size, per_thread)
    x, out, steps = kb.param(PointerType(element), "x"), kb.param(PointerType(element), "out"), kb.param(i32, "steps")
    offs = kb.add(Arange, tensor((size,), i32, layout), "offs", start=0, end=size)
    zero = kb.full(0.0, element, offs.type)
    lower = kb.add(Constant, i32, value=0)
    one = kb.add(Constant, i32, value=1)
    iv, acc = Value(i32, "i"), Value(zero.type, "acc")
    with kb.region() as body:
        base = kb.binary("mul", kb.splat(iv, offs.type), kb.splat(kb.add(Constant, i32, value=size), offs.type))
        loaded = kb.add(Load, zero.type, pointer=kb.pointers(x, kb.binary("add", base, offs)))
        kb.add(Yield, values=(kb.binary("add", acc, loaded),))
    result = Value(zero.type, "result")
    kb.regions[-1].append(For(results=(result,), lower=lower, upper=steps, step=one, inits=(zero,),
                              body=Block((iv, acc), tuple(body))))
    kb.add(Store, pointer=kb.pointers(out, offs), value=result)
    return kb.build(param_divisibility=(16, 16, 1))


def while_and_if(size=256) -> Kernel:
    """Halve n until it is below `size` (while), then store x or -x (if) depending on it."""
    kb = KernelBuilder("while_and_if")
    layout = blocked_1d(size, 2)
    x, out, n = kb.param(PointerType(fp32), "x"), kb.param(PointerType(fp32), "out"), kb.param(i32, "n")
    offs = kb.add(Arange, tensor((size,), i32, layout), "offs", start=0, end=size)
    limit = kb.add(Constant, i32, value=size)
    two = kb.add(Constant, i32, value=2)
    carried, forwarded = Value(i32, "m"), Value(i32, "m2")
    with kb.region() as before:
        keep = kb.add(Compare, i1, predicate="ge", lhs=carried, rhs=limit)
        kb.add(Condition, condition=keep, values=(carried,))
    with kb.region() as after:
        kb.add(Yield, values=(kb.binary("div", forwarded, two),))
    small = Value(i32, "small")
    kb.regions[-1].append(While(results=(small,), inits=(n,), before=Block((carried,), tuple(before)),
                                after=Block((forwarded,), tuple(after))))
    values = kb.add(Load, tensor((size,), fp32, layout), pointer=kb.pointers(x, offs))
    odd = kb.add(Compare, i1, predicate="ne", lhs=kb.binary("mod", small, two), rhs=kb.add(Constant, i32, value=0))
    with kb.region() as then_ops:
        kb.add(Yield, values=(values,))
    with kb.region() as else_ops:
        kb.add(Yield, values=(kb.binary("sub", kb.full(0.0, fp32, values.type), values),))
    chosen = Value(values.type, "chosen")
    kb.regions[-1].append(If(results=(chosen,), condition=odd, then_body=Block((), tuple(then_ops)),
                             else_body=Block((), tuple(else_ops))))
    kb.add(Store, pointer=kb.pointers(out, offs), value=chosen)
    return kb.build(param_divisibility=(16, 16, 1))


def convert(src: LinearLayout, dst: LinearLayout, shape, element=fp32, num_warps=4) -> Kernel:
    """out = convert_layout(load(x)) for a 2-D tile, stored through the dst layout."""
    kb = KernelBuilder("convert", num_warps=num_warps)
    x, out = kb.param(PointerType(element), "x"), kb.param(PointerType(element), "out")
    stride = kb.add(Constant, i32, value=shape[1])
    offs_src, _ = _grid_offsets(kb, src, shape[0], shape[1], stride)
    offs_dst, _ = _grid_offsets(kb, dst, shape[0], shape[1], stride)
    values = kb.add(Load, tensor(shape, element, src), "values", pointer=kb.pointers(x, offs_src))
    moved = kb.add(ConvertLayout, tensor(shape, element, dst), "moved", operand=values)
    kb.add(Store, pointer=kb.pointers(out, offs_dst), value=moved)
    return kb.build(param_divisibility=(16, 16))


def shared_transpose(rows=64, cols=64, element=fp32, num_warps=4, swizzled=None) -> Kernel:
    """Stage a tile in shared memory (alloc with init), read it back in another layout into
    `out`, store it into stage 1 of a 2-stage buffer (shared_index) and read the window of
    its last rows / 2 rows (shared_slice) into `tail`: out == x, tail == x[rows // 2:]."""
    kb = KernelBuilder("shared_transpose", num_warps=num_warps)
    src = blocked((rows, cols), (1, 4), (4, 8), (num_warps, 1), (1, 0))
    dst = blocked((rows, cols), (4, 1), (8, 4), (1, num_warps), (0, 1))
    smem = swizzled if swizzled is not None else row_major_shared(rows, cols)
    x, out, tail = kb.param(PointerType(element), "x"), kb.param(PointerType(element), "out"), \
        kb.param(PointerType(element), "tail")
    stride = kb.add(Constant, i32, value=cols)
    offs_src, _ = _grid_offsets(kb, src, rows, cols, stride)
    offs_dst, _ = _grid_offsets(kb, dst, rows, cols, stride)
    values = kb.add(Load, tensor((rows, cols), element, src), "values", pointer=kb.pointers(x, offs_src))
    buffer = kb.add(AllocateSharedMemory, SharedType((rows, cols), element, smem), "buffer", init=values)
    read = kb.add(SharedLoad, tensor((rows, cols), element, dst), "read", buffer=buffer)
    kb.add(Store, pointer=kb.pointers(out, offs_dst), value=read)
    stages = kb.add(AllocateSharedMemory, SharedType((2, rows, cols), element, _stacked(smem, 2)), "stages")
    one = kb.add(Constant, i32, value=1)
    stage = kb.add(SharedIndex, SharedType((rows, cols), element, smem), "stage", buffer=stages, index=one)
    kb.add(SharedStore, buffer=stage, value=read)
    half = blocked((rows // 2, cols), (1, 4), (4, 8), (num_warps, 1), (1, 0))
    window = kb.add(SharedSlice, SharedType((rows // 2, cols), element, _rows_of(smem, rows // 2)), "window",
                    buffer=stage, dim=0, start=rows // 2)
    last_rows = kb.add(SharedLoad, tensor((rows // 2, cols), element, half), "last_rows", buffer=window)
    offs_half, _ = _grid_offsets(kb, half, rows // 2, cols, stride)
    kb.add(Store, pointer=kb.pointers(tail, offs_half), value=last_rows)
    return kb.build(param_divisibility=(16, 16, 16))


def _stacked(shared: LinearLayout, stages: int) -> LinearLayout:
    """[stages, *shape] with the stage index in the top offset bits."""
    bases = [(0,) + b for b in shared.bases["offset"]]
    bases += [(1 << s,) + (0,) * len(shared.out_dims) for s in range(stages.bit_length() - 1)]
    out = {"dim0": stages, **{f"dim{i + 1}": s for i, s in enumerate(shared.out_dims.values())}}
    return LinearLayout({"offset": bases, "block": []}, out)


def _rows_of(shared: LinearLayout, rows: int) -> LinearLayout:
    """The shared layout of the first `rows` rows (for a row-major layout: a prefix)."""
    bases = [b for b in shared.bases["offset"] if b[0] < rows]
    cols = shared.out_dims["dim1"]
    return LinearLayout({"offset": bases, "block": []}, {"dim0": rows, "dim1": cols})


def full_reduce(kind="sum", size=1024, per_thread=4) -> Kernel:
    """out[0] = reduce(x[:size]): a 1-D reduction to a rank-0 tensor, stored by one thread."""
    kb = KernelBuilder(f"full_{kind}")
    layout = blocked_1d(size, per_thread)
    x, out = kb.param(PointerType(fp32), "x"), kb.param(PointerType(fp32), "out")
    offs = kb.add(Arange, tensor((size,), i32, layout), "offs", start=0, end=size)
    values = kb.add(Load, tensor((size,), fp32, layout), "values", pointer=kb.pointers(x, offs))
    total = kb.add(Reduce, tensor((), fp32, _slice(layout, 0)), "total", operand=values, axis=0, kind=kind)
    kb.add(Store, pointer=out, value=total)
    return kb.build(param_divisibility=(16, 16))


# Bare kernels for single-pass tests: no layout passes run, parameters' divisibility given.

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
