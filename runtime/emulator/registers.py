"""Per-thread registers of distributed tensors.

A distributed tensor in a CTA of `num_warps` warps is a numpy array shaped
(num_warps, 32, num_registers): entry [w, l, r] is register r of lane l of warp w, which
holds the element at coordinate layout(register=r, lane=l, warp=w) (block 0: one CTA).
Lane or warp bits a layout lacks broadcast (those threads hold the same elements).

Tables are cached per (layout, num_warps): every op of a layout reuses them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...compiler.hardware import LANES
from ...layouts import LayoutError, LinearLayout


def _padded(layout: LinearLayout, num_warps: int) -> LinearLayout:
    bases = layout.bases
    zero = (0,) * len(layout.out_dims)
    lane_bits, warp_bits = 5, max(num_warps.bit_length() - 1, 0)
    if num_warps & (num_warps - 1):
        raise LayoutError(f"num_warps must be a power of two, got {num_warps}")
    lanes, warps = list(bases.get("lane", ())), list(bases.get("warp", ()))
    if len(lanes) > lane_bits or len(warps) > warp_bits:
        raise LayoutError(
            f"layout spans {1 << len(lanes)} lanes and {1 << len(warps)} warps but the CTA "
            f"has {LANES} lanes and {num_warps} warps"
        )
    return LinearLayout({
        "register": bases.get("register", ()),
        "lane": lanes + [zero] * (lane_bits - len(lanes)),
        "warp": warps + [zero] * (warp_bits - len(warps)),
    }, layout.out_dims)


def num_registers(layout: LinearLayout) -> int:
    return 1 << len(layout.bases.get("register", ()))


@lru_cache(maxsize=1024)
def thread_coordinates(layout: LinearLayout, num_warps: int) -> tuple[np.ndarray, ...]:
    """One array per tensor dim, each (num_warps, 32, num_registers): every register's coordinate."""
    padded = _padded(layout, num_warps)
    registers = np.arange(num_registers(layout))[None, None, :]
    lanes = np.arange(LANES)[None, :, None]
    warps = np.arange(num_warps)[:, None, None]
    coords = padded(register=registers, lane=lanes, warp=warps)
    shape = (num_warps, LANES, num_registers(layout))
    out = tuple(np.ascontiguousarray(np.broadcast_to(c, shape)) for c in coords)
    for c in out:
        c.setflags(write=False)
    return out


@lru_cache(maxsize=1024)
def thread_elements(layout: LinearLayout, num_warps: int) -> np.ndarray:
    """(num_warps, 32, num_registers): the row-major flat index of every register's element."""
    shape = tuple(layout.out_dims.values())
    coords = thread_coordinates(layout, num_warps)
    flat = np.ravel_multi_index(coords, shape) if coords else np.zeros(
        (num_warps, LANES, num_registers(layout)), np.int64)
    flat = np.asarray(flat, dtype=np.int64)
    flat.setflags(write=False)
    return flat


def tensor_to_registers(array, layout: LinearLayout, num_warps: int) -> np.ndarray:
    """Distribute a whole tensor to every thread's registers (as a load would)."""
    array = np.asarray(array)
    shape = tuple(layout.out_dims.values())
    if array.shape != shape:
        raise LayoutError(f"array of shape {array.shape} for a layout of shape {shape}")
    return array.reshape(-1)[thread_elements(layout, num_warps)]


def _agree(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    same = a == b
    if a.dtype.kind in "fc":
        same |= np.isnan(a) & np.isnan(b)
    return same


def registers_to_tensor(registers: np.ndarray, layout: LinearLayout) -> np.ndarray:
    """Collect per-thread registers into the tensor, checking every copy of an element agrees."""
    registers = np.asarray(registers)
    num_warps = registers.shape[0]
    shape = tuple(layout.out_dims.values())
    index = thread_elements(layout, num_warps)
    if registers.shape != index.shape:
        raise LayoutError(f"registers of shape {registers.shape}, layout needs {index.shape}")
    out = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=registers.dtype)
    covered = np.zeros(out.size, dtype=bool)
    out[index] = registers
    covered[index] = True
    if not covered.all():
        missing = np.unravel_index(int(np.flatnonzero(~covered)[0]), shape)
        raise LayoutError(f"no thread holds element {tuple(int(m) for m in missing)}")
    bad = ~_agree(out[index], registers)
    if bad.any():
        w, l, r = (int(i[0]) for i in np.nonzero(bad))
        element = np.unravel_index(int(index[w, l, r]), shape)
        raise LayoutError(
            f"copies of element {tuple(int(e) for e in element)} disagree: warp {w} lane {l} "
            f"register {r} holds {registers[w, l, r]!r}, another copy {out[index[w, l, r]]!r}"
        )
    return out.reshape(shape)


def axis_coordinate(layout: LinearLayout, num_warps: int, axis: int) -> np.ndarray:
    """(num_warps, 32, num_registers): every register's coordinate along `axis`."""
    return thread_coordinates(layout, num_warps)[axis]
