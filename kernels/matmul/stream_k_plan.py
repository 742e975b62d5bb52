"""Stream-K's split of the work, host side: which tiles run whole and which are shared,
and each CTA's share of the shared ones' (tile, K step) iterations. stream_k.py computes
the same formulas in the kernel; the CPU tests check them here.

The work is `tiles` output tiles of `k_steps` K steps each, on `programs` persistent
CTAs. Whole waves of tiles run data-parallel (CTA p takes tiles p, p + programs, ...,
each whole); the tiles after them are stream-K: their tiles x k_steps iterations, in
order (tile by tile, K steps within a tile), are cut into `programs` contiguous ranges
whose lengths differ by at most one, one per CTA. A CTA's range begins inside one tile
and ends inside another, so besides whole tiles it holds at most two pieces of tiles it
shares with other CTAs.
"""

from __future__ import annotations

INT32_LIMIT = 2**31  # the kernel's range arithmetic is in int32


def stream_k_tiles(tiles: int, k_steps: int, programs: int) -> int:
    """How many of the tiles (the last ones in tile order) are shared stream-K.

    None where the tiles fill whole waves. Otherwise the partial wave's tiles and, where
    whole waves come before it, one of those too: spread over every CTA, the remainder
    alone gives each a sliver of a tile (pieces shorter than the ring is deep, and
    a fixup for each), while one more wave gives each more than a tile's worth."""
    remainder = tiles % programs
    if remainder == 0:
        return 0
    return remainder + programs if tiles > programs else tiles


def cta_iterations(pid: int, programs: int, total: int) -> tuple[int, int]:
    """[begin, end) of CTA `pid`'s share of `total` stream-K iterations: floor division
    by the CTA count, so shares differ by at most one and none is empty while
    total >= programs."""
    return pid * total // programs, (pid + 1) * total // programs


def iteration_owner(iteration: int, programs: int, total: int) -> int:
    """The CTA whose share holds `iteration`: the largest p with p * total // programs
    <= iteration, i.e. p * total < (iteration + 1) * programs."""
    return ((iteration + 1) * programs - 1) // total


def stream_k_fits_int32(tiles: int, k_steps: int, programs: int) -> bool:
    """Whether the kernel's products (iteration + 1) x programs stay in int32."""
    return (tiles * k_steps + 1) * programs < INT32_LIMIT
