"""What the compiler hands to the runtime: one compiled kernel and its parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

# Parameter kinds as Triton spells them in signatures: "*fp32" is a pointer to fp32,
# "i32" a 32-bit integer, "fp32" a float. Scalars go to the kernel by value; pointers as
# 64-bit global addresses.
SCALAR_TYPES = ("i1", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64",
                "fp16", "bf16", "fp32", "fp64", "fp8e4m3", "fp8e5m2")


@dataclass(frozen=True)
class Param:
    """One kernel parameter as passed at launch (constexprs are not parameters).

    `hidden`: for a parameter the caller does not pass, (descriptor parameter, field,
    dim) it is read from at launch: a kernel that reads `desc.shape[d]` (or
    `desc.strides[d]`) of a tensor descriptor argument takes it as an extra scalar after
    the caller's parameters, filled in by the launcher and the emulator. A tensor map the
    kernel makes from its arguments is (base pointer parameter, "tensor_map", recipe)
    (runtime/made_tensor_descriptor.py)."""

    name: str
    type: str  # a signature string: "*fp32", "i32", "fp32", ...
    hidden: Optional[tuple[str, str, Union[int, str]]] = None

    @property
    def is_pointer(self) -> bool:
        return self.type.startswith("*")

    @property
    def element(self) -> str:
        return self.type.lstrip("*")


@dataclass
class CompiledKernel:
    """A kernel compiled for one signature: every stage's text plus launch facts.

    `asm` maps a stage name (source, layout, llir, ptx, cubin) to its text (bytes for the
    cubin). `metadata` holds num_warps, total_warps, shared (bytes of shared memory,
    static + dynamic), and, when ptxas ran, registers, spills and its report.
    `total_warps` is what the CTA launches with: num_warps plus the warp_specialize
    workers' warps (0: num_warps, for kernels compiled before it existed).
    """

    name: str
    params: tuple[Param, ...]
    num_warps: int
    shared: int
    asm: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    cluster: Optional[tuple[int, int, int]] = None
    total_warps: int = 0

    @property
    def num_threads(self) -> int:
        """Threads per CTA at launch."""
        return 32 * (self.total_warps or self.num_warps)

    @property
    def binary(self) -> tuple[str, bytes]:
        """("cubin", bytes) when ptxas ran, else ("ptx", bytes) for the driver's JIT."""
        if self.asm.get("cubin"):
            return "cubin", self.asm["cubin"]
        return "ptx", self.asm["ptx"].encode()


def hidden_params(kernel) -> tuple[Param, ...]:
    """The parameters a kernel (ir.Kernel) reads from its descriptor arguments, in the order
    they follow the caller's parameters."""
    count = len(kernel.hidden_params)
    values = kernel.params[len(kernel.params) - count:] if count else ()
    return tuple(Param(value.hint, _signature(value.type), source)
                 for value, source in zip(values, kernel.hidden_params))


def _signature(type_) -> str:
    """A hidden parameter's signature string (a tensor map a kernel makes is a descriptor)."""
    from .types import TensorDescriptorType, tensor_descriptor_signature, tensor_descriptor_swizzle

    if isinstance(type_, TensorDescriptorType):
        return tensor_descriptor_signature(type_.element, type_.block_shape, tensor_descriptor_swizzle(type_))
    return str(type_)
