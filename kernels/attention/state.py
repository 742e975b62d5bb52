"""The state the flash-attention kernel (kernels.py) hands its partitions and helpers, as
aggregates: the whole kernel's (`Forward`: descriptors, shared buffers, problem sizes
and compile-time choices) and, inside it, the K/V ring's (`Rings`), which the key steps
(steps.py) take alone, as does the simple kernel (simple.py)."""

from __future__ import annotations

from ... import lowlevel as ll
from ...lowlevel import tma  # noqa: F401  (the descriptor fields' annotation)


@ll.aggregate
class Rings:
    """The K/V ring: STAGES slots of a K tile and a V tile, each slot with a `ready`
    mbarrier (the TMA bytes land on it) and an `empty` one (each consumer warpgroup
    releases it: warp by warp with PER_WARP, on both CTAs' barriers in a CLUSTER of two),
    and the `turns` barriers on which the CONSUMERS warpgroups pass the turn to issue
    GEMMs (rings.py; None in the simple kernel, whose one consumer partition takes no
    turns)."""
    k: ll.shared_memory_descriptor
    v: ll.shared_memory_descriptor
    k_ready: ll.shared_memory_descriptor
    k_empty: ll.shared_memory_descriptor
    v_ready: ll.shared_memory_descriptor
    v_empty: ll.shared_memory_descriptor
    turns: ll.shared_memory_descriptor
    STAGES: ll.constexpr
    CONSUMERS: ll.constexpr
    PER_WARP: ll.constexpr
    CLUSTER: ll.constexpr


@ll.aggregate
class Forward:
    """Everything the producer and consumers share (flash_attention_fa3's parameters,
    named as there): the TMA descriptors, the Q ring (Q_BUFFERS warpgroup-sized Q buffers
    with their `ready`/`empty` barriers and the tile fields published with each), the O
    buffers (O_BUFFER; else o_smem is the Q ring), the K/V `rings`, the problem's sizes
    and the kernel's compile-time choices (the ring's own, STAGES, PER_WARP and
    CLUSTER, are in `rings`)."""
    q_desc: tma.tensor_descriptor
    k_desc: tma.tensor_descriptor
    v_desc: tma.tensor_descriptor
    o_desc: tma.tensor_descriptor
    q_smem: ll.shared_memory_descriptor
    o_smem: ll.shared_memory_descriptor
    rings: Rings
    q_ready: ll.shared_memory_descriptor
    q_empty: ll.shared_memory_descriptor
    tile_smem: ll.shared_memory_descriptor
    lse_ptr: ll.tensor
    counter_ptr: ll.tensor
    softmax_scale: ll.tensor
    seq_q: ll.tensor
    seq_k: ll.tensor
    heads: ll.tensor
    kv_group: ll.tensor
    num_m_tiles: ll.tensor
    batch_heads: ll.tensor
    group: ll.tensor
    HEAD_DIM: ll.constexpr
    BLOCK_N: ll.constexpr
    CONSUMERS: ll.constexpr
    CAUSAL: ll.constexpr
    WRITE_LSE: ll.constexpr
    O_BUFFER: ll.constexpr
    Q_BUFFERS: ll.constexpr
    EXP2_FMA: ll.constexpr
    RESCALE_ABOVE: ll.constexpr
    CLAIM_AHEAD: ll.constexpr
    LAZY_MAX: ll.constexpr
    DYNAMIC: ll.constexpr
    HALF_TILES: ll.constexpr


@ll.aggregate
class Running:
    """A consumer warpgroup's online softmax between its key steps (steps.attend_step):
    O's accumulator, the last key tile's P as the operand of the P V still to issue, the
    rows' running max m (log2 units) and l as the threads' shares of the row sums."""
    acc: ll.tensor
    p_op: ll.tensor
    m_i: ll.tensor
    l_i: ll.tensor


@ll.aggregate
class Tile:
    """A consumer warpgroup's rows of a query tile, as its key steps (steps.attend_step)
    see them: its Q buffer, its first row, the ring position of its key tile 0 and its
    turn there (`take_turn`), the warpgroups the turn goes round (`turn_takers`), and
    softmax_scale * log2(e)."""
    q: ll.shared_memory_descriptor
    row0: ll.tensor
    step: ll.tensor
    turn: ll.tensor
    active: ll.tensor
    qk_scale: ll.tensor


@ll.aggregate
class QueryTile:
    """A query tile as a consumer warpgroup gets it from the producer (`publish_tile`): its
    (batch, head), the CTA tile's first row `off_m`, and the slot of the Q buffer that holds
    this warpgroup's rows (O leaves through it unless O_BUFFER)."""
    batch: ll.tensor
    head: ll.tensor
    off_m: ll.tensor
    q_slot: ll.tensor


@ll.aggregate
class Output:
    """A consumer warpgroup's finished rows of a query tile, for `store_tile`: O's
    accumulator (not yet divided by l), the rows' running max m (log2 units) and the
    normalizers of their sums (`normalizers`: seen, log2 l, 1 / l)."""
    acc: ll.tensor
    m_i: ll.tensor
    seen: ll.tensor
    log2_l: ll.tensor
    inv_l: ll.tensor


@ll.aggregate
class Exps:
    """The first half of a lazy key step (`exps_on_last_max`): P against the last running
    max, each thread's share of its row sums, and the per-warp vote `grew` (the warps whose
    max must move)."""
    p: ll.tensor
    shares: ll.tensor
    grew: ll.tensor
