"""The FA3-style flash-attention forward kernel in weft.lowlevel (HOPPER.md).

Persistent, with a dynamic scheduler: the host launches one CTA per SM (or one per tile
with `PingpongConfig(persistent=False)`); a CTA's first tile (query tile, batch * head) is its
program id, and its producer claims the next from an atomic counter (num_programs + the
count so far) while the consumers run a tile, so a CTA that drew short tiles takes more
of them (DYNAMIC; else CTA i takes tiles i, i + num_programs, ..., as clusters do).
Tiles are numbered longest first (`tile_coordinates`). The producer hands each
tile's index and coordinates to the consumers through shared memory, published with the
tile's Q (the consumers do no division per tile); an index past the last tile tells them
to stop. The CTA's warps split into partitions:

- the producer (4 warps at a few registers, one thread issuing TMA) loads each
  warpgroup's Q of a tile into a ring of Q_BUFFERS warpgroup-sized buffers (up to two
  tiles' where they fit, three for head_dim 256: the next tile's Q loads during this
  one) once its last user released it (`q_empty`: after its last S GEMM when O leaves
  through its own buffer, O_BUFFER; after the O store when it leaves through Q's), and
  streams the tile's K and V tiles through a ring of STAGES slots; every slot has a `ready`
  mbarrier (the TMA bytes land on it) and an `empty` one (each consumer releases it).
  Ring positions count on over the CTA's tiles, so the next tile's K/V loads start as
  soon as the last tile frees slots;
- CONSUMERS warpgroups of 64 query rows each (a partition each, or, REPLICATED, one
  partition run as CONSUMERS copies: one copy of the code, as short causal tiles want,
  each copy reading its index with ll.replica_index): S = Q K^T by async wgmma from
  shared memory, the online softmax in the accumulator's registers (exp2 with log2(e) * scale
  folded into one FMA), and O += P V with P fed to wgmma from registers.

A warpgroup's key steps are in steps.py, the softmax of a step in softmax.py; ring
slots, phases, releases and turns in rings.py; which rows and keys a tile has, the tile
order and the hand-off of a tile with its Q in tiles.py. With RESCALE_ABOVE
(PingpongConfig.conditional_rescale: on by default), a row's running max moves only when some row
of its warp grew past it by more than 2^8, and only those warps rescale O (`if
ll.warp_any(...)`), as FlashAttention-4 does: head_dim 256's 64-key tiles would otherwise
rescale 128 O registers per thread every 64 keys.

At head_dim 64 and 128 (LAZY_MAX, PingpongConfig.lazy_max) a key step takes no row max at all: P
is computed against the running max of the tiles before, and the row sums of P, which l
needs anyway, tell the few warps where that was unsafe (a sum past 2^8: scores grew) to
move the max (`exps_on_last_max`). At 128 ("scores") they take the exact max from S,
still live, and compute P again (`max_where_grew`; 484 instructions a step become 350).
At 64 ("sums"), where S beside P spills, they move it up by log2 of the sum and scale P,
l and O down to match (`max_from_sums`; 429 instructions become 332), and only key tiles
that need no mask are lazy: a P that overflowed to inf leaves no S to take the max from,
so its warp alone computes its rows of S again from Q and the K tile (`recomputed_max`,
ll.mma_v2 in a branch taken warp by warp), which it releases only then. (A warpgroup
vote and wgmma there would hold every warp back at every step for the rare warp that
overflowed.) A row's first
key tile, with no running max yet, takes P against the max of its first 32 keys
(`first_keys_max`: a quarter of the compares) and the exact max only in warps where a row
grew past that.

Two overlaps hide the softmax behind the tensor cores, as in FlashAttention-3:
- inside a warpgroup, the GEMMs of step n (S_n = Q K_n^T and O += P_{n-1} V_{n-1}) are
  issued together and the softmax of S_n runs while P_{n-1} V_{n-1} is still in flight;
- between warpgroups (ping-pong), a token passed around on `turn` mbarriers lets one
  warpgroup issue its GEMMs while the others do their softmax. In a non-causal tile cut
  by the end of the queries, the token goes round the warpgroups with rows only
  (`turn_takers`): the others just release the ring's slots, and each warpgroup counts
  its own turns.

With CLUSTER 2 (PingpongConfig.cluster; non-causal), CTAs run in clusters of two on a static
schedule: the pair takes query tiles 2p and 2p + 1 of one head, and each CTA's producer
loads half of every K/V tile's 64-column boxes into both CTAs by multicast TMA
(`load_boxes`), so K and V leave L2 once per pair; consumers release each slot on
both CTAs' `empty` barriers (`release_slot`), since either producer writes into both.

Tensors are seen through 4-D TMA descriptors [batch, heads, seq, head_dim] with boxes
[1, 1, rows, 64]: a box never crosses a (batch, head) boundary, rows past the sequence
load as zeros and are not stored, and any strides work (bhsd and bshd). Head dims above
64 are several 64-wide boxes side by side in one buffer.

Causal attention is aligned bottom-right (query i sees keys j <= i + seq_k - seq_q):
K/V tiles wholly above the diagonal are never loaded, only tiles crossing the diagonal or
the end of the keys pay for masks, and tiles are started longest first. Each warpgroup
bounds its key tiles by its own 64 rows: of a 192-row tile's keys, the first warpgroup
skips (only releases) those right of its diagonal, and masks only the tile it crosses;
where its rows see only the first half of that tile (rows from a multiple of 128, with
128-key tiles), it takes the half alone (HALF_TILES, PingpongConfig.half_tiles).
Causal query tiles are aligned to the last rows too (`tile_coordinates`), so a partial
tile is the top one, which sees the fewest keys.

The tile loops are `while ll.condition(..., rematerialize=True)`: thread-position values
(each register's shared-memory offset for the O store, the mask's column indices) are
recomputed for each tile instead of held in registers across the K/V loop; held, they
made the consumers spill at 240 registers.
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .config import BOX as BOX_COLUMNS  # 16-bit columns of one TMA box
from .config import ROWS, TILE_FIELDS  # rows per consumer warpgroup; words published per tile
from .rings import pass_turn, ready_barriers, ring_phase, ring_slot, take_turn
from .softmax import normalizers, zero_shares
from .state import Forward, Output, QueryTile, Rings, Running, Tile
from .steps import accumulator_layout, attend_step, first_step_softmax, last_pv, release_step
from .tiles import (BATCH, FIRST_ROW, HEAD, key_tiles, keys_seen, next_tile, publish_tile, tile_coordinates,
                    tile_field, tile_rows, warpgroup)

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@ll.jit
def load_boxes(desc, batch, head, row, bar, dst, HEAD_DIM: ll.constexpr, pred=True, CLUSTER: ll.constexpr = 1):
    """TMA loads of a [rows, HEAD_DIM] tile as HEAD_DIM / 64 boxes side by side (none
    where `pred` is false). In a cluster of CLUSTER CTAs, the tile lands in every CTA of
    it: CTA r loads the boxes j with j % CLUSTER == r and multicasts them to all, so it
    leaves L2 once per cluster rather than once per CTA (each CTA's barrier still expects
    the whole tile; `pred` is then not used: K and V tiles are always loaded)."""
    BOX: ll.constexpr = desc.block_shape[3]
    for j in ll.static_range(HEAD_DIM // BOX):
        if CLUSTER == 1:
            tma.async_copy_global_to_shared(desc, [batch, head, row, j * BOX], bar,
                                            dst.slice(j * BOX, BOX, 3), pred)
        else:
            tma.async_copy_global_to_shared(desc, [batch, head, row, j * BOX], bar, dst.slice(j * BOX, BOX, 3),
                                            ll.program_id(0) % CLUSTER == j % CLUSTER,
                                            multicast=(1 << CLUSTER) - 1)


@ll.jit
def store_boxes(desc, batch, head, row, src, HEAD_DIM: ll.constexpr):
    """TMA stores of a [rows, HEAD_DIM] tile as HEAD_DIM / 64 boxes side by side."""
    BOX: ll.constexpr = desc.block_shape[3]
    for j in ll.static_range(HEAD_DIM // BOX):
        tma.async_copy_shared_to_global(desc, [batch, head, row, j * BOX], src.slice(j * BOX, BOX, 3))


@ll.jit
def producer(state):
    """For each of this CTA's tiles: load its Q once the consumers release the Q buffer,
    then every K/V tile the consumers need, as slots free up. `step` counts K/V tiles over
    all of the CTA's tiles: ring slots and phases run on."""
    BLOCK_M: ll.constexpr = ROWS * state.CONSUMERS
    tiles = state.num_m_tiles * state.batch_heads
    step = 0
    done = 0  # tiles of this CTA started
    tile = ll.program_id(0)
    while ll.condition(tile < tiles, rematerialize=True):
        batch, head, kv_head, off_m = tile_coordinates(state, tile)
        count = key_tiles(state, off_m, BLOCK_M)[1]
        # The first warpgroup's Q, then the first K/V tile, then the other warpgroups' Q:
        # with a ring of fewer than two tiles' Q buffers, the second warpgroup's buffer is
        # the one the first warpgroup stores its last O from, and waiting for it before the
        # first K/V tile would hold the next tile's start back by a load.
        load_q(state, tile, done * state.CONSUMERS, batch, head, off_m, 0)
        if count > 0:
            load_kv(state, step, batch, kv_head, 0)
        for wg in ll.static_range(1, state.CONSUMERS):
            load_q(state, tile, done * state.CONSUMERS + wg, batch, head, off_m, wg)
        # The CTA's next tile, claimed while the consumers run this one. Non-causal tiles
        # are all alike: claim it now, so that its Q is in before this tile ends (short
        # tiles gain most). Causal tiles run longest first and are claimed before this
        # one's last CLAIM_AHEAD K/V loads (PingpongConfig.claim_ahead): claimed at once, the
        # longest-first order would balance the last ones worse.
        claim_at = 1
        if state.CAUSAL:
            claim_at = ll.maximum(count - state.CLAIM_AHEAD, 1)
        for n in range(1, claim_at):
            load_kv(state, step + n, batch, kv_head, n)
        if state.DYNAMIC:
            tile = claim_tile(state.counter_ptr)
        else:  # every num_programs-th tile (clusters: the CTAs of one take tiles side by side)
            tile += ll.num_programs(0)
        for n in range(claim_at, count):
            load_kv(state, step + n, batch, kv_head, n)
        step += count
        done += 1
    # No tile left: each consumer stops when it reads `tiles` as its next one.
    READY: ll.constexpr = ready_barriers(state.Q_BUFFERS, state.CONSUMERS)
    for wg in ll.static_range(state.CONSUMERS):
        slot = claim_q_buffer(state.q_empty, state.tile_smem, done * state.CONSUMERS + wg, state.Q_BUFFERS)
        publish_tile(state.tile_smem.index(slot), tiles)
        mbarrier.arrive(state.q_ready.index(ring_slot(done * state.CONSUMERS + wg, READY)))


