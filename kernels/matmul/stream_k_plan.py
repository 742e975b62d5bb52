"""Stream-K's split of the work, host side: which tiles run whole and how the others are
shared among the CTAs. stream_k.py computes the same formulas in the kernel; the CPU
tests check them here.

The work is `tiles` output tiles of `k_steps` K steps each, on `programs` persistent
CTAs. Whole waves of tiles run data-parallel (CTA p takes tiles p, p + programs, ...,
each whole); the partial wave's `sk_tiles` tiles after them are shared, K-aligned:

- heads: `chunks` CTAs per shared tile (programs // sk_tiles of them), CTA
  i x sk_tiles + u taking chunk i of tile u: K steps [i x head, (i + 1) x head), head
  being the CTAs' equal share sk_tiles x k_steps // programs, plus what a tail CTA's
  extra pieces cost it (PIECE_COST steps each, shared out). The CTAs of one chunk run
  in K step, as unsplit tiles do, so the tiles of one row or column read the same A and
  B blocks at about the same time (L2 hits).
- tails: the other CTAs (at most one per tail step) cut the tiles' tails, steps
  [chunks x head, k_steps), tile by tile, into equal contiguous ranges; only the tails'
  few steps are ever in flight at different offsets.
- where the tails would come in many short pieces per CTA (more than TAIL_TILES each:
  a fixup apiece), or no CTA is left for them, there are none: the chunks split K evenly instead, [i x k_steps //
  chunks, (i + 1) x k_steps // chunks), and the CTAs past sk_tiles x chunks idle.

Each piece (a chunk, or a tail CTA's part of one tile) writes its fp32 partial tile to a
slot of its own: chunk CTA p to slot p, tail CTA j's i-th piece to slot
heads + j x max_pieces + i.
"""

from __future__ import annotations

INT32_LIMIT = 2**31  # the kernel's range arithmetic is in int32
TAIL_TILES = 3       # tails a tail CTA may cut into before the chunks take them instead
PIECE_COST = 3       # K steps a piece's fixup costs its CTA (partial store, release, count):
                     # a tail CTA has more pieces, so the chunks take that much more each


def stream_k_tiles(tiles: int, programs: int) -> int:
    """How many of the tiles (the last ones in tile order) are shared: the partial
    wave's (all of them under one wave; none where the waves are whole)."""
    return tiles % programs


def split(sk_tiles: int, k_steps: int, programs: int) -> tuple:
    """(chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, max_pieces) of the
    shared tiles: chunk i of a tile is K steps [i x numer // denom, (i + 1) x numer //
    denom); heads: the CTAs running chunks; each tail's K steps, all tails', the CTAs
    sharing the tails (one at least, so that nothing divides by zero) and the most
    pieces one of them holds."""
    head = sk_tiles * k_steps // programs
    chunks = programs // max(sk_tiles, 1) if head > 0 else 0
    if head > 0:
        head = min(sk_tiles * (k_steps + PIECE_COST) // programs, k_steps // chunks)
    numer, denom = head, 1
    tail_len = k_steps - chunks * head
    tail_total = sk_tiles * tail_len
    tail_ctas = max(min(programs - sk_tiles * chunks, tail_total), 1)
    if head > 0 and tail_len > 0 and (programs == sk_tiles * chunks or
                                      -(-tail_total // tail_ctas) > TAIL_TILES * tail_len):
        numer, denom, tail_len, tail_total, tail_ctas = k_steps, chunks, 0, 0, 1
    heads = sk_tiles * chunks if head > 0 else 0
    max_pieces = -(-(-(-tail_total // tail_ctas)) // max(tail_len, 1)) + 1
    return chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, max_pieces


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
    chunks, numer, denom, heads, tail_len, tail_total, tail_ctas, max_pieces = split(sk_tiles, k_steps, programs)
    if pid < heads:
        u, i = pid % sk_tiles, pid // sk_tiles
        offset = i * numer // denom
        length = (i + 1) * numer // denom - offset
        return length, offset, u * length, u * length + length, pid
    j = pid - heads
    if j >= tail_ctas or tail_total == 0:
        return 1, 0, 0, 0, 0
    begin, end = cta_iterations(j, tail_ctas, tail_total)
    return tail_len, k_steps - tail_len, begin, end, heads + j * max_pieces


def tile_pieces(u: int, sk_tiles: int, k_steps: int, programs: int) -> tuple[int, int, int]:
    """(head_pieces, lowest, highest): shared tile u's chunks (CTAs u + i x sk_tiles for
    i below head_pieces) and the tail CTAs (indices among the tail CTAs, lowest >
    highest where there are no tails) whose ranges hold its tail."""
    chunks, _, _, heads, tail_len, tail_total, tail_ctas, _ = split(sk_tiles, k_steps, programs)
    if tail_total == 0:
        return heads // max(sk_tiles, 1), 0, -1
    return (heads // sk_tiles, iteration_owner(u * tail_len, tail_ctas, tail_total),
            iteration_owner((u + 1) * tail_len - 1, tail_ctas, tail_total))


def slot_count(sk_tiles: int, k_steps: int, programs: int) -> int:
    """Partial-tile slots the workspace needs."""
    _, _, _, heads, _, _, tail_ctas, max_pieces = split(sk_tiles, k_steps, programs)
    return heads + tail_ctas * max_pieces


def stream_k_fits_int32(tiles: int, k_steps: int, programs: int) -> bool:
    """Whether the kernel's products (iteration + 1) x CTAs stay in int32."""
    return (tiles * k_steps + 1) * programs < INT32_LIMIT
