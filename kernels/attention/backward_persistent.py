"""The keys split's persistent walk (BackwardConfig(split="keys", persistent=True)): fewer
CTAs than tiles (at most one wave), each walking tiles of (key block, batch * kv head).

A CTA a tile paid, before its first step, the K/V load's latency and the ring's fill, and
after its last the dK/dV stores, with nothing overlapped. Here a CTA walks tiles round by
round (`snaked_tile`) in the non-persistent launch's order: the key blocks of one (batch,
kv head) side by side, so that the CTAs running at one time share a few heads, as the
launch's waves did, and their Q/dO reads and dQ's reduce-adds stay in L2 (at seq 4096,
head_dim 128, a head's Q, dO and fp32 dQ are 4 MB: 132 CTAs on 132 heads would want
several hundred MB at once, on 4 heads 16 MB). With bottom-right causal attention key
block 0 sees every query block and later ones fewer, so each head's longest tile comes
first. Across tiles:

- the Q/dO ring is continuous (its positions, hence its phases, carry on from tile to
  tile), so the producer fills the next tile's first slots as soon as the consumers free
  them, while they finish this tile;
- K and V have one buffer each: the producer loads the next tile's once every consumer
  has released them (`kv_empty`: a consumer arrives after its tile's last wgmma that
  reads K or V has been waited), right after those first slots;
- each consumer stores its dK and dV (from registers) after releasing K and V, so the
  next tile's K/V load runs under the stores.
"""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier, tma
from .backward import load_query_block, tile_query_blocks
from .backward_keys import keys_walk, store_keys_gradients
from .kernels import LOG2E, load_boxes


@ll.jit
def tile_count(state):
    """(tiles, key blocks): a tile is a key block of one (batch, kv head); k_desc is over
    [batch, kv_heads, seq_k, head_dim]."""
    key_blocks = ll.cdiv(state.seq_k, state.BLOCK_N)
    return key_blocks * state.k_desc.shape[0] * state.k_desc.shape[1], key_blocks


@ll.jit
def snaked_tile(round_start):
    """The CTA's tile of the round [round_start, round_start + grid): its program id's
    place in even rounds, counted from the round's end in odd ones (may pass the tiles in
    the last round). Striding alone (pid + i * grid) gives a CTA tiles of one residue of
    key blocks whenever grid and the key blocks share a factor (132 CTAs, 32 key blocks:
    key blocks 0, 4, ..., 28 to CTA 0, 3, 7, ..., 31 to CTA 3), and with causal attention
    those of the low residue are longer: the snake pairs each round's long tiles with the
    next round's short ones."""
    grid = ll.num_programs(0)
    pid = ll.program_id(0)
    return round_start + pid + ((round_start // grid) & 1) * (grid - 1 - 2 * pid)


@ll.jit
def persistent_producer(state, kv_empty):
    """For each of the CTA's tiles: Q and dO of its first ring positions (as the consumers
    free them from the last tile), then its K and V once the consumers release the last
    tile's, then the rest of its query blocks."""
    BOXES: ll.constexpr = state.HEAD_DIM // state.k_desc.block_shape[3]
    tiles, key_blocks = tile_count(state)
    step0 = 0
    done = 0
    for round_start in range(0, tiles, ll.num_programs(0)):
        tile = snaked_tile(round_start)
        if tile < tiles:
            batch, kv_head, key0, first, unmasked, end = tile_query_blocks(state, tile % key_blocks,
                                                                           tile // key_blocks)
            per_head = end - first
            steps = state.kv_group * per_head
            early = ll.minimum(steps, state.STAGES)
            for j in range(0, early):
                load_query_block(state, batch, kv_head * state.kv_group + j // per_head, first + j % per_head,
                                 step0 + j)
            mbarrier.wait(kv_empty, (done & 1) ^ 1)  # a fresh barrier counts as passed
            mbarrier.expect(state.kv_ready, 2 * state.k_desc.nbytes * BOXES)
            load_boxes(state.k_desc, batch, kv_head, key0, state.kv_ready, state.k_smem, state.HEAD_DIM)
            load_boxes(state.v_desc, batch, kv_head, key0, state.kv_ready, state.v_smem, state.HEAD_DIM)
            for j in range(early, steps):
                load_query_block(state, batch, kv_head * state.kv_group + j // per_head, first + j % per_head,
                                 step0 + j)
            step0 += steps
            done += 1


@ll.jit
def persistent_keys_consumer(state, kv_empty, WG: ll.constexpr):
    """Warpgroup WG over the CTA's tiles: each tile's walk (backward_keys.py), K and V
    released, then its dK and dV stored."""
    qk_scale = state.softmax_scale * LOG2E
    tiles, key_blocks = tile_count(state)
    step0 = 0
    done = 0
    # rematerialize: the walk's thread positions (its addresses' lanes and rows) are made
    # in each tile, not held in registers through it (held, ptxas spilled at head_dim 64
    # and 128 beside fp32 dK and dV).
    for round_start in ll.range(0, tiles, ll.num_programs(0), rematerialize=True):
        tile = snaked_tile(round_start)
        if tile < tiles:
            batch, kv_head, key0, first, unmasked, end = tile_query_blocks(state, tile % key_blocks,
                                                                           tile // key_blocks)
            mbarrier.wait(state.kv_ready, done & 1)
            dk, dv = keys_walk(state, batch, kv_head, key0, first, unmasked, end, step0, qk_scale, WG)
            mbarrier.arrive(kv_empty)  # every wgmma reading K or V has been waited
            store_keys_gradients(state, dk, dv, batch, kv_head, key0, WG)
            step0 += state.kv_group * (end - first)
            done += 1
    if state.DQ_TMA:
        tma.store_wait(0)  # dQ's last box is read before the CTA's shared memory goes


@ll.jit
def persistent_keys_consumer_0(state, kv_empty):
    persistent_keys_consumer(state, kv_empty, 0)


@ll.jit
def persistent_keys_consumer_1(state, kv_empty):
    persistent_keys_consumer(state, kv_empty, 1)


@ll.jit
def run_persistent(state, CONSUMERS: ll.constexpr, PRODUCER_REGS: ll.constexpr, CONSUMER_REGS: ll.constexpr):
    """The persistent partitions of backward_keys.py's kernel, with K/V's release barrier."""
    kv_empty = mbarrier.allocate_mbarrier()
    mbarrier.init(kv_empty, count=CONSUMERS)
    if CONSUMERS == 1:
        ll.warp_specialize((state, kv_empty), persistent_producer, (state, kv_empty), [persistent_keys_consumer_0],
                           worker_num_warps=[4], worker_num_regs=[CONSUMER_REGS], default_num_regs=PRODUCER_REGS)
    else:
        ll.warp_specialize((state, kv_empty), persistent_producer, (state, kv_empty),
                           [persistent_keys_consumer_0, persistent_keys_consumer_1], worker_num_warps=[4, 4],
                           worker_num_regs=[CONSUMER_REGS, CONSUMER_REGS], default_num_regs=PRODUCER_REGS)
    mbarrier.invalidate(kv_empty)
