"""Stream-K's split of the work, host side: which tiles run whole and how the others are
shared among the CTAs. stream_k.py computes the same formulas in the kernel; the CPU
tests check them here.

The work is `tiles` output tiles of `k_steps` K steps each, on `programs` persistent
CTAs. Whole waves of tiles run data-parallel (CTA p takes tiles p, p + programs, ...,
each whole); the partial wave's `sk_tiles` tiles after them are shared, K-aligned:

- heads: CTA p < sk_tiles takes K steps [0, head) of shared tile p, head = the CTAs'
  equal share sk_tiles x k_steps // programs. These CTAs run in K step, as unsplit
  tiles do, so the tiles of one row or column read the same A and B blocks at about
  the same time (L2 hits).
- tails: the other CTAs (at most one per tail step) cut the tiles' tails, steps
  [head, k_steps), tile by tile, into equal contiguous ranges. Only a tail's few steps
  per tile are ever in flight at different offsets.

Each piece (a head, or a tail CTA's part of one tile) writes its fp32 partial tile to a
slot of its own: head p to slot p, tail CTA j's i-th piece to slot
sk_tiles + j x max_pieces + i.
"""

from __future__ import annotations

INT32_LIMIT = 2**31  # the kernel's range arithmetic is in int32


def stream_k_tiles(tiles: int, programs: int) -> int:
    """How many of the tiles (the last ones in tile order) are shared: the partial
    wave's (all of them under one wave; none where the waves are whole)."""
    return tiles % programs


def split(sk_tiles: int, k_steps: int, programs: int) -> tuple[int, int, int, int, int]:
    """(head, tail_len, tail_total, tail_ctas, max_pieces) of the shared tiles: the
    heads' K steps, each tail's, all tails', the CTAs sharing the tails (one at least,
    so that nothing divides by zero when nothing is shared) and the most pieces one
    of them holds."""
    head = sk_tiles * k_steps // programs
    tail_len = k_steps - head
    tail_total = sk_tiles * tail_len
    tail_ctas = max(min(programs - sk_tiles, tail_total), 1)
    max_pieces = -(-(-(-tail_total // tail_ctas)) // tail_len) + 1
    return head, tail_len, tail_total, tail_ctas, max_pieces


def cta_iterations(j: int, ctas: int, total: int) -> tuple[int, int]:
    """[begin, end) of CTA j's share of `total` iterations among `ctas`: floor division,
    so shares differ by at most one and none is empty while total >= ctas."""
    return j * total // ctas, (j + 1) * total // ctas


def iteration_owner(iteration: int, ctas: int, total: int) -> int:
    """The CTA whose share holds `iteration`: the largest j with j * total // ctas <=
    iteration, i.e. j * total < (iteration + 1) * ctas."""
    return ((iteration + 1) * ctas - 1) // total


def cta_region(pid: int, sk_tiles: int, k_steps: int, programs: int) -> tuple[int, int, int, int, int]:
    """(length, offset, begin, end, slot_base): CTA pid's shared work as a range
    [begin, end) of iterations over units of `length` K steps (unit u: shared tile u,
    K steps offset + [0, length)), and its first piece's slot. Empty where it has none."""
    head, tail_len, tail_total, tail_ctas, max_pieces = split(sk_tiles, k_steps, programs)
    if pid < sk_tiles:
        return max(head, 1), 0, pid * head, pid * head + head, pid
    j = pid - sk_tiles
    if j >= tail_ctas:
        return tail_len, head, 0, 0, 0
    begin, end = cta_iterations(j, tail_ctas, tail_total)
    return tail_len, head, begin, end, sk_tiles + j * max_pieces


def tile_pieces(u: int, sk_tiles: int, k_steps: int, programs: int) -> tuple[int, int, int]:
    """(has_head, lowest, highest): shared tile u's head (1 or 0) and the tail CTAs
    (indices among the tail CTAs) whose ranges hold its tail."""
    head, tail_len, tail_total, tail_ctas, _ = split(sk_tiles, k_steps, programs)
    return (min(head, 1), iteration_owner(u * tail_len, tail_ctas, tail_total),
            iteration_owner((u + 1) * tail_len - 1, tail_ctas, tail_total))


def slot_count(sk_tiles: int, k_steps: int, programs: int) -> int:
    """Partial-tile slots the workspace needs."""
    _, _, _, tail_ctas, max_pieces = split(sk_tiles, k_steps, programs)
    return sk_tiles + tail_ctas * max_pieces


def stream_k_fits_int32(tiles: int, k_steps: int, programs: int) -> bool:
    """Whether the kernel's products (iteration + 1) x CTAs stay in int32."""
    return (tiles * k_steps + 1) * programs < INT32_LIMIT
