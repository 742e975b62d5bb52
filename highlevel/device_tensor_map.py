"""`tl.make_tensor_descriptor` over a base or shape known only on the device (a pointer
loaded from a table, a size read from memory): the kernel writes the tensor map itself.

Each call site gets a 128-byte slot per program in a global workspace the launch provides
(runtime/made_tensor_descriptor.py: the launcher allocates it and keeps it between
launches; the emulator models it), and a template map the host encodes once from the
call's element type and box. At the call, one thread copies the template into the slot
and replaces its global address, dims and strides; a fence publishes it to the TMA unit
before the loads and stores through it (lowlevel tma.replace_tensor_map and
fence_tensor_map, PTX ISA tensormap.replace). The slot is rewritten each time the call
runs, so a descriptor made in a loop describes that iteration's tensor.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..compiler import ir
from ..compiler.hardware import TENSOR_MAP_BYTES, TMA_GLOBAL_ALIGN
from ..compiler.types import PointerType, ScalarType, TensorDescriptorType
from ..lowlevel import builtins as ll_builtins, tma
from ..lowlevel import semantic as ll_sem
from ..runtime import made_tensor_descriptor as made
from . import semantic as sem


def device_tensor_map(base: Any, shape: Sequence[Any], strides: Sequence[Any], type_: TensorDescriptorType,
                      check_alignment: bool = True):
    """A descriptor over `base` with run-time `shape` and `strides`, written in the kernel;
    `check_alignment` False where the caller proves the alignment TMA needs itself (block
    pointers: stage_block_pointers keeps the pointer load when it cannot)."""
    b = sem.builder()
    if not b.kernel_params:
        raise b.error("make_tensor_descriptor on a pointer computed in the kernel needs a kernel with "
                      "parameters (the launch passes the tensor map workspace after them)")
    anchor = next(iter(b.kernel_params))
    site = sum(1 for key in b.hidden_params if key[1] == made.TEMPLATE_FIELD)
    template = b.hidden_params[anchor, made.TEMPLATE_FIELD, site] = ir.Value(type_, f"tensor_map_template{site}")
    workspace_key = (anchor, made.WORKSPACE_FIELD, 0)
    if workspace_key not in b.hidden_params:
        b.hidden_params[workspace_key] = ir.Value(PointerType(ScalarType("u8")), "tensor_map_workspace")
    workspace = b.wrap(b.hidden_params[workspace_key])
    if check_alignment:
        _check_alignment(base, strides, type_)
    program, programs = _linear_program()
    slot = workspace + (programs * site + program) * TENSOR_MAP_BYTES
    desc = tma.replace_tensor_map.__wrapped__(slot, tma.TensorDescriptorValue(template), base, shape, strides)
    tma.fence_tensor_map.__wrapped__(desc)
    return desc


def _check_alignment(base: Any, strides: Sequence[Any], type_: TensorDescriptorType) -> None:
    """The TMA unit faults on a map whose base is not 16-byte aligned or whose outer strides
    are not multiples of 16 bytes: refuse constant strides now, and check the rest on the
    device, where a failed check names this line (the emulator reports it there too)."""
    b = sem.builder()
    itemsize = type_.element.bits // 8
    problem = (f"make_tensor_descriptor: the base must be {TMA_GLOBAL_ALIGN}-byte aligned and strides[:-1] "
               f"multiples of {TMA_GLOBAL_ALIGN} bytes ({TMA_GLOBAL_ALIGN // itemsize} elements of {type_.element})")
    i64 = ScalarType("i64")
    aligned = ll_sem.cast(ll_sem.to_value(base), i64) % TMA_GLOBAL_ALIGN == 0
    for d, stride in enumerate(strides[:-1]):
        if isinstance(stride, int):
            if stride * itemsize % TMA_GLOBAL_ALIGN:
                raise b.error(f"{problem}; strides[{d}] is {stride}")
            continue
        aligned = aligned & (ll_sem.cast(stride, i64) * itemsize % TMA_GLOBAL_ALIGN == 0)
    ll_builtins.device_assert.__wrapped__(aligned, problem)


def _linear_program():
    """(this program's index in the grid, x fastest; the grid's size), as i64 scalars."""
    i64 = ScalarType("i64")
    index, size = None, None
    for axis in range(3):
        pid = ll_sem.cast(ll_builtins.program_id.__wrapped__(axis), i64)
        extent = ll_sem.cast(ll_builtins.num_programs.__wrapped__(axis), i64)
        index = pid if index is None else index + pid * size
        size = extent if size is None else size * extent
    return index, size
