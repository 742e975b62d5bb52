"""The host side of the flash-attention backward: checks with readable errors, the three
launches (backward.py: the row deltas, the main kernel, dQ's conversion) and the float64
numpy reference gradients."""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass

import numpy as np

from ...compiler.hardware import SHARED_LIMIT, SM_SHARED
from .._launch import persistent_grid
from ...runtime.host_arrays import check_arrays, contiguous, element_strides, new_array
from .backward import DQ_CHUNK, ROW_TILE_ROWS, convert_dq, flash_attention_backward_kernel, row_deltas
from .backward_keys import dq_box_rows, flash_attention_backward_keys_kernel
from .config import HEAD_DIMS
from .host import (_as_bhsd, _check_inputs, _descriptor, _host64, _kind, _layout_words, _scaled_queries, _tma_ready,
                   reference_probabilities)


DQ_REDUCES = ("atomics", "tma")
SPLITS = ("columns", "keys")
RELEASES = ("thread", "warp", "partition")  # BackwardConfig.releases: backward.py's THREAD_RELEASES, ...


@dataclass(frozen=True)
class BackwardConfig:
    """The main kernel's tiles: BLOCK_N keys a CTA, BLOCK_M query rows a step, a ring of
    `stages` Q/dO slots, `consumers` warpgroups each holding `head_dim / (consumers *
    launches)` columns of dK and dV in fp32 registers, `launches` kernels splitting
    head_dim's columns between them (each computes S and dP for the whole head),
    setmaxnreg budgets, and how dQ's fp32 accumulator in global memory is added to
    (`dq_reduce`): "atomics" (each thread's elements) or "tma" (each consumer's fp32 box
    through shared memory, by TMA reduce-add), and whether the walk is software-pipelined
    (backward_pipeline.py: two Q/dO slots held at a time, so stages >= 2). `split` is what
    the consumer warpgroups divide: "columns" (backward.py) or "keys" (backward_keys.py:
    each owns 64 keys of the block, BLOCK_N = 64 * consumers, and all head_dim columns of
    their dK and dV; one launch, not pipelined; see keys_split_config). `split_scores`
    (split="keys", one band of 64 keys shared by two consumers: block_n 64, head_dim 128
    or 256) has one consumer compute the band's S^T and P^T and the other its dP^T and
    dS^T, P^T handed over through shared memory, in place of both computing both.
    `stats_in_shared` (split="keys") has the producer stage each query block's L and delta
    in shared memory beside Q and dO, where the consumers read them as they use them, not
    held in registers (32 a thread each at block_m 128, by column): block_m 128 (head_dim 64,
    FA3's 128 x 128) needs it. `releases` (split="keys"): who arrives on the mbarriers of the
    handoffs made of ordinary shared loads and stores (the staged stats, split_scores's P^T):
    "thread" (each thread for its own accesses: what compute-sanitizer's racecheck follows),
    "warp" (one lane a warp after its warp's sync) or "partition" (one thread after a named
    barrier), which racecheck does not follow (it reports the handoffs' reuse, although the
    GPU orders it); at head_dim 256 causal "partition" ran 7% faster than "thread" on an H200,
    elsewhere level (docs/attention-journal.md). `p_releases` the same for split_scores's P^T
    alone (None: as `releases`). `persistent` (split="keys", backward_persistent.py): at
    most one wave of CTAs, each walking tiles of (key block, batch * kv head) in the
    launch's order, the next tile's Q/dO and K/V loaded under this one's last steps;
    `persistent_ctas` caps its CTA count (None: as many as the SMs hold at once)."""

    head_dim: int
    block_m: int = 64
    block_n: int = 64
    stages: int = 2
    consumers: int = 1
    launches: int = 1
    producer_regs: int = 24
    consumer_regs: int = 240
    ctas_per_sm: int = 1
    dq_reduce: str = "atomics"
    pipelined: bool = False
    split: str = "columns"
    split_scores: bool = False
    stats_in_shared: bool = False
    releases: str = "thread"
    p_releases: str | None = None
    persistent: bool = False
    persistent_ctas: int | None = None

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(f"BackwardConfig.split must be one of {SPLITS}, got {self.split!r}")
        for field in ("releases", "p_releases"):
            if getattr(self, field) not in RELEASES + ((None,) if field == "p_releases" else ()):
                raise ValueError(f"BackwardConfig.{field} must be one of {RELEASES}, got {getattr(self, field)!r}")
        if (self.persistent and self.split != "keys") or (self.persistent_ctas is not None and not self.persistent):
            raise ValueError(f"BackwardConfig: persistent is an option of split='keys', and persistent_ctas of "
                             f"persistent=True, got split {self.split!r}, persistent {self.persistent}, "
                             f"persistent_ctas {self.persistent_ctas}")
        if self.persistent_ctas is not None and self.persistent_ctas < 1:
            raise ValueError(f"BackwardConfig.persistent_ctas must be at least 1, got {self.persistent_ctas}")
        if self.split == "keys":
            self._check_keys_split()
        elif self.split_scores:
            raise ValueError("BackwardConfig: split_scores is an option of split='keys'")
        elif self.stats_in_shared:
            raise ValueError("BackwardConfig: stats_in_shared is an option of split='keys'")
        elif (self.releases, self.p_releases) != ("thread", None):
            raise ValueError("BackwardConfig: releases and p_releases are options of split='keys'")
        elif (self.block_m, self.block_n) != (64, 64):
            raise ValueError(f"BackwardConfig: block_m and block_n must be 64 (one wgmma M), got "
                             f"{self.block_m} and {self.block_n}")
        if self.dq_reduce not in DQ_REDUCES:
            raise ValueError(f"BackwardConfig.dq_reduce must be one of {DQ_REDUCES}, got {self.dq_reduce!r}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"BackwardConfig.head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.consumers not in (1, 2) or self.launches not in (1, 2) \
                or (self.split == "columns" and self.head_dim % (64 * self.consumers * self.launches)):
            raise ValueError(f"BackwardConfig: consumers and launches must be 1 or 2 and leave each consumer a "
                             f"multiple of 64 of head_dim {self.head_dim}'s columns, got {self.consumers} and "
                             f"{self.launches}")
        if self.ctas_per_sm not in (1, 2) or \
                128 * (self.producer_regs + self.consumers * self.consumer_regs) > self.register_cap * self.threads:
            raise ValueError(f"BackwardConfig: {self.consumers} consumers at {self.consumer_regs} registers "
                             f"and a producer at {self.producer_regs} pass the register file's share of "
                             f"{self.ctas_per_sm} CTA(s) an SM (ctas_per_sm 1 or 2)")
        if self.pipelined and self.stages < 2:
            raise ValueError("BackwardConfig: the pipelined walk holds two Q/dO slots at a time: it needs "
                             f"stages >= 2, got {self.stages}")
        limit = SHARED_LIMIT if self.ctas_per_sm == 1 else SM_SHARED // self.ctas_per_sm - 1024
        if self.shared_bytes > limit:
            boxes = ", dQ's boxes" if self.dq_reduce == "tma" else ""
            raise ValueError(f"BackwardConfig: {self.shared_bytes} bytes of shared memory (K, V, {self.stages} "
                             f"Q/dO slots, P, dS{boxes}) pass the {limit} a CTA has at {self.ctas_per_sm} CTA(s) "
                             f"an SM; use fewer stages")

    def _check_keys_split(self):
        """split="keys": bands of 64 keys, each shared by consumers that split its dK and
        dV columns (fp32 registers: 128 columns a consumer at most), one launch."""
        bands = self.block_n // 64
        if self.block_m == 128 and not (self.stats_in_shared and self.head_dim == 64):
            raise ValueError(f"BackwardConfig(split='keys', block_m=128): head_dim 64 with stats_in_shared=True "
                             f"(L and delta by column take 32 registers a thread each otherwise; dK and dV past "
                             f"head_dim 64 leave no room for 128 query columns of S^T and dP^T), got head_dim "
                             f"{self.head_dim}, stats_in_shared {self.stats_in_shared}")
        if self.block_m not in (64, 128) or self.block_n not in (64, 128) or self.consumers % bands \
                or self.launches != 1 or self.pipelined:
            raise ValueError(f"BackwardConfig(split='keys'): block_m 64 (or 128), block_n 64 or 128 (a band of 64 "
                             f"keys a consumer, or several), one launch and the plain walk, got block_m "
                             f"{self.block_m}, block_n {self.block_n}, {self.consumers} consumer(s), launches "
                             f"{self.launches}, pipelined {self.pipelined}")
        if self.split_scores and (self.block_n, self.consumers) != (64, 2):
            raise ValueError(f"BackwardConfig(split_scores=True): one band of 64 keys shared by two consumers "
                             f"(block_n 64, consumers 2), got block_n {self.block_n}, {self.consumers} consumer(s)")
        if self.columns not in (64, 128):
            raise ValueError(f"BackwardConfig(split='keys'): each consumer would hold {self.columns} columns of "
                             f"dK and dV (fp32 registers); it takes 64 or 128: give each band of keys more "
                             f"consumers (past 128) or fewer (under 64)")

    @property
    def shared_bytes(self) -> int:
        """The main kernel's shared buffers (2-byte q dtype), with room for its mbarriers."""
        scores = 1 if self.split == "keys" else 2  # P goes through shared memory too, or only dS
        tiles = 2 * (2 * self.block_n * self.head_dim + 2 * self.stages * self.block_m * self.head_dim
                     + scores * self.block_m * self.block_n)
        dq_boxes = 4 * self.consumers * self.dq_box_rows * DQ_CHUNK if self.dq_reduce == "tma" else 0
        handed_p = 4 * self.block_n * self.block_m if self.split_scores else 0  # fp32 P^T
        stats = 4 * 2 * self.stages * self.block_m if self.stats_in_shared else 0  # fp32 L and delta a slot
        return tiles + dq_boxes + handed_p + stats + 128

    @property
    def dq_box_rows(self) -> int:
        """Rows of a consumer's dQ box (dq_reduce "tma"): 64 where split="keys" consumers
        split dQ's rows (head_dim 64 at block_m 128), else block_m."""
        return dq_box_rows(self.block_m, self.head_dim, self.consumers) if self.split == "keys" else self.block_m

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    @property
    def register_cap(self) -> int:
        """Registers a thread at launch: an SM's 64K shared by ctas_per_sm CTAs (the
        setmaxnreg budgets share this pool)."""
        return min(255, 65536 // self.ctas_per_sm // self.threads) // 8 * 8

    def launch_options(self) -> dict:
        """maxnreg where several CTAs share an SM (as the forward's Config.ctas_per_sm)."""
        return dict(maxnreg=self.register_cap) if self.ctas_per_sm > 1 else {}

    @property
    def columns(self) -> int:
        """Columns of dK, dV and dQ each consumer warpgroup holds (split="keys": of dK
        and dV, for its band of 64 keys)."""
        if self.split == "keys":
            return self.head_dim * (self.block_n // 64) // self.consumers
        return self.head_dim // (self.consumers * self.launches)


# head_dim -> the keys split's tiles (BackwardConfig fields) with dQ by TMA reduce-add: two
# consumers, each a band of 64 keys with all its columns at 64 and 128 (BLOCK_N = 128: S^T
# and dP^T computed once per CTA); at 256 both on one band of 64 keys, 128 columns each,
# with split_scores (one computes the band's S^T and P^T, the other dP^T and dS^T: five
# GEMMs a step where each computing both took seven), one Q/dO slot where dQ's boxes take
# the room of a second. At every head_dim L and delta are staged by the producer and read
# from shared memory where used (stats_in_shared): loaded by the consumers, their global loads'
# latency was the largest stall of the step (Nsight Compute at 128). At 64 that also lets
# 128 query rows a step (FA3's tile) fit the registers. The CTAs are persistent
# (backward_persistent.py): one wave walking the tiles, the Q/dO ring running on from one
# tile into the next; on H200s it ran 1.00x-1.06x the one-CTA-a-tile launch at 1k tokens
# and level to 1.03x at 4k, most where causal (docs/attention-journal.md).
# benchmarks/sweep_attention_backward.py times the alternatives.
KEYS_SPLIT_TILES = {
    64: dict(block_m=128, block_n=128, consumers=2, stages=2, stats_in_shared=True, persistent=True),
    128: dict(block_n=128, consumers=2, stages=2, stats_in_shared=True, persistent=True),
    256: dict(block_n=64, consumers=2, stages=1, split_scores=True, stats_in_shared=True, persistent=True),
}


def keys_split_config(head_dim: int, dq_reduce: str = "tma") -> BackwardConfig:
    """head_dim's split="keys" config (KEYS_SPLIT_TILES); with dQ by atomics, which need
    no boxes in shared memory, a second Q/dO slot where the tiles have one."""
    if head_dim not in KEYS_SPLIT_TILES:
        raise ValueError(f"BackwardConfig.head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    config = BackwardConfig(head_dim=head_dim, dq_reduce=dq_reduce, split="keys", **KEYS_SPLIT_TILES[head_dim])
    if dq_reduce == "atomics" and config.stages == 1:
        return dataclasses.replace(config, stages=2)
    return config


def default_backward_config(head_dim: int, dq_reduce: str = "tma", pipelined: bool = False) -> BackwardConfig:
    """head_dim's keys split (keys_split_config), or with `pipelined` its columns split
    (columns_split_config: only that layout has a pipelined walk). In one run on H200s the
    keys split ran the backward 1.1x (head_dim 64), 1.3x (128) and 1.4x (256) as fast as
    the columns split, causal and not (docs/attention-journal.md)."""
    if pipelined:
        return columns_split_config(head_dim, dq_reduce, pipelined=True)
    return keys_split_config(head_dim, dq_reduce)


def columns_split_config(head_dim: int, dq_reduce: str = "tma", pipelined: bool = False) -> BackwardConfig:
    """64 columns of dK and dV a consumer warpgroup: one at head_dim 64, two from 128 on, in
    two launches at 256. 128 columns (fp32 dK and dV in 128 registers a thread) beside S,
    dP and the step's addresses leave ptxas too few of 240 registers (it spills), so the
    warpgroups and launches split the columns, each computing S and dP for all of them.
    keys_split_config is the other layout (backward_keys.py, FA3's): the warpgroups split
    the keys and hold all 128 columns, in 240 registers without spills, because P^T and
    dS^T stay in the registers S^T and dP^T came in and no descriptor of a fixed buffer is
    held through the walk.
    `dq_reduce` and `pipelined` pick dQ's accumulation and the walk (BackwardConfig). dQ goes
    by TMA reduce-add by default: on an H100 it ran the backward 1.6-2.5x faster than
    per-element atomics at every head_dim (docs/attention-journal.md), even at head_dim 256,
    where its boxes leave room for one Q/dO slot only. The pipelined walk was level or slower
    there, so it stays off. The pipelined walk holds two Q/dO slots, so it gets a third where shared memory has room,
    for the producer to fill while the consumers hold two."""
    if head_dim == 64:  # two CTAs an SM: one's loads and atomics overlap the other's GEMMs
        config = BackwardConfig(head_dim=64, consumer_regs=224, ctas_per_sm=2, dq_reduce=dq_reduce)
    else:
        # head_dim 256's K, V and two Q/dO slots leave no room for dQ's boxes: one slot then.
        stages = 1 if head_dim == 256 and dq_reduce == "tma" else 2
        config = BackwardConfig(head_dim=head_dim, consumers=2, launches=head_dim // 128, stages=stages,
                                dq_reduce=dq_reduce)
    if not pipelined:
        return config
    try:
        return dataclasses.replace(config, stages=3, pipelined=True)
    except ValueError:  # no room for a third slot
        return dataclasses.replace(config, pipelined=True)


def backward_kernel(config: BackwardConfig):
    """The main kernel that runs a config: backward.py's, or backward_keys.py's."""
    return flash_attention_backward_keys_kernel if config.split == "keys" else flash_attention_backward_kernel


def backward_constexprs(config: BackwardConfig, causal: bool, launch: int = 0) -> dict:
    """The main kernel's compile-time arguments for a config's launch-th launch."""
    if config.split == "keys":
        return dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, HEAD_DIM=config.head_dim,
                    STAGES=config.stages, CONSUMERS=config.consumers, CAUSAL=causal,
                    PRODUCER_REGS=config.producer_regs, CONSUMER_REGS=config.consumer_regs,
                    COLUMNS=config.columns, **(dict(DQ_TMA=True) if config.dq_reduce == "tma" else {}),
                    **(dict(SPLIT_SCORES=True) if config.split_scores else {}),
                    **(dict(STATS_IN_SHARED=True) if config.stats_in_shared else {}),
                    **(dict(RELEASES=RELEASES.index(config.releases)) if config.releases != "thread" else {}),
                    **(dict(P_RELEASES=RELEASES.index(config.p_releases or config.releases))
                       if (config.p_releases or config.releases) != "thread" else {}),
                    **(dict(PERSISTENT=True) if config.persistent else {}))
    return dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, HEAD_DIM=config.head_dim, STAGES=config.stages,
                CONSUMERS=config.consumers, CAUSAL=causal, PRODUCER_REGS=config.producer_regs,
                CONSUMER_REGS=config.consumer_regs, COLUMNS=config.columns,
                FIRST_COLUMN=launch * config.consumers * config.columns,
                **(dict(DQ_TMA=True) if config.dq_reduce == "tma" else {}),
                **(dict(PIPELINED=True) if config.pipelined else {}))


def _check_backward_inputs(q, k, v, out, lse, dout, layout: str) -> tuple[str, int]:
    """_check_inputs for q, k and v, then out and dout shaped and typed as q, lse fp32
    [batch, heads, seq_q]: TypeError/ValueError saying what to pass otherwise."""
    kind, head_dim = _check_inputs(q, k, v, layout)
    check_arrays("flash_attention_backward", out=out, lse=lse, dout=dout)
    for name, x in (("out", out), ("dout", dout)):
        if tuple(x.shape) != tuple(q.shape) or _kind(x) != kind:
            raise ValueError(f"flash_attention_backward: {name} must have q's shape {tuple(q.shape)} and dtype "
                             f"{kind} ({_layout_words(layout)}), got {tuple(x.shape)} {_kind(x)}")
    batch, heads, seq_q, _ = _as_bhsd(q, layout)[0]
    if tuple(lse.shape) != (batch, heads, seq_q) or _kind(lse) != "fp32":
        raise ValueError(f"flash_attention_backward: lse must be fp32 [batch, heads, seq_q] = "
                         f"{[batch, heads, seq_q]}, as flash_attention(..., return_lse=True) returns it, got "
                         f"{list(lse.shape)} {_kind(lse)}")
    return kind, head_dim


def _row_major_last(x):
    """x itself where its last dimension is contiguous (the plain loads and stores of the
    row kernels need nothing more), else a contiguous copy."""
    return x if element_strides(x)[-1] == 1 else contiguous(x)


def flash_attention_backward(q, k, v, out, lse, dout, causal: bool = False, softmax_scale: float | None = None,
                             layout: str = "bhsd", *, config: BackwardConfig | None = None):
    """(dq, dk, dv): the gradients of flash_attention(q, k, v, causal, softmax_scale,
    layout=layout) given its output `out`, its log-sum-exp `lse` (fp32 [batch, heads,
    seq_q], natural log, +inf for rows that see no key: `return_lse=True`) and the output's
    gradient `dout` (q's shape and dtype). dq, dk and dv have q's, k's and v's shapes and
    dtype; with GQA/MQA dk and dv sum over each group of q heads; rows that see no key get
    dq = 0. Same conventions as the forward (bottom-right causal, softmax_scale any finite
    number, default 1 / sqrt(head_dim), numpy arrays or CPU tensors on the emulator)."""
    _, head_dim = _check_backward_inputs(q, k, v, out, lse, dout, layout)
    chosen = config or default_backward_config(head_dim)
    if chosen.head_dim != head_dim:
        raise ValueError(f"flash_attention_backward: {chosen} is for head_dim {chosen.head_dim}, the inputs "
                         f"have head_dim {head_dim}")
    (batch, heads, seq_q, _), (_, kv_heads, seq_k, _) = _as_bhsd(q, layout)[0], _as_bhsd(k, layout)[0]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    softmax_scale = float(softmax_scale)
    # dq = softmax_scale dS K whatever the sign: the kernel sees q' and scale' > 0 with
    # scale' q' = softmax_scale q (`_scaled_queries`), which leave dS and dk unchanged.
    q_seen, scale = _scaled_queries(q, softmax_scale)
    empty = seq_q == 0 or seq_k == 0 or batch * heads == 0
    # The kernels write every element of dq, dk and dv (rows that see no query get dk =
    # dv = 0 from their CTA): only a launch with nothing to do leaves them to zero here.
    dq = new_array(q, tuple(q.shape), zero=empty)
    dk, dv = new_array(k, tuple(k.shape), zero=empty), new_array(v, tuple(v.shape), zero=empty)
    if empty:
        return dq, dk, dv
    q_seen, k, v, dout = (_tma_ready(x) for x in (q_seen, k, v, dout))
    out, lse = _row_major_last(out), contiguous(lse)
    delta = new_array(q, (batch, heads, seq_q), "float32")
    row_grid = (-(-seq_q // ROW_TILE_ROWS), batch * heads)
    o_strides, do_strides = _as_bhsd(out, layout)[1][:3], _as_bhsd(dout, layout)[1][:3]
    row_deltas[row_grid](out, dout, delta, seq_q, heads, *o_strides, *do_strides, HEAD_DIM=head_dim, num_warps=4)
    dq_accum = new_array(q, (batch, heads, seq_q, head_dim), "float32", zero=True)
    descs = [_descriptor(x, layout, rows) for x, rows in
             ((q_seen, chosen.block_m), (k, chosen.block_n), (v, chosen.block_n), (dout, chosen.block_m))]
    dq_target = dq_accum if chosen.dq_reduce == "atomics" else _dq_boxes(dq_accum, chosen.dq_box_rows)
    dkv_strides = _as_bhsd(dk, layout)[1][:3]
    kernel = backward_kernel(chosen)
    for launch in range(chosen.launches):
        args = (*descs, lse, delta, dq_target, dk, dv, *dkv_strides, scale, seq_q, seq_k, heads, heads // kv_heads)
        constexprs = backward_constexprs(chosen, bool(causal), launch)
        grid = _backward_grid(chosen, kernel, q, args, constexprs, -(-seq_k // chosen.block_n), batch * kv_heads)
        kernel[grid](*args, **constexprs, num_warps=4, **chosen.launch_options())
    convert_dq[row_grid](dq_accum, dq, softmax_scale, seq_q, heads, *_as_bhsd(dq, layout)[1][:3],
                         HEAD_DIM=head_dim, num_warps=4)
    return dq, dk, dv


def _backward_grid(config: BackwardConfig, kernel, q, args: tuple, constexprs: dict, key_blocks: int,
                   heads_of_batches: int) -> tuple:
    """The main kernel's grid: a CTA a tile (key block, batch * kv head), or persistent,
    as many CTAs as the SMs hold at once (at most persistent_ctas), no more than tiles."""
    if not config.persistent:
        return (key_blocks, heads_of_batches)
    tiles = key_blocks * heads_of_batches
    ctas = persistent_grid(kernel, q, tiles, args, constexprs, 4, config.launch_options())
    return (min(ctas, config.persistent_ctas or ctas),)


def _dq_boxes(dq_accum, rows: int):
    """A TMA descriptor over the contiguous fp32 [batch, heads, seq_q, head_dim] dQ
    accumulator as [1, batch * heads, seq_q, head_dim], [1, 1, rows, DQ_CHUNK] boxes."""
    from ... import lowlevel as ll
    from ...runtime.tensor_descriptor import TensorDescriptor

    batch, heads, seq_q, head_dim = dq_accum.shape
    shape = (1, batch * heads, seq_q, head_dim)
    strides = (batch * heads * seq_q * head_dim, seq_q * head_dim, head_dim, 1)
    return TensorDescriptor(dq_accum, shape, strides, [1, 1, rows, DQ_CHUNK], ll.NVMMASharedLayout(128, 32))


def reference_attention_backward(q, k, v, dout, causal: bool = False, softmax_scale: float | None = None,
                                 layout: str = "bhsd"):
    """(dq, dk, dv) of flash_attention in float64 numpy (same conventions), from any arrays:
    P = softmax(S), dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = scale dS K,
    dK = scale dS^T Q, dK and dV summed over each group of q heads."""
    q, k, v, dout = (_host64(x) for x in (q, k, v, dout))
    if layout == "bshd":
        q, k, v, dout = (x.transpose(0, 2, 1, 3) for x in (q, k, v, dout))
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    k_all, v_all = (np.repeat(x, group, axis=1) for x in (k, v))
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    p, _ = reference_probabilities(q, k_all, scale, causal)
    o = np.einsum("bhqk,bhkd->bhqd", p, v_all)
    dv = np.einsum("bhqk,bhqd->bhkd", p, dout)
    dp = np.einsum("bhqd,bhkd->bhqk", dout, v_all)
    ds = p * (dp - (dout * o).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bhqk,bhkd->bhqd", ds, k_all)
    dk = scale * np.einsum("bhqk,bhqd->bhkd", ds, q)
    dk, dv = (x.reshape(x.shape[0], kv_heads, group, *x.shape[2:]).sum(axis=2) for x in (dk, dv))
    if layout == "bshd":
        dq, dk, dv = (x.transpose(0, 2, 1, 3) for x in (dq, dk, dv))
    return dq, dk, dv
