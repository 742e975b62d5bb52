"""TMA descriptors on the emulator: a host `TensorDescriptor` argument bound to its tensor.

`runtime/tensor_descriptor.py` builds descriptors over host arrays without encoding a
tensor map; the emulator registers the descriptor's `.base` in global memory like a
pointer argument and keeps the rest (global shape, strides in elements, box). A TMA copy
then moves the box at element coordinates (outermost dim first) through ordinary
global-memory accesses: out-of-range box elements load as zeros and are not stored, as
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...compiler.types import TensorDescriptorType, tensor_descriptor_swizzle
from .dtypes import element_bytes
from .. import made_tensor_descriptor as made
from .errors import EmulationError
from .memory import GlobalMemory

# Shared-memory alignment a TMA box needs: the swizzle pattern repeats every 8 rows of
# the swizzle width and is taken from the address bits (PTX ISA, tensor copy swizzling).
SWIZZLE_ALIGNMENT = {0: 128, 32: 256, 64: 512, 128: 1024}


@dataclass(frozen=True)
class EmulatedDescriptor:
    """A bound TMA descriptor: the tensor's virtual address, shape and element strides."""

    name: str
    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    type: TensorDescriptorType
    swizzle: int

    def box(self, coords) -> tuple[np.ndarray, np.ndarray]:
        """(byte addresses, in-bounds mask), each of the box's shape, of the box at `coords`."""
        block = self.type.block_shape
        grids = np.meshgrid(*(np.arange(b) for b in block), indexing="ij")
        size = element_bytes(self.type.element)
        offsets = np.zeros(block, np.int64)
        inside = np.ones(block, bool)
        for grid, start, extent, stride in zip(grids, coords, self.shape, self.strides):
            index = grid + int(start)
            inside &= (index >= 0) & (index < extent)
            offsets += index * stride
        return self.address + offsets * size, inside

    def describe(self) -> str:
        return (f"descriptor `{self.name}` ({self.type.element}, shape {list(self.shape)}, box "
                f"{list(self.type.block_shape)})")


def swizzle_of(type_: TensorDescriptorType) -> int:
    """The TMA swizzle (bytes) that places a box as `type_.layout`; 0 when none does."""
    try:
        return tensor_descriptor_swizzle(type_)
    except ValueError:
        return 0


def bind_descriptor(arg, type_: TensorDescriptorType, name: str, memory: GlobalMemory,
                    host_array) -> EmulatedDescriptor:
    """Register a host descriptor's tensor in `memory` and check it fits the kernel's type."""
    base = getattr(arg, "base", None)
    if base is None or not hasattr(arg, "shape") or not hasattr(arg, "strides"):
        raise EmulationError(f"argument `{name}` is a {type(arg).__name__}; the kernel expects a "
                             f"tensor descriptor {type_} (ll.TensorDescriptor.from_tensor)")
    block_shape = tuple(int(b) for b in getattr(arg, "block_shape", type_.block_shape))
    if block_shape != tuple(type_.block_shape):
        raise EmulationError(f"argument `{name}` has box {list(block_shape)} but the kernel was "
                             f"compiled for {type_}")
    arg_type = getattr(arg, "type", None)
    # numpy has no bf16 or fp8: a host array of unsigned ints of the same width holds
    # their bit patterns, and a descriptor over it may feed a kernel compiled for them.
    bit_patterns = isinstance(arg_type, TensorDescriptorType) and arg_type.element.name.startswith("u") \
        and arg_type.element.bits == type_.element.bits and type_.element.is_float
    if isinstance(arg_type, TensorDescriptorType) and (
            (arg_type.element != type_.element and not bit_patterns) or arg_type.layout != type_.layout):
        raise EmulationError(f"argument `{name}` is a {arg_type} descriptor but the kernel was "
                             f"compiled for {type_}")
    shape = tuple(int(s) for s in arg.shape)
    strides = tuple(int(s) for s in arg.strides)
    if len(shape) != type_.rank or len(strides) != type_.rank:
        raise EmulationError(f"argument `{name}` describes a {len(shape)}-D tensor but the box "
                             f"{list(type_.block_shape)} is {type_.rank}-D")
    array = host_array(base)
    address = memory.add(name, array, type_.element)
    swizzle = getattr(arg, "swizzle", None)
    return EmulatedDescriptor(name, int(address), shape, strides, type_,
                              swizzle_of(type_) if swizzle is None else int(swizzle))


def hidden_arguments(kernel, args, grid) -> tuple:
    """The values of a kernel's hidden parameters (`desc.shape[d]`, `desc.strides[d]`, read
    from its descriptor arguments; the tensor map workspace and templates of maps the
    kernel writes; ir.Kernel.hidden_params), to follow `args`."""
    position = {p.hint: i for i, p in enumerate(kernel.params)}
    values = []
    hidden_types = kernel.params[len(kernel.params) - len(kernel.hidden_params):]
    for (name, field, dim), param in zip(kernel.hidden_params, hidden_types):
        arg = args[position[name]]
        if field == made.WORKSPACE_FIELD:
            sites = sum(1 for key in kernel.hidden_params if key[1] == made.TEMPLATE_FIELD)
            values.append(np.zeros(made.workspace_bytes(sites, grid), np.uint8))
            continue
        if field == made.TEMPLATE_FIELD:
            from ...compiler.compiled import hidden_params
            values.append(made.template_descriptor(hidden_params(kernel)[len(values)].type))
            continue
        if field == made.FIELD:  # a tensor map the kernel makes from its arguments
            values.append(made.host_descriptor(arg, dim, param.type.block_shape, lambda n: args[position[n]]))
            continue
        if not hasattr(arg, field):
            raise EmulationError(f"argument `{name}` is a {type(arg).__name__}; the kernel reads its "
                                 f"`.{field}` as a tensor descriptor's (ll.TensorDescriptor.from_tensor)")
        values.append(int(getattr(arg, field)[dim]))
    return tuple(values)
