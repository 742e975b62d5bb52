"""A whole kernel: the LLVM module, the entry function and its shared memory.

The function uses the `ptx_kernel` calling convention (a `.entry`) with the attribute
`"nvvm.maxntid"` = 32 * total_warps (num_warps plus warp_specialize workers), so ptxas
knows the block size (`.maxntid`), and `"nvvm.maxnreg"` when setmaxnreg budgets need a
register cap at entry (lower_warp_specialize) or the launch option maxnreg sets one. Pointer
parameters are `ptr addrspace(1)` (global memory), scalars are passed by value.

A TMA descriptor parameter (`TensorDescriptorType`) is the 128-byte CUtensorMap passed by
value: `ptr byval([128 x i8]) align 64 "nvvm.grid_constant"`, which NVPTX emits as
`.param .align 64 .b8 name[128]`. Marking it grid-constant (CUDA's `__grid_constant__`;
LLVM 21+ spells it as this parameter attribute) lets the kernel take its address without
a copy to local memory: the address is `cvta.param` of the parameter, a generic address
of the param-space object, as TMA instructions require (PTX ISA, "Tensor-map": the map
may live in .param space, used through its generic address). The value rules get from
`ctx.get(descriptor_param)` is that address as an **i64**, ready for an inline-PTX `l`
operand: `cp.async.bulk.tensor... [smem], [$desc, {x, y}], [mbar]`, `prefetch.tensormap
[$desc]`. It is computed once in the entry block.

Shared memory is one byte array, `weft_shared`, aligned to 1024 bytes (the 128-byte
swizzle atom's alignment): a static `.shared` array of `kernel.shared_bytes` when that is
at most 48 KB, else an `.extern .shared` array whose size the launch passes as dynamic
shared memory (after raising the function's dynamic-smem limit).
"""

from __future__ import annotations

from typing import Optional

from llvmlite import ir
from llvmlite.ir.values import ArgumentAttributes, FunctionAttributes

from ..errors import CompilationError
from ..hardware import STATIC_SHARED_LIMIT, TENSOR_MAP_ALIGN, TENSOR_MAP_BYTES
from ..ir import Kernel
from ..types import PointerType, TensorDescriptorType
from . import llvm_types as T
from .context import DEFAULT_RULES, Lowering
from .lower_warp_specialize import entry_register_cap
from .target import TRIPLE, data_layout

SHARED_ALIGN = 1024
SHARED_SYMBOL = "weft_shared"


def uses_dynamic_shared_memory(kernel: Kernel) -> bool:
    """True when the launch must pass `kernel.shared_bytes` as dynamic shared memory."""
    return kernel.shared_bytes > STATIC_SHARED_LIMIT


def static_shared_bytes(kernel: Kernel) -> int:
    """Bytes of shared memory declared statically in the PTX (the rest is dynamic):
    `CompiledKernel.metadata["static_shared"]`, which the launcher subtracts."""
    return 0 if uses_dynamic_shared_memory(kernel) else kernel.shared_bytes


TENSOR_MAP = ir.ArrayType(T.I8, TENSOR_MAP_BYTES)


class _ByValueAttributes(ArgumentAttributes):
    """`byval(<type>)` plus string attributes on an opaque-pointer argument (llvmlite
    only spells `byval` for typed pointers, which LLVM 22 no longer parses)."""

    def __init__(self, pointee: ir.Type, strings: tuple[str, ...]):
        super().__init__()
        self._pointee, self._strings = pointee, strings

    def _to_list(self, typ):
        return [f"byval({self._pointee})", *(f'"{s}"' for s in self._strings),
                *super()._to_list(typ)]


class _KernelAttributes(FunctionAttributes):
    """llvmlite's function attributes plus string attributes such as "nvvm.maxntid"="128"."""

    def __init__(self, strings: dict[str, str]):
        self._known = FunctionAttributes._known | {f'"{k}"="{v}"' for k, v in strings.items()}
        super().__init__(sorted(self._known - FunctionAttributes._known))


def _shared_memory(module: ir.Module, kernel: Kernel) -> Optional[ir.GlobalVariable]:
    if kernel.shared_bytes <= 0:
        return None
    if uses_dynamic_shared_memory(kernel):
        variable = ir.GlobalVariable(module, ir.ArrayType(T.I8, 0), SHARED_SYMBOL, addrspace=T.SHARED)
        variable.linkage = "external"
    else:
        array = ir.ArrayType(T.I8, kernel.shared_bytes)
        variable = ir.GlobalVariable(module, array, SHARED_SYMBOL, addrspace=T.SHARED)
        variable.linkage = "internal"
        variable.initializer = ir.Constant(array, ir.Undefined)
    variable.align = SHARED_ALIGN
    variable.type = T.SHARED_PTR  # refer to it as an opaque pointer (llvmlite types it)
    return variable


def _parameter_type(value) -> ir.Type:
    if isinstance(value.type, PointerType):
        return T.GLOBAL_PTR
    if isinstance(value.type, TensorDescriptorType):
        return T.GENERIC_PTR
    try:
        return T.element_type(value.type)
    except (KeyError, AttributeError):
        raise CompilationError(f"kernel parameter {value!r} has type {value.type}, which cannot be "
                               "passed to a kernel (pointers, scalars and TMA descriptors only)") from None


def lower_to_llvm(kernel: Kernel, rules: Optional[dict] = None) -> str:
    """The kernel (at the `layout` stage) as LLVM IR text for the NVPTX target."""
    if kernel.num_warps < 1 or kernel.total_warps > 32:
        raise CompilationError(f"num_warps must be 1..32 (with warp_specialize workers), got "
                               f"{kernel.num_warps} ({kernel.total_warps} in all)")
    module = ir.Module(name=kernel.name)
    module.triple = TRIPLE
    module.data_layout = data_layout()
    function_type = ir.FunctionType(ir.VoidType(), [_parameter_type(p) for p in kernel.params])
    function = ir.Function(module, function_type, kernel.name)
    function.calling_convention = "ptx_kernel"
    launch = {"nvvm.maxntid": str(32 * kernel.total_warps)}
    register_cap = entry_register_cap(kernel)  # setmaxnreg needs a cap at entry
    if register_cap is None:
        register_cap = kernel.max_registers  # the launch option maxnreg
    if register_cap is not None:
        launch["nvvm.maxnreg"] = str(register_cap)
    function.attributes = _KernelAttributes(launch)
    divisibility = getattr(kernel, "param_divisibility", None) or ()
    for argument, param, divisor in zip(function.args, kernel.params, tuple(divisibility) + (0,) * len(kernel.params)):
        argument.name = param.hint or f"arg{param.id}"
        if isinstance(param.type, PointerType):
            argument.add_attribute("noundef")
            if divisor and divisor & (divisor - 1) == 0 and divisor > 1:
                argument.attributes.align = min(divisor, 1 << 12)
        elif isinstance(param.type, TensorDescriptorType):
            argument.attributes = _ByValueAttributes(TENSOR_MAP, ("nvvm.grid_constant",))
            argument.attributes.align = TENSOR_MAP_ALIGN
    ctx = Lowering(kernel, module, function, DEFAULT_RULES if rules is None else rules,
                   _shared_memory(module, kernel))
    for param, argument in zip(kernel.params, function.args):
        if isinstance(param.type, TensorDescriptorType):
            ctx.define(param, ctx.prologue.ptrtoint(argument, T.I64, name=f"{argument.name}.addr"))
        else:
            ctx.define(param, argument)
    ctx.lower_block(kernel.body)
    ctx.builder.ret_void()
    return str(module)
