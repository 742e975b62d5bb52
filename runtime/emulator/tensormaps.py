"""Emulation rules: tensor maps a kernel writes in global memory (TensormapReplace) and
publishes to the TMA unit (TensormapFence).

A map is modelled as a value at its slot's address (GlobalMemory.tensor_maps), not as
bytes: the template's element type, box and swizzle with the address, dims and strides
the kernel gave. A TMA copy through a slot reads that value, and only once a fence has
published it since it was last written: on the GPU the TMA unit reads maps through the
tensormap proxy, which may still see the old bytes, so a read without the fence is a race
(PTX ISA, fence.proxy.tensormap::generic). The checks the hardware makes of a map (base
16-byte aligned, strides multiples of 16 bytes) are made here when it is written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...compiler import ir
from ...compiler.hardware import TENSOR_MAP_ALIGN, TENSOR_MAP_BYTES, TMA_GLOBAL_ALIGN
from ...compiler.types import ScalarType
from .descriptors import EmulatedDescriptor
from .dtypes import element_bytes
from .errors import EmulationError
from .memory import ADDRESS_SHIFT
from .rules import EMULATION_RULES as RULES



@dataclass
class WrittenTensorMap:
    descriptor: EmulatedDescriptor
    written_at: object  # the TensormapReplace's loc
    published: bool = False


def _slot(cta, op, value: ir.Value) -> int:
    slot = int(cta[value])
    if slot % TENSOR_MAP_ALIGN:
        raise EmulationError(f"`{op.NAME}`: the tensor map slot at {slot:#x} is not {TENSOR_MAP_ALIGN}-byte "
                             "aligned", op.loc)
    words = slot + np.arange(TENSOR_MAP_BYTES // 8, dtype=np.int64) * 8
    cta.memory.host_addresses(words, ScalarType("i64"), None, op.loc, lambda position: "tensor map slot")
    return slot


@RULES.register(ir.TensormapReplace)
def tensormap_replace(cta, op: ir.TensormapReplace) -> None:
    template = cta[op.template]
    if not isinstance(template, EmulatedDescriptor):
        raise EmulationError(f"`{op.NAME}` needs a template tensor descriptor, found {template!r}", op.loc)
    slot = _slot(cta, op, op.slot)
    address = int(cta[op.address])
    shape = tuple(int(cta[v]) for v in op.shape)
    strides = tuple(int(cta[v]) for v in op.strides)
    size = element_bytes(template.type.element)
    if not _inside_a_buffer(cta.memory, address):
        raise EmulationError(f"a tensor map over {address:#x}, which is inside no array of this launch; if it "
                             "is a host address read from a table, launch inside emulator.reachable(arrays the "
                             "table points into)", op.loc)
    problems = []
    if address % TMA_GLOBAL_ALIGN:
        problems.append(f"its base {address:#x} is not {TMA_GLOBAL_ALIGN}-byte aligned")
    if strides[-1] != 1:
        problems.append(f"its innermost stride is {strides[-1]}, not 1")
    problems += [f"strides[{d}] = {s} elements ({s * size} bytes) is not a multiple of {TMA_GLOBAL_ALIGN} bytes"
                 for d, s in enumerate(strides[:-1]) if (s * size) % TMA_GLOBAL_ALIGN or s <= 0]
    problems += [f"shape[{d}] = {n} is not in [1, 2**32)" for d, n in enumerate(shape) if not 0 < n < 1 << 32]
    if problems:
        raise EmulationError(f"a tensor map of shape {list(shape)} and strides {list(strides)} (elements of "
                             f"{template.type.element}): {'; '.join(problems)}; the TMA unit faults on such a map",
                             op.loc)
    descriptor = EmulatedDescriptor(f"made at {op.loc}" if op.loc else f"at {slot:#x}", address, shape, strides,
                                    template.type, template.swizzle)
    cta.memory.tensor_maps[slot] = WrittenTensorMap(descriptor, op.loc)
    cta.bind(op.result, np.int64(slot))


def _inside_a_buffer(memory, address: int) -> bool:
    index = ((address + (1 << (ADDRESS_SHIFT - 1))) >> ADDRESS_SHIFT) - 1
    if not 0 <= index < len(memory.buffers):
        return False
    buffer = memory.buffers[index]
    return 0 <= address - int(memory.base_address(index)) + buffer.origin < len(buffer.raw)


@RULES.register(ir.TensormapFence)
def tensormap_fence(cta, op: ir.TensormapFence) -> None:
    slot = int(cta[op.descriptor])
    written = cta.memory.tensor_maps.get(slot)
    if written is None:
        raise EmulationError(f"`{op.NAME}`: no tensor map was written at {slot:#x}", op.loc)
    written.published = True


def published_tensor_map(cta, slot: int, op) -> EmulatedDescriptor:
    """The map a TMA copy reads at `slot`, or a race report if it was not published."""
    written = cta.memory.tensor_maps.get(slot)
    if written is None:
        raise EmulationError(f"`{op.NAME}` through {slot:#x}, where no tensor map was written", op.loc)
    if not written.published:
        raise EmulationError(f"race: `{op.NAME}` reads a tensor map written by tensormap.replace with no "
                             "tensormap fence since (fence.proxy.tensormap::generic): the TMA unit may still "
                             "read the old map", op.loc, other_loc=written.written_at,
                             other_what="tensor map written")
    return written.descriptor
