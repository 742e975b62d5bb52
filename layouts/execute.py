"""Thread-faithful numpy execution of layouts and conversion plans.

Registers of a distributed tensor are held as one array `regs` of shape
(blocks, warps, lanes, registers): `regs[b, w, l, r]` is register r of lane l of warp w of
CTA b, i.e. the element at `layout(register=r, lane=l, warp=w, block=b)`. Layouts without a
`block` (or `warp`) in-dim have a size-1 axis there.

`execute_plan` runs a plan the way the GPU would: register renaming, shuffle rounds lane by
lane (each lane offers one register, each lane reads one lane), a per-CTA scratch buffer
indexed through the plan's store/load maps with one barrier between the stores and the
loads of an iteration. It never looks at tensor coordinates, so a wrong plan gives wrong
registers; it also checks what hardware would silently get wrong (two lanes storing
different values to one address, a load from an address not stored this iteration, a
misaligned vector, a dst register nobody wrote) and raises LayoutError.

Example::

    regs = distribute(np.arange(64).reshape(8, 8), src)
    out = execute_plan(plan_conversion(src, dst, 32), regs, src, dst)
    assert (out == distribute(np.arange(64).reshape(8, 8), dst)).all()
"""

from __future__ import annotations

import re

import numpy as np

from .conversion import normalize, normalize_pair
from .errors import LayoutError
from .linear_layout import LinearLayout
from .plans import NoOp, Plan, RegisterPermutation, SharedRoundTrip, WarpShuffle, linear_table


def tensor_axes(layout: LinearLayout) -> tuple[str, ...]:
    """Out-dims in tensor axis order: dim0, dim1, ... by number; other names in layout order."""
    names = layout.out_dim_names
    if all(re.fullmatch(r"dim\d+", n) for n in names):
        return tuple(sorted(names, key=lambda n: int(n[3:])))
    return names


def _grid(layout: LinearLayout) -> tuple[LinearLayout, tuple[int, ...]]:
    normalized = normalize(layout, tensor_axes(layout), "layout")
    sizes = tuple(normalized.in_dim_size(d) for d in ("block", "warp", "lane", "register"))
    return normalized, sizes


def _coordinates(normalized: LinearLayout, sizes) -> tuple[np.ndarray, ...]:
    block, warp, lane, register = (
        np.arange(n).reshape([-1 if i == axis else 1 for i in range(4)]) for axis, n in enumerate(sizes)
    )
    coords = normalized(register=register, lane=lane, warp=warp, block=block)
    return tuple(np.broadcast_to(c, sizes) for c in coords)


def distribute(tensor: np.ndarray, layout: LinearLayout) -> np.ndarray:
    """Per-thread registers (blocks, warps, lanes, registers) of `tensor` held in `layout`."""
    normalized, sizes = _grid(layout)
    tensor = np.asarray(tensor)
    shape = tuple(normalized.out_dims[n] for n in normalized.out_dim_names)
    if tensor.shape != shape:
        raise LayoutError(f"tensor of shape {tensor.shape} does not match the layout's out-dims {layout.out_dims}")
    return tensor[_coordinates(normalized, sizes)]


def collect(regs: np.ndarray, layout: LinearLayout) -> np.ndarray:
    """The tensor held by `regs` in `layout`; LayoutError if copies of an element disagree
    or an element is held by no thread."""
    normalized, sizes = _grid(layout)
    if regs.shape != sizes:
        raise LayoutError(f"registers of shape {regs.shape} do not match the layout's (blocks, warps, lanes, registers) {sizes}")
    shape = tuple(normalized.out_dims[n] for n in normalized.out_dim_names)
    flat = np.ravel_multi_index(_coordinates(normalized, sizes), shape)
    tensor = np.empty(int(np.prod(shape)), dtype=regs.dtype)
    tensor[flat] = regs
    if not np.all(_same(tensor[flat], regs)):
        raise LayoutError(f"copies of one element disagree in registers of layout {normalized.in_dims}")
    missing = np.bincount(flat.ravel(), minlength=tensor.size) == 0
    if missing.any():
        first = np.unravel_index(int(np.flatnonzero(missing)[0]), shape)
        raise LayoutError(f"layout {normalized.in_dims} -> {layout.out_dims} holds no copy of element {first}")
    return tensor.reshape(shape)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    equal = a == b
    if np.issubdtype(a.dtype, np.floating):
        equal |= np.isnan(a) & np.isnan(b)
    return equal


def execute_plan(plan: Plan, regs: np.ndarray, src: LinearLayout, dst: LinearLayout) -> np.ndarray:
    """Run `plan` on src registers `regs`; returns dst registers (blocks, warps, lanes, registers)."""
    src_n, dst_n = normalize_pair(src, dst)
    sizes = tuple(src_n.in_dim_size(d) for d in ("block", "warp", "lane", "register"))
    if regs.shape != sizes:
        raise LayoutError(f"registers of shape {regs.shape} do not match src's (blocks, warps, lanes, registers) {sizes}")
    dst_registers = dst_n.in_dim_size("register")
    if isinstance(plan, NoOp):
        return regs.copy()
    if isinstance(plan, RegisterPermutation):
        if len(plan.source_register) != dst_registers:
            raise LayoutError(f"plan has {len(plan.source_register)} registers, dst has {dst_registers}")
        return regs[..., np.asarray(plan.source_register, dtype=np.int64)]
    if isinstance(plan, WarpShuffle):
        return _run_shuffle(plan, regs, dst_registers)
    if isinstance(plan, SharedRoundTrip):
        return _run_shared(plan, regs, dst_registers)
    raise LayoutError(f"not a conversion plan: {type(plan).__name__}")


