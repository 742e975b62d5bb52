"""What the frontend, the passes, the backend and the emulator agree on about atomics.

An atomic updates each element once per program, however many threads hold it. In a
distributed layout an element repeats where an index bit is free (its basis is in the
span of earlier bases, registers first: `LinearLayout.free_variable_masks`), and along
lane or warp bits the layout does not have at all. The replica whose free bits are all
clear (the lowest register, lane and warp holding the element) issues the atomic; the
others get its old value:

- from a register of their own thread, when only register bits repeat elements;
- through scratch shared memory otherwise (the issuing threads write the old value of
  each element at its row-major index, a barrier, every thread reads what it holds).
  A scalar is held by every thread, so it always goes through scratch (one element).

Outside warp_specialize partitions, a kernel with worker warps runs its code on those
warps too, as copies of the first num_warps (backend/lower_warp_specialize.py): they
never issue, so their copies of the old values come through scratch as well (`mirrored`).
"""

from __future__ import annotations

from ..layouts import LinearLayout
from .hardware import LANES
from .ir import ATOMIC_KINDS, MEMORY_SCOPES, MEMORY_SEMANTICS, AtomicCAS, AtomicRMW, Op
from .types import ScalarType, TensorType, Type

_INTS = ("i32", "u32", "i64", "u64")

# The element types each atomic supports (PTX atom/red: integer min/max are signed or
# unsigned by type; PTX has no float min/max atomics; add takes fp32 and fp64).
ELEMENT_TYPES = {
    "add": _INTS + ("fp32", "fp64"),
    "max": _INTS, "min": _INTS,
    "and": _INTS, "or": _INTS, "xor": _INTS, "xchg": _INTS,
    "cas": _INTS,
}
assert set(ELEMENT_TYPES) == set(ATOMIC_KINDS) | {"cas"}
SEMANTICS, SCOPES = MEMORY_SEMANTICS, MEMORY_SCOPES

LANE_BITS = LANES.bit_length() - 1  # bits of a lane index


def kind_of(op: Op) -> str:
    return "cas" if isinstance(op, AtomicCAS) else op.kind


def element_of(op: Op) -> ScalarType:
    """The pointee type the atomic updates."""
    pointer = op.pointer.type.element if isinstance(op.pointer.type, TensorType) else op.pointer.type
    return pointer.pointee


def replica_masks(layout: LinearLayout, num_warps: int) -> dict[str, int]:
    """Per in-dim (register, lane, warp, block), the index bits whose threads or registers
    hold copies of elements held where those bits are clear: the layout's free bits, and
    the lane and warp bits of a CTA of `num_warps` that the layout has no bases for."""
    masks = dict(layout.free_variable_masks())
    warp_bits = max(num_warps.bit_length() - 1, 0)
    for dim, bits in (("lane", LANE_BITS), ("warp", warp_bits)):
        have = len(layout.bases.get(dim, ()))
        masks[dim] = masks.get(dim, 0) | (((1 << bits) - 1) & ~((1 << have) - 1))
    for dim in ("register", "block"):
        masks.setdefault(dim, 0)
    return masks


def replicated_across_threads(type_: Type, num_warps: int) -> bool:
    """Whether some element (or the scalar) is held by more than one thread."""
    if not isinstance(type_, TensorType):
        return True
    masks = replica_masks(type_.layout, num_warps)
    return bool(masks["lane"] or masks["warp"] or masks["block"])


def owner_registers(layout: LinearLayout) -> tuple[int, ...]:
    """For each register, the register of the same thread that issues its element's
    atomic (itself when it is not a repeat)."""
    duplicates = layout.free_variable_masks().get("register", 0)
    rows = layout.bases.get("register", ())
    owners, first = [], {}
    for register in range(1 << len(rows)):
        element = tuple(0 for _ in layout.out_dims)
        for bit, basis in enumerate(rows):
            if register >> bit & 1:
                element = tuple(a ^ b for a, b in zip(element, basis))
        if not register & duplicates:
            first[element] = register
        owners.append(first[element])  # registers with free bits come after their owner
    return tuple(owners)


def needs_scratch(op: Op, num_warps: int, mirrored: bool = False) -> bool:
    """Whether the op's old values reach some holder only through shared memory."""
    if not isinstance(op, (AtomicRMW, AtomicCAS)) or op.result is None:
        return False
    return mirrored or replicated_across_threads(op.result.type, num_warps)


def scratch_bytes(op: Op) -> int:
    """Bytes of the scratch the old values pass through: one slot per element."""
    count = op.result.type.num_elements if isinstance(op.result.type, TensorType) else 1
    return count * element_of(op).bits // 8


def flat_offsets(layout: LinearLayout) -> LinearLayout:
    """(register, lane, warp) -> the row-major index of the element held there (the
    scratch slot of its old value)."""
    names = layout.out_dim_names
    flat = 1
    for size in layout.out_dims.values():
        flat *= size
    return layout.transpose_outs(tuple(reversed(names))).reshape_outs([("offset", flat)])

