"""Hand-built `layout`-stage wgmma kernels (one CTA), for the PTX/ptxas tests and the GPU tests.

out[M, N] = A[M, K] @ B[K, N] (fp32), with A and B loaded from global memory by ordinary
loads, stored into NVMMA-swizzled shared buffers, fenced for the async proxy, and fed to
one WarpgroupMma (A from shared memory, or from registers in the wgmma A fragment).

B is held either as a [K, N] buffer (N contiguous: MN-major for wgmma) or as an [N, K]
buffer (K contiguous) seen through a SharedPermute as [K, N] (K-major), like Gluon's
`smem.permute((1, 0))`. Inputs in global memory are row-major: A [M, K], B [K, N] (or
B^T [N, K] for `b_kmajor`).
"""

from __future__ import annotations

from dataclasses import dataclass

from weft.compiler.ir import (AllocateSharedMemory, Cast, Compare, Constant, FenceAsyncShared, Load, SharedPermute,
                              Store, Value, WarpgroupMma, WarpgroupMmaWait)
from weft.compiler.types import PointerType, ScalarType, SharedType, fp32, i1, i32
from weft.layouts import blocked, default_nvmma_swizzle, dot_operand, nvmma_shared, wgmma_accumulator
from weft.lowlevel.layouts import DotOperandLayout, NVMMADistributedLayout, NVMMASharedLayout

from .backend_kernels import KernelBuilder, _grid_offsets, tensor


@dataclass(frozen=True)
class DotConfig:
    m: int = 64
    n: int = 64
    k: int = 64
    element: str = "bf16"
    acc: str = "fp32"
    warpgroups: int = 1
    a_in_registers: bool = False
    b_kmajor: bool = True
    a_mmajor: bool = False  # A stored with M contiguous (transposed NVMMA layout)
    a_swizzle: int = -1  # -1: the default (widest) swizzle
    b_swizzle: int = -1
    instr_n: int = 0     # 0: min(n, 256)
    is_async: bool = False
    use_acc: bool = True  # add the loaded C to the product (else a runtime false predicate)
    warps_n: int = 1      # warps_per_cta = [4 * warpgroups / warps_n, warps_n]

    @property
    def num_warps(self) -> int:
        return 4 * self.warpgroups

    @property
    def name(self) -> str:
        return (f"wgmma_{self.element}_{'rs' if self.a_in_registers else 'ss'}_m{self.m}n{self.n}k{self.k}_"
                f"wg{self.warpgroups}{'_bk' if self.b_kmajor else '_bn'}{'_am' if self.a_mmajor else ''}")


def _load_layout(shape, num_warps):
    rows, cols = shape
    per = min(8, cols)
    lanes_c = min(32, cols // per)
    return blocked(shape, (1, per), (32 // lanes_c, lanes_c), (num_warps, 1), (1, 0))


def _nvmma(shape, bits, swizzle, transposed=False):
    if swizzle < 0:
        swizzle = default_nvmma_swizzle(shape, bits, transposed)
    return (nvmma_shared(shape, swizzle, bits, transposed),
            NVMMASharedLayout(swizzle, bits, 2, transposed))


def _load(kb, pointer, shape, element, layout, encoding=None):
    stride = kb.add(Constant, i32, value=shape[1])
    offsets, _ = _grid_offsets(kb, layout, shape[0], shape[1], stride)
    t = tensor(shape, element, layout)
    if encoding is not None:
        t = t.with_layout(layout, encoding)
    return kb.add(Load, t, pointer=kb.pointers(pointer, offsets)), offsets


def warpgroup_mma_dot(config: DotConfig):
    """The kernel and its parameters: a, b (or b^T), c, out, use_acc (i32)."""
    element = ScalarType(config.element)
    bits = element.bits
    m, n, k = config.m, config.n, config.k
    kb = KernelBuilder(config.name, num_warps=config.num_warps)
    a_ptr, b_ptr = kb.param(PointerType(element), "a"), kb.param(PointerType(element), "b")
    c_ptr, out_ptr = kb.param(PointerType(ScalarType(config.acc)), "c"), kb.param(PointerType(fp32), "out")
    flag = kb.param(i32, "use_acc")
    warps = (config.num_warps // config.warps_n, config.warps_n)
    instr_n = config.instr_n or min(n // config.warps_n, 256)
    acc_encoding = NVMMADistributedLayout((3, 0), warps, (16, instr_n, 256 // bits))
    acc_layout = wgmma_accumulator((m, n), warps, instr_n)
    acc_type = tensor((m, n), ScalarType(config.acc), acc_layout).with_layout(acc_layout, acc_encoding)
    load_a = _load_layout((m, k), config.num_warps)
    if config.a_in_registers:
        a_layout = dot_operand((m, k), warps, 0, 32 // bits, 3)
        a, _ = _load(kb, a_ptr, (m, k), element, a_layout, DotOperandLayout(0, acc_encoding, 32 // bits))
    else:
        values, _ = _load(kb, a_ptr, (m, k), element, load_a)
        layout, encoding = _nvmma((m, k), bits, config.a_swizzle, transposed=config.a_mmajor)
        a = kb.add(AllocateSharedMemory, SharedType((m, k), element, layout, encoding), "a_smem", init=values)
    if config.b_kmajor:
        values, _ = _load(kb, b_ptr, (n, k), element, _load_layout((n, k), config.num_warps))
        layout, encoding = _nvmma((n, k), bits, config.b_swizzle)
        stored = kb.add(AllocateSharedMemory, SharedType((n, k), element, layout, encoding), "bt_smem", init=values)
        view_layout, view_encoding = _nvmma((k, n), bits, encoding.swizzle_byte_width, transposed=True)
        b = kb.add(SharedPermute, SharedType((k, n), element, view_layout, view_encoding), "b_view",
                   buffer=stored, order=(1, 0))
    else:
        values, _ = _load(kb, b_ptr, (k, n), element, _load_layout((k, n), config.num_warps))
        layout, encoding = _nvmma((k, n), bits, config.b_swizzle)
        b = kb.add(AllocateSharedMemory, SharedType((k, n), element, layout, encoding), "b_smem", init=values)
    kb.add(FenceAsyncShared)
    c, offsets = _load(kb, c_ptr, (m, n), ScalarType(config.acc), acc_layout, acc_encoding)
    zero = kb.add(Constant, i32, value=0)
    use_acc = kb.add(Compare, i1, "use", predicate="ne", lhs=flag, rhs=zero)
    result = kb.add(WarpgroupMma, acc_type, "acc", a=a, b=b, acc=c, use_acc=None if config.use_acc else use_acc,
                    is_async=config.is_async)
    if config.is_async:
        waited = Value(acc_type, "waited")
        kb.regions[-1].append(WarpgroupMmaWait(results=(waited,), deps=(result,), pending=0))
        result = waited
    if config.acc != "fp32":
        result = kb.add(Cast, tensor((m, n), fp32, acc_layout), operand=result)
    kb.add(Store, pointer=kb.pointers(out_ptr, offsets), value=result)
    return kb.build(param_divisibility=(16, 16, 16, 16, 1))
