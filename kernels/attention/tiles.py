"""Query tiles of the flash-attention kernel (kernels.py): which (batch, head, rows) a tile
is and in what order tiles run, which key tiles a warpgroup's rows see and which
warpgroups take turns, and how the producer hands a tile to the consumers with its Q."""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier
from .config import ROWS, TILE_FIELDS  # rows per consumer warpgroup; words published per tile
from .rings import ready_barriers, ring_phase, ring_slot

TILE_LAYOUT = ll.BlockedLayout([1], [32], [4], [0])  # a tile index, replicated over a warpgroup
# What the producer publishes with each warpgroup's Q (`publish_tile`): the tile's index and
# its coordinates, so that consumers need none of tile_coordinates' divisions.
TILE, BATCH, HEAD, FIRST_ROW = range(TILE_FIELDS)


@ll.jit
def tile_coordinates(state, tile):
    """(batch, head, kv head, first row) of `tile`, a query tile of state.CONSUMERS
    warpgroups' rows (`state`: the kernel's Forward, or any aggregate with its fields
    num_m_tiles, batch_heads, group, heads, kv_group, seq_q, CONSUMERS and CAUSAL). Tiles
    come in groups of state.group (batch, head) pairs whose K and V stay in L2 while all
    their query tiles run, and within a group bottom query tiles first (causal: those see
    the most keys).

    Causal query tiles end at the last warpgroup's rows (seq_q rounded up to 64), so
    when BLOCK_M does not divide that, the partial tile is the top one, which sees the
    fewest keys, where a partial bottom tile would hold its whole CTA for the most keys
    with warpgroups idle (measured with causal head_dim 64's 192-row tiles:
    docs/attention-journal.md). The top tile's first warpgroups then start at row -64
    or -128: they neither load Q nor store O (`load_q`, `attend_tile`; a TMA store at a
    negative coordinate traps)."""
    BLOCK_M: ll.constexpr = ROWS * state.CONSUMERS
    group, heads = state.group, state.heads
    per_group = group * state.num_m_tiles
    first = (tile // per_group) * group
    in_group = ll.minimum(state.batch_heads - first, group)
    rank = tile % per_group
    bh = first + rank % in_group
    head = bh % heads
    off_m = (rank // in_group) * BLOCK_M
    if state.CAUSAL:
        off_m = ll.cdiv(state.seq_q, ROWS) * ROWS - off_m - BLOCK_M
    return bh // heads, head, head // state.kv_group, off_m


@ll.jit
def keys_seen(state, off_m, BLOCK_M: ll.constexpr):
    """How many keys (a prefix, none for rows wholly above the diagonal) the last of the
    rows [off_m, off_m + BLOCK_M) sees (`state`: either kernel's, for seq_q, seq_k and
    CAUSAL)."""
    seq_k = state.seq_k
    if state.CAUSAL:  # query i sees keys j <= i + seq_k - seq_q
        return ll.minimum(ll.maximum(off_m + BLOCK_M + (seq_k - state.seq_q), 0), seq_k)
    return seq_k


@ll.jit
def key_tiles(state, off_m, BLOCK_M: ll.constexpr):
    """(unmasked, all): the key tiles of state.BLOCK_N keys the rows [off_m, off_m +
    BLOCK_M) see; tiles [0, unmasked) need no mask, tiles [unmasked, all) do."""
    BLOCK_N: ll.constexpr = state.BLOCK_N
    seq_k = state.seq_k
    full = seq_k // BLOCK_N
    if state.CAUSAL:  # the first row's keys, all of them unmasked
        full = ll.minimum(full, ll.maximum(off_m + (seq_k - state.seq_q) + 1, 0) // BLOCK_N)
    return full, ll.cdiv(keys_seen(state, off_m, BLOCK_M), BLOCK_N)


@ll.jit
def publish_tile(fields, tile, batch=0, head=0, off_m=0):
    """Write the CTA's next tile (its index, batch, head and first row) for a consumer,
    who reads it once q_ready's phase completes: the store of a value every thread holds
    is made by one thread, the one that then arrives on q_ready, so that arrive releases
    it. (A tile index past the last tile, with no coordinates, tells it to stop.)"""
    fields.index(TILE).store(ll.full([1], tile, ll.int32, TILE_LAYOUT))
    fields.index(BATCH).store(ll.full([1], batch, ll.int32, TILE_LAYOUT))
    fields.index(HEAD).store(ll.full([1], head, ll.int32, TILE_LAYOUT))
    fields.index(FIRST_ROW).store(ll.full([1], off_m, ll.int32, TILE_LAYOUT))


@ll.jit
def tile_field(fields, field: ll.constexpr):
    """One of the fields `publish_tile` wrote (TILE, BATCH, HEAD or FIRST_ROW)."""
    return ll.max(fields.index(field).load(TILE_LAYOUT), axis=0)


@ll.jit
def next_tile(tile_smem, q_ready, j, Q_BUFFERS: ll.constexpr, CONSUMERS: ll.constexpr):
    """The tile index `load_q` wrote with the CTA's j-th (tile, warpgroup) Q, once that
    Q is in (its `ready` barrier: `ready_barriers`)."""
    READY: ll.constexpr = ready_barriers(Q_BUFFERS, CONSUMERS)
    mbarrier.wait(q_ready.index(ring_slot(j, READY)), ring_phase(j, READY))
    return tile_field(tile_smem.index(ring_slot(j, Q_BUFFERS)), TILE)


@ll.jit
def warpgroup(WG: ll.constexpr):
    """This consumer warpgroup's index: WG in a partition of its own, or (WG None) in the
    one partition all of them run as copies of (a thread index shuffled to be uniform
    over the warp; `key_steps` reads it once, before the key loop, where the registers
    allow it)."""
    if WG is None:
        return ll.replica_index()
    return WG


@ll.jit
def turn_takers(state, off_m):
    """The warpgroups that take turns in the tile at row off_m: all of them in causal
    tiles (where one that sees no key tile still keeps the turn order of those it
    releases), else those with rows below seq_q, the first ones: in a partial tile the
    others only release the ring's slots, so the turn never waits on a warpgroup with
    nothing to issue."""
    if state.CAUSAL:
        return state.CONSUMERS
    return ll.minimum(ll.cdiv(state.seq_q - off_m, ROWS), state.CONSUMERS)


@ll.jit
def tile_rows(state, off_m, WG: ll.constexpr):
    """(row0, unmasked, count, loaded, active) of this warpgroup in the tile at row off_m:
    its first row, its key tiles needing no mask and all it sees (none without rows), the
    key tiles the producer loads for the whole CTA (`loaded`: those these rows do not see,
    causal or past seq_q, are only released) and the warpgroups the turn goes round."""
    BLOCK_M: ll.constexpr = ROWS * state.CONSUMERS
    row0 = off_m + warpgroup(WG) * ROWS
    full, count = key_tiles(state, row0, ROWS)
    has_rows = row0 < state.seq_q
    if state.CAUSAL:  # or wholly above row 0 (tile_coordinates)
        has_rows = has_rows & (row0 >= 0)
    count = ll.where(has_rows, count, 0)
    loaded = key_tiles(state, off_m, BLOCK_M)[1]
    return row0, full, count, loaded, turn_takers(state, off_m)
