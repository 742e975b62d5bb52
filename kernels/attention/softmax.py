"""The softmax of a key step of the flash-attention kernel (kernels.py), in the registers
of a wgmma accumulator: S's mask, P = exp2(S * scale - m) against a running row max m,
the row sums l, and O's rescale when m moves. Two ways to move m:

- `online_softmax` takes the row max of S first (FlashAttention-2 and 3), with
  RESCALE_ABOVE moving it only in warps where some row grew past m by more than
  2^RESCALE_ABOVE (FlashAttention-4), so that the others skip O's rescale;
- under PingpongConfig.lazy_max, `exps_on_last_max` computes P against the last m before any max
  of S is taken, and only the warps whose row sums say that was unsafe move m: from S,
  held beside P (`max_where_grew`), or from the sums alone (`max_from_sums`).

The helpers take the kernel's aggregates (state.py): `state` (Forward: the problem's sizes
and EXP2_FMA, RESCALE_ABOVE), `tile` (Tile: the warpgroup's first row, Q and qk_scale),
`running` (Running: m and l after the key tile before) and `exps` (Exps: a lazy step's P,
row-sum shares and vote). All of them run on the registers each thread holds (reductions along rows stay within a
warp), so a branch taken warp by warp (`if ll.warp_any(...)`) may hold them.

The row sums l are kept as each thread's share (`thread_sums`, [ROWS, QUAD]): the four
threads of a row's quad hold a quarter of its keys each, and adding those quarters up
takes two shuffles and two adds a row, which a key step need not spend (FlashAttention-3
also sums them once a tile, in `normalizers`). A lazy step's vote (`exps_on_last_max`)
reads the shares too: where no thread's share of a row passed 2^RESCALE_ABOVE, no P did.
"""

from __future__ import annotations

from ... import lowlevel as ll
from .config import ROWS  # rows per consumer warpgroup
from .state import Exps

SHIFT_LIMIT = 120.0  # log2 units a key step moves a row's max by at most (`max_from_sums`)
FIRST_KEYS = 32  # the keys of a row's first tile whose max `first_keys_max` takes
QUAD = 4  # threads of a wgmma accumulator that share a row, each holding 2 of every 8 columns


@ll.jit
def masked(state, tile, s, n):
    """S (key tile n of as many keys as S has columns) with keys past seq_k (and, causal,
    right of the diagonal) at -inf: each row's bound on the key index is computed once,
    then one compare and one select per element. (The column indices include n:
    loop-invariant ones would be hoisted out of the key loop and held in registers across
    it.)"""
    BLOCK_N: ll.constexpr = s.shape[1]
    S_LAYOUT: ll.constexpr = s.layout
    seq_q, seq_k = state.seq_q, state.seq_k
    cols = n * BLOCK_N + ll.arange(0, BLOCK_N, ll.SliceLayout(0, S_LAYOUT))
    if state.CAUSAL:
        rows = tile.row0 + ll.arange(0, ROWS, ll.SliceLayout(1, S_LAYOUT))
        bound = ll.minimum(rows + (seq_k - seq_q + 1), seq_k)  # keys [0, bound) are seen
        return ll.where(cols[None, :] < bound[:, None], s, float("-inf"))
    return ll.where(cols[None, :] < seq_k, s, float("-inf"))