@ll.jit
def claim_tile(counter_ptr):
    """The CTA's next tile: num_programs + the count of tiles claimed so far."""
    return ll.atomic_add(counter_ptr, 1, sem="relaxed") + ll.num_programs(0)


@ll.jit
def load_q(state, tile, j, batch, head, off_m, WG: ll.constexpr):
    """The Q rows of warpgroup WG of the tile at row off_m, the CTA's j-th (tile,
    warpgroup) in order, into Q buffer j % Q_BUFFERS once its last user released it, with
    the tile's index and coordinates for the consumer."""
    slot = claim_q_buffer(state.q_empty, state.tile_smem, j, state.Q_BUFFERS)
    publish_tile(state.tile_smem.index(slot), tile, batch, head, off_m)
    ready = state.q_ready.index(ring_slot(j, ready_barriers(state.Q_BUFFERS, state.CONSUMERS)))
    row = off_m + WG * ROWS
    nbytes = state.q_desc.nbytes * (state.HEAD_DIM // state.q_desc.block_shape[3])
    if state.CAUSAL:  # a warpgroup wholly above row 0 (tile_coordinates) reads no Q: only the index
        has_rows = row >= 0
        mbarrier.expect(ready, ll.where(has_rows, nbytes, 0))
        load_boxes(state.q_desc, batch, head, row, ready, state.q_smem.index(slot), state.HEAD_DIM, has_rows)
    else:
        mbarrier.expect(ready, nbytes)
        load_boxes(state.q_desc, batch, head, row, ready, state.q_smem.index(slot), state.HEAD_DIM)


@ll.jit
def claim_q_buffer(q_empty, tile_smem, j, Q_BUFFERS: ll.constexpr):
    """Buffer j % Q_BUFFERS, for the CTA's j-th (tile, warpgroup) Q, once its last user
    released it (a fresh barrier counts as released): its tile fields may then be
    written too."""
    slot = ring_slot(j, Q_BUFFERS)
    mbarrier.wait(q_empty.index(slot), ring_phase(j, Q_BUFFERS) ^ 1)
    return slot


@ll.jit
def load_kv(state, step, batch, kv_head, n):
    """Key tile n's K and V into ring position `step`, each once its slot is free."""
    rings = state.rings
    boxes: ll.constexpr = state.HEAD_DIM // state.k_desc.block_shape[3]
    slot = ring_slot(step, rings.STAGES)
    phase = ring_phase(step, rings.STAGES) ^ 1
    mbarrier.wait(rings.k_empty.index(slot), phase)
    mbarrier.expect(rings.k_ready.index(slot), state.k_desc.nbytes * boxes)
    load_boxes(state.k_desc, batch, kv_head, n * state.BLOCK_N, rings.k_ready.index(slot), rings.k.index(slot),
               state.HEAD_DIM, CLUSTER=rings.CLUSTER)
    mbarrier.wait(rings.v_empty.index(slot), phase)
    mbarrier.expect(rings.v_ready.index(slot), state.v_desc.nbytes * boxes)
    load_boxes(state.v_desc, batch, kv_head, n * state.BLOCK_N, rings.v_ready.index(slot), rings.v.index(slot),
               state.HEAD_DIM, CLUSTER=rings.CLUSTER)


@ll.jit
def consumer(state, WG: ll.constexpr):
    """For each of this CTA's tiles: softmax(Q K^T * scale) V for its rows
    [off_m + 64 wg, +64) of warpgroup wg (`warpgroup(WG)`). `step` runs on over tiles, as
    in the producer."""
    BLOCK_M: ll.constexpr = ROWS * state.CONSUMERS
    qk_scale = state.softmax_scale * LOG2E
    tiles = state.num_m_tiles * state.batch_heads
    step = 0
    turn = 0  # this warpgroup's turns so far, non-causal (none where it has no rows: `turn_takers`)
    j = warpgroup(WG)  # the CTA's j-th (tile, warpgroup): this warpgroup's Q is in buffer j % Q_BUFFERS
    tile = next_tile(state.tile_smem, state.q_ready, j, state.Q_BUFFERS, state.CONSUMERS)
    while ll.condition(tile < tiles, rematerialize=True):
        # Read before this Q is released, after which the producer may write the next.
        fields = state.tile_smem.index(ring_slot(j, state.Q_BUFFERS))
        batch, head, off_m = tile_field(fields, BATCH), tile_field(fields, HEAD), tile_field(fields, FIRST_ROW)
        loaded = key_tiles(state, off_m, BLOCK_M)[1]
        query = QueryTile(batch, head, off_m, ring_slot(j, state.Q_BUFFERS))
        if state.CAUSAL:  # every warpgroup takes every turn: its turns are the ring's steps
            attend_tile(state, query, step, step, qk_scale, WG)
        else:
            turn += attend_tile(state, query, step, turn, qk_scale, WG)
        step += loaded
        j += state.CONSUMERS
        tile = next_tile(state.tile_smem, state.q_ready, j, state.Q_BUFFERS, state.CONSUMERS)
    tma.store_wait(0)  # the last O is read out of shared memory before the CTA ends


@ll.jit
def attend_tile(state, query, step, turn, qk_scale, WG: ll.constexpr):
    """This warpgroup's rows of a query tile (`query`, a state.QueryTile), its K/V tiles
    from ring position `step` on and its turns from its turn-th on (`take_turn`); returns
    how many turns it took. O leaves through its own buffer (O_BUFFER), Q released once
    the S GEMMs are done, or through the Q buffer, released after that."""
    S_LAYOUT: ll.constexpr = accumulator_layout(state.BLOCK_N)
    O_LAYOUT: ll.constexpr = accumulator_layout(state.HEAD_DIM)
    ROW: ll.constexpr = ll.SliceLayout(1, S_LAYOUT)
    rings = state.rings
    q_slot = query.q_slot
    row0, full, count, loaded, active = tile_rows(state, query.off_m, WG)
    q = state.q_smem.index(q_slot).index(0).index(0)
    rows = Tile(q, row0, step, turn, active, qk_scale)
    m_i = ll.full([ROWS], float("-inf"), ll.float32, ROW)
    l_i = zero_shares(state.BLOCK_N, S_LAYOUT)  # l as the threads' shares of the row sums
    acc = ll.zeros([ROWS, state.HEAD_DIM], ll.float32, O_LAYOUT)
    if count > 0:
        # Key tile 0 alone: S_0 and its softmax (O is still 0: nothing to rescale).
        first = ring_slot(step, rings.STAGES)
        wg = warpgroup(WG)
        take_turn(rings.turns, turn, wg)
        mbarrier.wait(rings.k_ready.index(first), ring_phase(step, rings.STAGES))
        s = ll.warpgroup_mma(q, rings.k.index(first).index(0).index(0).permute((1, 0)),
                             ll.zeros([ROWS, state.BLOCK_N], ll.float32, S_LAYOUT), use_acc=False,
                             is_async=True)
        pass_turn(rings.turns, wg, active, rings.PER_WARP)
        s = ll.warpgroup_mma_wait(0, deps=[s])
        p_op, m_i, l_i = first_step_softmax(state, rows, s, full)
        steps, half = key_steps(state, rows, Running(acc, p_op, m_i, l_i), full, count, WG)
        last_step = step + count - 1
        if half:
            last = half_step(state, rows, steps, count, WG)
            if state.O_BUFFER:  # every S GEMM has read Q (each was waited for): the next tile's may land
                mbarrier.arrive(state.q_empty.index(q_slot))
            acc, seen, log2_l, inv_l = last_pv(last, rings, last_step, ROW)
            m_i = last.m_i
        else:
            if state.O_BUFFER:
                mbarrier.arrive(state.q_empty.index(q_slot))
            acc, seen, log2_l, inv_l = last_pv(steps, rings, last_step, ROW)
            m_i = steps.m_i
    else:
        seen, log2_l, inv_l = normalizers(l_i, ROW)
        if state.O_BUFFER:  # no key tile: Q is not read at all
            mbarrier.arrive(state.q_empty.index(q_slot))
    for n in range(count, loaded):
        release_step(state, step + n, turn + n, WG)
    store_tile(state, query, rows, Output(acc, m_i, seen, log2_l, inv_l), WG)
    taken = loaded  # causal: every warpgroup takes every turn
    if not state.CAUSAL:
        taken = ll.where(warpgroup(WG) < active, loaded, 0)
    return taken


@ll.jit
def key_steps(state, tile, running, full, count, WG: ll.constexpr):
    """Key tiles 1 to count - 1 of this warpgroup's rows of a tile (a state.Tile), from
    ring position tile.step + 1 and its (tile.turn + 1)-th turn on (`attend_step`), all
    but a last half tile (HALF_TILES: where none of the rows sees its second half;
    `half_step`). Takes O, P, m and l after key tile 0 (`running`, a state.Running) and
    returns them after the last of these, with 1 where a half tile is left, else 0."""
    S_LAYOUT: ll.constexpr = accumulator_layout(state.BLOCK_N)
    # A replicated warpgroup holds its index across the key loop, in a uniform register
    # (a thread index shuffled to be uniform: read at every step it put 6 instructions and
    # a shuffle before each turn's wait, which short tiles feel most), except
    # with four warpgroups at 112 registers keeping one tile's Q buffers, where ptxas
    # spilled for it: each step reads it again there (`attend_step`).
    wg = None
    if not (state.CONSUMERS == 4 and state.Q_BUFFERS == state.CONSUMERS):
        wg = warpgroup(WG)
    for n in range(1, full):
        running = attend_step(state, tile, n, tile.step + n, tile.turn + n, running, state.BLOCK_N, WG, wg, False,
                              S_LAYOUT)
    # A last key tile whose second half no row sees (causal: half of the warpgroups'
    # diagonal tiles) is taken as a tile of BLOCK_N / 2 keys (HALF_TILES).
    half = 0
    if state.HALF_TILES:
        keys = keys_seen(state, tile.row0, ROWS)
        half = ll.where((count > 1) & (keys - (count - 1) * state.BLOCK_N <= state.BLOCK_N // 2), 1, 0)
    for n in range(ll.maximum(full, 1), count - half):
        running = attend_step(state, tile, n, tile.step + n, tile.turn + n, running, state.BLOCK_N, WG, wg, True,
                              S_LAYOUT)
    return running, half


@ll.jit
def half_step(state, tile, running, count, WG: ll.constexpr):
    """The warpgroup's last key tile as a tile of BLOCK_N / 2 keys (`key_steps`): the ring
    slot's first half. Returns O, its P of BLOCK_N / 2 columns, m and l (a state.Running)."""
    S_HALF: ll.constexpr = accumulator_layout(state.BLOCK_N // 2)
    n = 2 * (count - 1)  # the half tile's index in tiles of BLOCK_N / 2 keys (its mask's columns)
    return attend_step(state, tile, n, tile.step + count - 1, tile.turn + count - 1, running, state.BLOCK_N // 2, WG,
                       None, True, S_HALF)


@ll.jit
def store_tile(state, query, tile, out, WG: ll.constexpr):
    """O = acc / l of this warpgroup's rows [tile.row0, +64) of the query tile's (batch,
    head) (`query`, a state.QueryTile; `tile`, a state.Tile), by TMA from its O buffer
    (O_BUFFER) or its Q buffer query.q_slot (released once the store has read it), and the
    rows' log-sum-exp (WRITE_LSE). `out`: the rows' O, m and normalizers (a state.Output)."""
    batch, head, row0, q_slot = query.batch, query.head, tile.row0, query.q_slot
    acc, m_i, seen, log2_l, inv_l = out.acc, out.m_i, out.seen, out.log2_l, out.inv_l
    S_LAYOUT: ll.constexpr = accumulator_layout(state.BLOCK_N)
    O_LAYOUT: ll.constexpr = accumulator_layout(state.HEAD_DIM)
    ROW: ll.constexpr = ll.SliceLayout(1, S_LAYOUT)
    if state.WRITE_LSE:
        rows = row0 + ll.arange(0, ROWS, ROW)
        lse = ll.where(seen, (m_i + log2_l) * LN2, float("inf"))
        inside = rows < state.seq_q
        if state.CAUSAL:
            inside = inside & (rows >= 0)
        ll.store(state.lse_ptr + (batch * state.heads + head) * state.seq_q + rows, lse, mask=inside)
    o = (acc * ll.convert_layout(inv_l, ll.SliceLayout(1, O_LAYOUT))[:, None]).to(state.q_desc.dtype)
    if state.O_BUFFER:
        tma.store_wait(0)  # the last tile's O is read out of the buffer
        ll.barrier()
    o_buffer = state.q_smem.index(q_slot)
    if state.O_BUFFER:
        o_buffer = state.o_smem.index(warpgroup(WG))
    o_buffer.index(0).index(0).store(o)
    ll.fence_async_shared()
    if state.CAUSAL:
        if row0 >= 0:  # not a warpgroup wholly above row 0: a TMA store there traps
            store_boxes(state.o_desc, batch, head, row0, o_buffer, state.HEAD_DIM)
    else:
        store_boxes(state.o_desc, batch, head, row0, o_buffer, state.HEAD_DIM)
    if not state.O_BUFFER:
        tma.store_wait(0)  # the Q buffer is read out: the next tile's Q may land there
        mbarrier.arrive(state.q_empty.index(q_slot))


@ll.jit
def consumer_copy(state):
    consumer(state, None)


@ll.jit
def consumer_0(state):
    consumer(state, 0)


@ll.jit
def consumer_1(state):
    consumer(state, 1)


@ll.jit
def consumer_2(state):
    consumer(state, 2)


@ll.jit
def consumer_3(state):
    consumer(state, 3)


@ll.jit
def flash_attention_fa3(q_desc, k_desc, v_desc, o_desc, lse_ptr, counter_ptr, softmax_scale, seq_q, seq_k,
                        heads, kv_group, num_m_tiles, batch_heads, group,
                        HEAD_DIM: ll.constexpr, BLOCK_N: ll.constexpr, STAGES: ll.constexpr,
                        CONSUMERS: ll.constexpr, CAUSAL: ll.constexpr, WRITE_LSE: ll.constexpr,
                        PRODUCER_REGS: ll.constexpr, CONSUMER_REGS: ll.constexpr, Q_BUFFERS: ll.constexpr,
                        O_BUFFER: ll.constexpr = False, EXP2_FMA: ll.constexpr = 0.0,
                        REPLICATED: ll.constexpr = True, PER_WARP: ll.constexpr = None,
                        RESCALE_ABOVE: ll.constexpr = None, CLAIM_AHEAD: ll.constexpr = 0,
                        CLUSTER: ll.constexpr = 1, LAZY_MAX: ll.constexpr = False,
                        DYNAMIC: ll.constexpr = True, HALF_TILES: ll.constexpr = False):
    """Grid: any count up to num_m_tiles * batch_heads (CTA i takes tiles i, i + grid, ...);
    4 warps (the producer; each consumer warpgroup adds 4); descriptors over [batch, heads,
    seq, head_dim] with [1, 1, 64 | BLOCK_N, 64] boxes (Q and O | K and V).

    CLUSTER 2 (launched with cluster=(2, 1, 1), an even grid): the two CTAs of a cluster
    take query tiles 2p and 2p + 1, which must share their (batch, head): non-causal, an
    even num_m_tiles and one head per tile group. They run in step over the same K/V
    tiles, each loading half of every tile into both (`load_boxes`)."""
    dtype: ll.constexpr = q_desc.dtype
    # How a lazy step (PingpongConfig.lazy_max) moves the max of rows that grew: from S, held
    # beside P, where the registers allow it (head_dim 128: "scores"), else from the row
    # sums of P alone ("sums", `max_from_sums`; S beside P spilled at 64 and 256).
    if LAZY_MAX:
        LAZY_MAX = "scores" if HEAD_DIM == 128 else "sums"
    ll.static_assert(CLUSTER == 1 or (CLUSTER == 2 and not CAUSAL and HEAD_DIM // BOX_COLUMNS % 2 == 0),
                     "CLUSTER 2 needs non-causal attention (tiles of equal length, paired) and an even "
                     "count of 64-column boxes per K/V tile (head_dim 128 or 256)")
    ll.static_assert(CLUSTER == 1 or not DYNAMIC, "the CTAs of a cluster take their tiles side by side: "
                     "CLUSTER 2 needs DYNAMIC False (a static schedule)")
    ll.static_assert(CONSUMERS <= Q_BUFFERS <= 2 * CONSUMERS,
                     "Q_BUFFERS: one to two tiles' warpgroup-sized Q buffers")
    # A ring of warpgroup-sized Q buffers, the CTA's j-th (tile, warpgroup) in buffer
    # j % Q_BUFFERS: beyond one tile's, each spare lets a warpgroup's next Q load during
    # this tile (with two tiles' buffers, every warpgroup's does).
    q_smem = ll.allocate_shared_memory(dtype, [Q_BUFFERS, 1, 1, ROWS, HEAD_DIM], q_desc.layout)
    if O_BUFFER:  # O leaves through its own buffer, so the next tile's Q can land meanwhile
        o_smem = ll.allocate_shared_memory(dtype, [CONSUMERS, 1, 1, ROWS, HEAD_DIM], o_desc.layout)
    else:  # through the Q buffer, once the last S GEMM has read it
        o_smem = q_smem
    k_ring = ll.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_ring = ll.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    # Q buffer j % Q_BUFFERS, ready on barrier j % READY: one warpgroup's per barrier.
    READY: ll.constexpr = ready_barriers(Q_BUFFERS, CONSUMERS)
    q_ready = mbarrier.allocate_mbarrier(batch=READY)
    q_empty = mbarrier.allocate_mbarrier(batch=Q_BUFFERS)
    k_ready = mbarrier.allocate_mbarrier(batch=STAGES)
    k_empty = mbarrier.allocate_mbarrier(batch=STAGES)
    v_ready = mbarrier.allocate_mbarrier(batch=STAGES)
    v_empty = mbarrier.allocate_mbarrier(batch=STAGES)
    turns = mbarrier.allocate_mbarrier(batch=CONSUMERS)
    tile_smem = ll.allocate_shared_memory(ll.int32, [Q_BUFFERS, TILE_FIELDS, 1], ll.SwizzledSharedLayout(1, 1, 1, [0]))
    for s in ll.static_range(READY):  # READY >= Q_BUFFERS
        mbarrier.init(q_ready.index(s), count=1)
        if s < Q_BUFFERS:
            mbarrier.init(q_empty.index(s), count=1)
    # Replicated consumers release ring slots and pass turns warp by warp (`release`):
    # no warpgroup-wide named barrier first, whose id there is a register. PER_WARP None:
    # so do replicated consumers, and only they.
    if PER_WARP is None:
        PER_WARP = REPLICATED
    ll.static_assert(PER_WARP or not REPLICATED, "replicated consumers release warp by warp (PER_WARP)")
    ARRIVALS: ll.constexpr = 4 if PER_WARP else 1
    for s in ll.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=CLUSTER * CONSUMERS * ARRIVALS)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(v_empty.index(s), count=CLUSTER * CONSUMERS * ARRIVALS)
    for wg in ll.static_range(CONSUMERS):
        mbarrier.init(turns.index(wg), count=ARRIVALS)
    if CLUSTER > 1:  # the peer's barriers are initialised before anything arrives on them
        ll.cluster_barrier()
    rings = Rings(k_ring, v_ring, k_ready, k_empty, v_ready, v_empty, turns, STAGES, CONSUMERS, PER_WARP, CLUSTER)
    state = Forward(q_desc, k_desc, v_desc, o_desc, q_smem, o_smem, rings, q_ready, q_empty, tile_smem, lse_ptr,
                    counter_ptr, softmax_scale, seq_q, seq_k, heads, kv_group, num_m_tiles, batch_heads, group,
                    HEAD_DIM, BLOCK_N, CONSUMERS, CAUSAL, WRITE_LSE, O_BUFFER, Q_BUFFERS, EXP2_FMA, RESCALE_ABOVE,
                    CLAIM_AHEAD, LAZY_MAX, DYNAMIC, HALF_TILES)
    if REPLICATED:  # one copy of the consumer code for all warpgroups (instruction cache)
        ll.warp_specialize((state,), producer, (state,), [consumer_copy], worker_num_warps=[4],
                           worker_num_regs=[CONSUMER_REGS], default_num_regs=PRODUCER_REGS,
                           worker_replicas=[CONSUMERS])
    elif CONSUMERS == 1:
        ll.warp_specialize((state,), producer, (state,), [consumer_0], worker_num_warps=[4],
                           worker_num_regs=[CONSUMER_REGS], default_num_regs=PRODUCER_REGS)
    elif CONSUMERS == 2:
        ll.warp_specialize((state,), producer, (state,), [consumer_0, consumer_1],
                           worker_num_warps=[4, 4], worker_num_regs=[CONSUMER_REGS, CONSUMER_REGS],
                           default_num_regs=PRODUCER_REGS)
    elif CONSUMERS == 3:
        ll.warp_specialize((state,), producer, (state,), [consumer_0, consumer_1, consumer_2],
                           worker_num_warps=[4, 4, 4],
                           worker_num_regs=[CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS],
                           default_num_regs=PRODUCER_REGS)
    else:
        ll.warp_specialize((state,), producer, (state,), [consumer_0, consumer_1, consumer_2, consumer_3],
                           worker_num_warps=[4, 4, 4, 4],
                           worker_num_regs=[CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS],
                           default_num_regs=PRODUCER_REGS)
    if CLUSTER > 1:  # the peer no longer arrives on nor loads into this CTA's shared memory
        ll.cluster_barrier()
    for s in ll.static_range(READY):
        mbarrier.invalidate(q_ready.index(s))
        if s < Q_BUFFERS:
            mbarrier.invalidate(q_empty.index(s))
    for s in ll.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(s))
        mbarrier.invalidate(k_empty.index(s))
        mbarrier.invalidate(v_ready.index(s))
        mbarrier.invalidate(v_empty.index(s))
    for wg in ll.static_range(CONSUMERS):
        mbarrier.invalidate(turns.index(wg))
