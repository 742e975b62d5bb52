"""Whole-tile loads and stores of row-major [ROWS, COLS] arrays in global memory, for the
one-CTA weft.lowlevel test kernels (test_backend_perf.py, test_warpgroup_mma_gpu.py)."""

from __future__ import annotations

from weft import lowlevel as ll


@ll.jit
def load_tile(ptr, ROWS: ll.constexpr, COLS: ll.constexpr, LAYOUT: ll.constexpr):
    """The tile at `ptr`, in LAYOUT."""
    rows = ll.arange(0, ROWS, layout=ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, COLS, layout=ll.SliceLayout(0, LAYOUT))
    return ll.load(ptr + rows[:, None] * COLS + cols[None, :])


@ll.jit
def store_tile(ptr, value, ROWS: ll.constexpr, COLS: ll.constexpr, LAYOUT: ll.constexpr):
    """Store `value` (in any layout) at `ptr` through LAYOUT."""
    rows = ll.arange(0, ROWS, layout=ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, COLS, layout=ll.SliceLayout(0, LAYOUT))
    ll.store(ptr + rows[:, None] * COLS + cols[None, :], ll.convert_layout(value, LAYOUT))