@ll.jit
def thread_sums(p):
    """Each thread's share of P's row sums, [ROWS, QUAD]: column t sums the columns 8 j + 2 t
    and 8 j + 2 t + 1 of P, the ones thread t of the row's quad holds in a wgmma
    accumulator, so no data moves between threads."""
    return ll.sum(ll.sum(ll.reshape(p, [ROWS, p.shape[1] // (2 * QUAD), QUAD, 2]), axis=3), axis=1)


@ll.jit
def zero_shares(BLOCK_N: ll.constexpr, S_LAYOUT: ll.constexpr):
    """The shares (`thread_sums`) of rows that have seen no key: zeros, in the layout the
    shares of a [ROWS, BLOCK_N] S in S_LAYOUT take."""
    return thread_sums(ll.zeros([ROWS, BLOCK_N], ll.float32, S_LAYOUT))


@ll.jit
def per_row(x, shares):
    """A row vector x (in a row slice of S's layout) broadcast over the [ROWS, QUAD] shares."""
    return ll.convert_layout(x, ll.SliceLayout(1, shares.layout))[:, None]


@ll.jit
def row_sums(shares, ROW: ll.constexpr):
    """The whole row sums from the threads' shares, in the row layout ROW (a shuffle and
    an add per row and level of the quad)."""
    return ll.convert_layout(ll.sum(shares, axis=1), ROW)


@ll.jit
def online_softmax(state, tile, running, s):
    """P = exp2(S * scale - m) with m the running row max (log2 units); alpha rescales
    what came before (`running`'s m and l). Rows that have seen no key keep m = -inf and subtract 0 instead,
    so their (all masked) P and alpha come out 0, not NaN. state.EXP2_FMA: the share of P's
    exps computed by FMA polynomials beside the exp unit (see ll.exp2).

    RESCALE_ABOVE (FlashAttention-4's trick; None: m always moves): m moves only in
    warps where some row's max grew past m + RESCALE_ABOVE, so that elsewhere alpha is 1
    and the rescale of O can be skipped (`grew`, uniform over each warp); P stays at most
    2^RESCALE_ABOVE, which bf16/fp16 P and the fp32 sums hold as precisely as values
    below 1. Returns (P, alpha, m, l, grew)."""
    m_i, l_i, qk_scale = running.m_i, running.l_i, tile.qk_scale
    RESCALE_ABOVE: ll.constexpr = state.RESCALE_ABOVE
    m_new = ll.maximum(m_i, ll.max(s, axis=1) * qk_scale)
    grew = None  # without RESCALE_ABOVE O is rescaled at every step
    if RESCALE_ABOVE is not None:
        grew = ll.warp_any(m_new > m_i + RESCALE_ABOVE)
        m_new = ll.where(grew, m_new, m_i)
    m_use = ll.where(m_new == float("-inf"), 0.0, m_new)
    p = ll.exp2(ll.fma(s, qk_scale, -m_use[:, None]), fma_share=state.EXP2_FMA)
    alpha = ll.exp2(m_i - m_use)
    return p, alpha, m_new, l_i * per_row(alpha, l_i) + thread_sums(p), grew


@ll.jit
def first_softmax(state, tile, s):
    """online_softmax of a row's first key tile, where there is no running max yet: m is
    the row max (-inf where every key is masked, with P 0 there), l the row sum, and
    nothing came before to rescale (no alpha, no vote). Returns (P, m, l's shares)."""
    m = ll.max(s, axis=1) * tile.qk_scale
    m_use = ll.where(m == float("-inf"), 0.0, m)
    p = ll.exp2(ll.fma(s, tile.qk_scale, -m_use[:, None]), fma_share=state.EXP2_FMA)
    return p, m, thread_sums(p)


@ll.jit
def first_keys_max(tile, s):
    """A lower bound on each row's max of a first key tile (log2 units), for
    `exps_on_last_max` to compute P against: the max of its first FIRST_KEYS keys only.
    Every thread holds some of those keys of its rows, so it takes FIRST_KEYS / BLOCK_N of
    the row max's compares (the where is known per register at compile time: the others
    fold away) and the same shuffles. Being at most the row's max, it leaves the largest P
    at least 1 (no row underflows); where it is too low, the row sums tell
    (`exps_on_last_max`'s vote). -inf where the row sees no key: masks keep a prefix of
    the keys, so key 0 is seen wherever any is."""
    cols = ll.arange(0, s.shape[1], ll.SliceLayout(0, s.layout))
    return ll.max(ll.where(cols[None, :] < FIRST_KEYS, s, float("-inf")), axis=1) * tile.qk_scale


@ll.jit
def normalizers(shares, ROW: ll.constexpr):
    """(seen, log2(l), 1 / l) of the final row sums l, added up from the threads' shares,
    in the row layout ROW: rows that saw no key (causal, seq_q > seq_k) have seen false,
    and 1 / l is 0 there (O = 0, log-sum-exp +inf, as in FlashAttention). 1 / l is
    2^-log2(l): two exp-unit ops (within 1e-6), where an IEEE division adds a slow-path
    branch to every tile's epilogue."""
    l_i = row_sums(shares, ROW)
    seen = l_i > 0.0
    log2_l = ll.log2(ll.where(seen, l_i, 1.0))
    return seen, log2_l, ll.where(seen, ll.exp2(-log2_l), 0.0)


@ll.jit
def exps_on_last_max(state, tile, s, m_i, SEEN: ll.constexpr = False):
    """The first half of a key step under PingpongConfig.lazy_max, where no row max is taken: P =
    exp2(S * scale - m) against m, the running max of the key tiles before, and each
    thread's share of its row sums (`thread_sums`). A warp none of whose threads' shares
    passed 2^RESCALE_ABOVE (which bounds each P by it, as online_softmax's conditional
    rescale does) keeps m, so O and l need no rescale: the step spends nothing on the
    max, O's rescale or shuffles, and its exps start as soon as S is in. `grew`: the
    warps where a share passed it (scores grew, or overflowed to inf) or a row saw its
    first keys (m = -inf, l and O still 0); they move m (`max_where_grew` from S,
    `max_from_sums` from the sums, where `attend_step` sends an overflow to S computed
    again). With m at least the row's max a row sums to at most its count of keys, so
    RESCALE_ABOVE must exceed log2(BLOCK_N) (PingpongConfig checks it). SEEN: every row has seen
    keys before (m is finite), as in a key tile after the first that needs no mask: no
    select of m and no test for first keys. m: the running max (or, in a row's first key
    tile, `first_keys_max`). Returns an Exps (P, the shares, grew)."""
    m_use = m_i
    limit = 2.0 ** state.RESCALE_ABOVE
    if not SEEN:
        m_use = ll.where(m_i == float("-inf"), 0.0, m_i)
        limit = ll.where(m_i == float("-inf"), 0.0, limit)  # a row's first keys move m
    p = ll.exp2(ll.fma(s, tile.qk_scale, -m_use[:, None]), fma_share=state.EXP2_FMA)
    shares = thread_sums(p)
    if SEEN:
        moves = shares > limit
    else:
        moves = shares > per_row(limit, shares)
    return Exps(p, shares, ll.warp_any(moves))


@ll.jit
def max_where_grew(state, tile, running, s, exps):
    """The second half (`exps_on_last_max`) where S is still live (LAZY_MAX "scores"): in
    the warps where `exps.grew`, m moves to the exact running max, P is computed again and
    alpha = 2^(m_old - m_new) rescales l and O (`running`'s m, l and acc; acc None before
    the first P V) in the same branch; elsewhere m, l and O stay. (Rescaling O in a branch
    of its own, after this one, carried alpha out of it: two register copies in every
    step.) A P that overflowed is computed again too. l and the shares are the threads'
    shares of the row sums. Returns (P, m, l, O)."""
    p, shares, grew = exps.p, exps.shares, exps.grew
    m_i, l_i, acc, qk_scale = running.m_i, running.l_i, running.acc, tile.qk_scale
    EXP2_FMA: ll.constexpr = state.EXP2_FMA
    if grew:
        m_new = ll.maximum(m_i, ll.max(s, axis=1) * qk_scale)
        m_use = ll.where(m_new == float("-inf"), 0.0, m_new)
        p = ll.exp2(ll.fma(s, qk_scale, -m_use[:, None]), fma_share=EXP2_FMA)
        shares = thread_sums(p)
        alpha = ll.exp2(m_i - m_use)
        l_i = l_i * per_row(alpha, l_i)
        if acc is not None:
            acc = rescaled(acc, alpha, None, None)
        m_i = m_new
    return p, m_i, l_i + shares, acc


@ll.jit
def max_from_sums(state, running, exps):
    """The second half (`exps_on_last_max`), without S: in the warps where `exps.grew`, the m
    of a row whose sum passed 2^RESCALE_ABOVE (or that saw its first keys) moves up by
    log2 of its sum (at most SHIFT_LIMIT), P and l scale down by alpha = 2^(m_old - m_new)
    (so the row's P now sums to 1, or stays below 2^8) and O after (`rescaled`);
    elsewhere m and l stay and alpha is 1. The new m is no more than log2(BLOCK_N) above
    the row's max nor 8 below it, which P tolerates as it does any m: S is not needed, so
    it does not stay live beside P (at head_dim 64 that spilled). A P that overflowed to
    inf is not handled here (`recomputed_max`). l (`running`'s) and the shares are the
    threads' shares of the row sums, added up here only where the warp grew. Returns (P,
    alpha, m, l)."""
    p, shares, grew = exps.p, exps.shares, exps.grew
    m_i, l_i = running.m_i, running.l_i
    RESCALE_ABOVE: ll.constexpr = state.RESCALE_ABOVE
    ROW: ll.constexpr = ll.SliceLayout(1, p.layout)
    alpha = m_i  # a placeholder where the max stays
    if grew:
        row = row_sums(shares, ROW)
        moved = (row > 2.0 ** RESCALE_ABOVE) | ((m_i == float("-inf")) & (row > 0.0))
        m_base = ll.where(m_i == float("-inf"), 0.0, m_i)  # what P was computed against
        # Moved by at most SHIFT_LIMIT, so that alpha stays a normal float (exp2 flushes
        # those below 2^-126 to 0); P, at most a finite sum < 2^128, still ends below 2^8.
        m_new = ll.where(moved, m_base + ll.minimum(ll.log2(row), SHIFT_LIMIT), m_base)
        alpha = ll.exp2(m_base - m_new)  # 1 where the row's m stays
        p = p * alpha[:, None]
        l_i = l_i * per_row(alpha, l_i)
        shares = shares * per_row(alpha, shares)
        m_i = ll.where(moved, m_new, m_i)
    return p, alpha, m_i, l_i + shares


@ll.jit
def recomputed_max(state, tile, running, k_tile):
    """Where a row's scores passed its m by 2^128 its P sums to inf, which says nothing of
    its max (`max_from_sums`): this warp's rows of S = Q K^T computed again by the warp
    alone (ll.mma_v2, reading `tile`'s Q and `k_tile` from shared memory), then P against the
    exact running max. Warp by warp, so that the other warps neither wait nor vote (a
    warpgroup-wide vote before a wgmma would make every step pay for a rare case). The unmasked key
    tiles it serves leave every score finite, so m is. Returns (P, alpha, m, row sums)."""
    m_i, qk_scale = running.m_i, tile.qk_scale
    # mma.sync's accumulator over 4 warps x 16 rows: the same registers as the wgmma one.
    WARP_S: ll.constexpr = ll.NVMMADistributedLayout([2, 0], [4, 1], [16, 8])
    s = ll.mma_v2(tile.q, k_tile.permute((1, 0)), ll.zeros([ROWS, k_tile.shape[0]], ll.float32, WARP_S))
    # Q and K were read through the generic proxy; TMA (the async proxy) overwrites them
    # once they are released: fence before that (the emulator checks it).
    ll.fence_async_shared()
    m_new = ll.maximum(m_i, ll.max(s, axis=1) * qk_scale)
    p = ll.exp2(ll.fma(s, qk_scale, -m_new[:, None]), fma_share=state.EXP2_FMA)
    return p, ll.exp2(m_i - m_new), m_new, thread_sums(p)


@ll.jit
def rescaled(acc, alpha, grew, RESCALE_ABOVE: ll.constexpr):
    """O * alpha per row; with RESCALE_ABOVE, only in the warps whose max moved (alpha
    is 1 in the others)."""
    alpha = ll.convert_layout(alpha, ll.SliceLayout(1, acc.layout))[:, None]
    if RESCALE_ABOVE is None:
        return acc * alpha
    if grew:  # an ll.warp_any result: each warp branches on its own
        acc = acc * alpha
    return acc