def _fill_copies(out, written, copies) -> None:
    for register, original in copies:
        out[..., register] = out[..., original]
        written[..., register] = written[..., original]


def _run_shuffle(plan: WarpShuffle, regs: np.ndarray, dst_registers: int) -> np.ndarray:
    blocks, warps, lanes, _ = regs.shape
    out = np.zeros((blocks, warps, lanes, dst_registers), dtype=regs.dtype)
    written = np.zeros((lanes, dst_registers), dtype=bool)
    register_xor = (
        linear_table(list(plan.block_register_xor))[:, None] ^ linear_table(list(plan.warp_register_xor))[None, :]
    )[:, :, None]
    block_index = np.arange(blocks)[:, None, None]
    warp_index = np.arange(warps)[None, :, None]
    lane_index = np.arange(lanes)

    def write(lane_ids, dst_ids, values):
        if written[lane_ids, dst_ids].any():
            raise LayoutError("plan writes a dst register twice")
        written[lane_ids, dst_ids] = True
        out[:, :, lane_ids, dst_ids] = values

    local = np.asarray(plan.local_register, dtype=np.int64)
    if local.shape != (lanes, dst_registers):
        raise LayoutError(f"local_register table is {local.shape}, expected {(lanes, dst_registers)}")
    lane_ids, dst_ids = np.nonzero(local >= 0)
    write(lane_ids, dst_ids, regs[block_index, warp_index, lane_ids[None, None, :], local[lane_ids, dst_ids] ^ register_xor])

    for round_ in plan.rounds:
        source_lane = np.asarray(round_.source_lane, dtype=np.int64)
        for send, receive in zip(round_.send_register, round_.receive_register):
            send, receive = np.asarray(send, dtype=np.int64), np.asarray(receive, dtype=np.int64)
            readers = receive >= 0
            if (send[source_lane[readers]] < 0).any():
                raise LayoutError("a lane reads a shuffle value that its source lane does not offer")
            offered = regs[block_index, warp_index, lane_index[None, None, :], np.maximum(send, 0) ^ register_xor]
            received = offered[:, :, source_lane]
            write(lane_index[readers], receive[readers], received[:, :, readers])
    _fill_copies(out, written, plan.register_copies)
    if not written.all():
        raise LayoutError("plan leaves some dst registers unwritten")
    return out


def _positions(mapping: LinearLayout, registers: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """(offset, repetition) of the given registers for every (block, warp, lane)."""
    blocks, warps, lanes = shape
    offset, repetition, _ = mapping(
        register=registers[None, None, None, :],
        lane=np.arange(lanes)[None, None, :, None],
        warp=np.arange(warps)[None, :, None, None],
        block=np.arange(blocks)[:, None, None, None],
    )
    full = (blocks, warps, lanes, len(registers))
    return np.broadcast_to(offset, full), np.broadcast_to(repetition, full)


def _vector_positions(mapping, groups, iteration, vector, shape):
    registers = np.asarray(groups, dtype=np.int64).reshape(-1)
    offset, repetition = _positions(mapping, registers, shape)
    if (repetition != iteration).any():
        raise LayoutError(f"a register of iteration {iteration} maps to another repetition")
    lanes = offset.reshape(offset.shape[:3] + (-1, vector))
    if (lanes[..., :1] % vector).any() or (lanes != lanes[..., :1] + np.arange(vector)).any():
        raise LayoutError(f"a {vector}-element access is not consecutive and aligned in the scratch")
    return registers, offset


def _run_shared(plan: SharedRoundTrip, regs: np.ndarray, dst_registers: int) -> np.ndarray:
    blocks, warps, lanes, _ = regs.shape
    shape = (blocks, warps, lanes)
    scratch = np.zeros((blocks, plan.scratch_elements), dtype=regs.dtype)
    out = np.zeros(shape + (dst_registers,), dtype=regs.dtype)
    written = np.zeros(dst_registers, dtype=bool)
    block_index = np.arange(blocks)[:, None, None, None]
    for iteration in range(plan.iterations):
        stored = np.zeros(scratch.shape, dtype=bool)
        if plan.store_groups[iteration]:
            registers, offset = _vector_positions(
                plan.store_map, plan.store_groups[iteration], iteration, plan.store_vector, shape
            )
            values = regs[..., registers]
            scratch[block_index, offset] = values
            stored[block_index, offset] = True
            if not _same(scratch[block_index, offset], values).all():
                raise LayoutError("two threads store different values to one scratch address")
        # bar.sync: every store of this iteration lands before any load.
        if plan.load_groups[iteration]:
            registers, offset = _vector_positions(
                plan.load_map, plan.load_groups[iteration], iteration, plan.load_vector, shape
            )
            if not stored[block_index, offset].all():
                raise LayoutError(f"a load in iteration {iteration} reads a scratch address nobody stored")
            if written[registers].any():
                raise LayoutError("plan loads a dst register twice")
            out[..., registers] = scratch[block_index, offset]
            written[registers] = True
        # bar.sync: every load lands before the next iteration overwrites the buffer.
    _fill_copies(out, written, plan.register_copies)
    if not written.all():
        raise LayoutError("plan leaves some dst registers unwritten")
    return out
