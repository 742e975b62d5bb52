"""A consumer warpgroup's key steps in the flash-attention kernel (kernels.py): S_0 and its
softmax, each later key tile's two GEMMs and softmax, the last P V, a key tile it only
releases, and the accumulator layout they share. kernels.attend_tile runs them for the
warpgroup's rows of a query tile."""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import mbarrier
from .config import ROWS  # rows per consumer warpgroup
from .rings import pass_turn, release_slot, ring_phase, ring_slot, take_turn
from .softmax import (exps_on_last_max, first_keys_max, first_softmax, masked, max_from_sums, max_where_grew,
                      normalizers, online_softmax, per_row, recomputed_max, rescaled, zero_shares)
from .state import Running
from .tiles import warpgroup

@ll.constexpr_function
def accumulator_layout(columns):
    """The wgmma accumulator layout of a warpgroup's [64, columns] tile (S, P or O): four
    warps of 16 rows each."""
    return ll.NVMMADistributedLayout([3, 0], [4, 1], [16, columns, 16])


@ll.jit
def release_step(state, step, turn, WG: ll.constexpr):
    """A key tile (at ring position `step`) which this warpgroup's rows do not see but
    others of the CTA do: free the slot, keeping the turn order (its turn-th) in causal
    tiles (`turn_takers`). Waiting for `ready` first makes the `empty` arrive count toward
    this tile's phase, not the slot's previous one."""
    rings = state.rings
    slot = ring_slot(step, rings.STAGES)
    wg = warpgroup(WG)
    if state.CAUSAL:
        take_turn(rings.turns, turn, wg)
        pass_turn(rings.turns, wg, rings.CONSUMERS, rings.PER_WARP)
    mbarrier.wait(rings.k_ready.index(slot), ring_phase(step, rings.STAGES))
    release_slot(rings.k_empty.index(slot), rings.PER_WARP, rings.CLUSTER)
    mbarrier.wait(rings.v_ready.index(slot), ring_phase(step, rings.STAGES))
    release_slot(rings.v_empty.index(slot), rings.PER_WARP, rings.CLUSTER)


@ll.jit
def attend_step(state, tile, n, step, turn, running, BLOCK_N: ll.constexpr, WG: ll.constexpr, wg,
                MASKED: ll.constexpr, S_LAYOUT: ll.constexpr):
    """Key tile n, at ring position `step` and this warpgroup's (wg's: `warpgroup(WG)`,
    read once before the key loop, so that replicated consumers hold it in a uniform
    register; None: read again here, at every step) turn-th turn among the tile's active
    warpgroups (`tile`: a state.Tile): issue S_n = Q K_n^T and O += P_{n-1} V_{n-1}, softmax S_n while the second
    GEMM runs, then rescale O. BLOCK_N keys: the ring tile's, or the first
    half of them (a half tile, whose n counts tiles of that size: its mask's columns).
    `state`: the kernel's (state.Forward); `running`: O, P, m and l after the key
    tile before (state.Running), as it returns them after this one."""
    acc, p_op, m_i, l_i = running.acc, running.p_op, running.m_i, running.l_i
    q, active = tile.q, tile.active
    rings = state.rings
    O_LAYOUT: ll.constexpr = accumulator_layout(state.HEAD_DIM)
    RESCALE_ABOVE: ll.constexpr = state.RESCALE_ABOVE
    LAZY_MAX: ll.constexpr = state.LAZY_MAX
    slot = ring_slot(step, rings.STAGES)
    prev = ring_slot(step - 1, rings.STAGES)
    if wg is None:
        wg = warpgroup(WG)
    take_turn(rings.turns, turn, wg)
    mbarrier.wait(rings.k_ready.index(slot), ring_phase(step, rings.STAGES))
    k_tile = first_keys(rings.k.index(slot).index(0).index(0), BLOCK_N)
    s = ll.warpgroup_mma(q, k_tile.permute((1, 0)), ll.zeros([ROWS, BLOCK_N], ll.float32, S_LAYOUT),
                         use_acc=False, is_async=True)
    mbarrier.wait(rings.v_ready.index(prev), ring_phase(step - 1, rings.STAGES))
    acc = ll.warpgroup_mma(p_op, rings.v.index(prev).index(0).index(0), acc, is_async=True)
    pass_turn(rings.turns, wg, active, rings.PER_WARP)
    s = ll.warpgroup_mma_wait(1, deps=[s])
    # LAZY_MAX "sums" moves the max without S, so a key tile that needs no mask is
    # released only once its P is known not to have overflowed; masked ones (a row's
    # last or a diagonal one) take the max as without LAZY_MAX.
    SUMS: ll.constexpr = LAZY_MAX == "sums"
    LAZY: ll.constexpr = LAZY_MAX == "scores" or (SUMS and not MASKED)
    if not (LAZY and SUMS):
        release_slot(rings.k_empty.index(slot), rings.PER_WARP, rings.CLUSTER)
    if MASKED:
        s = masked(state, tile, s, n)
    if LAZY:  # P in 32 bits until after the wait: the last P V still reads P's registers
        # Rows that reach a key tile needing no mask saw all of key tile 0 (masks keep a
        # prefix of the keys): m is finite.
        exps = exps_on_last_max(state, tile, s, m_i, SEEN=not MASKED)
        acc = ll.warpgroup_mma_wait(0, deps=[acc])
        release_slot(rings.v_empty.index(prev), rings.PER_WARP, rings.CLUSTER)
    if LAZY and SUMS:
        # A row whose scores passed its running max by 2^128 has P = inf, and no S to
        # take the max from: its warp (almost never) computes its rows of S again from K,
        # released only after (`recomputed_max`). P is converted in each branch: they
        # then join on its 16-bit registers (joined on P in 32 bits, head_dim 64 spilled).
        # A thread's share of the row sum tells (finite P whose share overflowed go that
        # way too; where only the whole row sum would overflow, `max_from_sums` serves).
        if ll.warp_any(exps.shares == float("inf")):
            p, alpha, m_i, shares = recomputed_max(state, tile, running, k_tile)
            l_i = l_i * per_row(alpha, l_i) + ll.convert_layout(shares, l_i.layout)
            acc = rescaled(acc, alpha, None, None)
            p_op = p_operand(p, q.dtype, O_LAYOUT)
        else:
            p, alpha, m_i, l_i = max_from_sums(state, running, exps)
            acc = rescaled(acc, alpha, exps.grew, RESCALE_ABOVE)
            p_op = p_operand(p, q.dtype, O_LAYOUT)
        release_slot(rings.k_empty.index(slot), rings.PER_WARP, rings.CLUSTER)
    else:
        if LAZY:  # "scores": S is live, the max is taken from it (and O rescaled) where rows grew
            p, m_i, l_i, acc = max_where_grew(state, tile, Running(acc, p_op, m_i, l_i), s, exps)
        else:
            p, alpha, m_i, l_i, grew = online_softmax(state, tile, running, s)
            acc = ll.warpgroup_mma_wait(0, deps=[acc])
            release_slot(rings.v_empty.index(prev), rings.PER_WARP, rings.CLUSTER)
            acc = rescaled(acc, alpha, grew, RESCALE_ABOVE)
        p_op = p_operand(p, q.dtype, O_LAYOUT)
    return Running(acc, p_op, m_i, l_i)


@ll.jit
def first_keys(tile, KEYS: ll.constexpr):
    """The first KEYS rows of a K or V ring tile (a view; the whole tile where it has no more)."""
    if tile.shape[0] == KEYS:
        return tile
    return tile.slice(0, KEYS, 0)


@ll.jit
def last_pv(running, rings, last_step, ROW: ll.constexpr):
    """The tile's last O += P V (`running`'s P, of the key tile at ring position last_step,
    of as many keys as P has columns), with the normalizers of its l (the threads' shares
    of the row sums) computed while it runs, in the row layout ROW: (O, seen, log2 l, 1 / l)."""
    p_op, acc, l_i = running.p_op, running.acc, running.l_i
    last = ring_slot(last_step, rings.STAGES)
    mbarrier.wait(rings.v_ready.index(last), ring_phase(last_step, rings.STAGES))
    v_tile = first_keys(rings.v.index(last).index(0).index(0), p_op.shape[1])
    acc = ll.warpgroup_mma(p_op, v_tile, acc, is_async=True)
    seen, log2_l, inv_l = normalizers(l_i, ROW)  # l is final: while the last P V runs
    acc = ll.warpgroup_mma_wait(0, deps=[acc])
    release_slot(rings.v_empty.index(last), rings.PER_WARP, rings.CLUSTER)
    return acc, seen, log2_l, inv_l


@ll.jit
def p_operand(p, dtype: ll.constexpr, O_LAYOUT: ll.constexpr):
    """P in 16 bits as the A operand of O += P V, from the registers it is in (no data
    moves: the S accumulator's layout is the operand's)."""
    return ll.convert_layout(p.to(dtype), ll.DotOperandLayout(0, O_LAYOUT, 2))


@ll.jit
def first_step_softmax(state, tile, s, full):
    """Key tile 0's softmax, once S_0 (at ring position tile.step) is in: the K slot
    released, the mask where the tile needs one (`full` 0), and P against the row max
    (LAZY_MAX: against the max of the first keys, the exact one only in warps where a
    row grew past it). Returns (P as the operand of P V, m, l's shares: `thread_sums`)."""
    S_LAYOUT: ll.constexpr = accumulator_layout(state.BLOCK_N)
    O_LAYOUT: ll.constexpr = accumulator_layout(state.HEAD_DIM)
    rings = state.rings
    release_slot(rings.k_empty.index(ring_slot(tile.step, rings.STAGES)), rings.PER_WARP, rings.CLUSTER)
    if full == 0:  # only then does key tile 0 need a mask; no GEMM of this warpgroup hides it
        s = masked(state, tile, s, 0)
    if state.LAZY_MAX:
        # P against the max of the tile's first keys, a lower bound on the row's; the
        # warps with a row that passed it by 2^RESCALE_ABOVE take the max from S, held
        # beside P at every head dim here (O is not live yet, nor a P V in flight).
        m_i = first_keys_max(tile, s)
        exps = exps_on_last_max(state, tile, s, m_i)
        # No O yet (nor P V): m and l alone move where rows grew.
        before = Running(None, None, m_i, zero_shares(state.BLOCK_N, S_LAYOUT))
        p, m_i, l_i, _ = max_where_grew(state, tile, before, s, exps)
    else:
        p, m_i, l_i = first_softmax(state, tile, s)
    return p_operand(p, state.q_desc.dtype, O_LAYOUT), m_i, l_i
