"""The FA3 kernel's configuration (kernels.py): `PingpongConfig`, its knobs validated with
readable errors, what the knobs left None choose for a problem (the functions after it),
and `default_config`, the configuration flash_attention picks."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import (HEAD_DIMS, ForwardConfig, check_registers, check_shape, check_shared_memory, is_int,
                     is_number, shared_bytes, shared_limit)

MAX_CTAS_PER_SM = 4
L2_GROUP_BYTES = 24 << 20  # K/V bytes of the heads whose tiles run together, by default
L2_GROUP_BYTES_256 = 8 << 20  # for causal head_dim 256, faster than 24 MB there (docs/attention-journal.md)
MAX_RESCALE_ABOVE = 15  # log2 of the largest P a skipped rescale may leave: below fp16's 65504
REPLICATE_UP_TO = 4096  # keys up to which causal head_dim 128 consumers share one copy of the code
THREE_STAGES_UP_TO = 2048  # keys up to which causal head_dim 64 keeps three K/V tiles in flight
FOUR_CONSUMERS_UP_TO = 1024  # keys up to which non-causal head_dim 64 runs four consumer warpgroups
ONE_KEY_TILE_UP_TO = 64  # keys up to which head_dim 64 and 128 run several one-warpgroup CTAs an SM


@dataclass(frozen=True)
class PingpongConfig(ForwardConfig):
    """The FA3 kernel (kernels.py) for a head dim: `consumers` warpgroups (1 to 4), each in
    its own partition, the GEMMs of one overlapping the softmax of the others and of its
    own previous step (the shared knobs: `ForwardConfig`), and:

    - persistent: one CTA per SM, each claiming its next tile from an atomic
      counter when it finishes one, longest first (the next tile's Q and K/V load while
      the last one's O is stored); False: one CTA per tile.
    - q_buffers (persistent): warpgroup-sized Q buffers in the Q ring, from `consumers`
      (one tile's) to 2 * `consumers` (the next tile's Q loads during this one); None:
      as many as fit in shared memory beside the K/V ring (and O's buffer, where that
      fits: the host decides it first).
    - l2_group_bytes: the K/V bytes of the (batch, head) pairs whose query
      tiles are numbered together, heads taken in turn (so causal tiles run longest
      first within a group); 1 puts every head in a group of its own, so the query
      tiles of one head run side by side. None: one head per group for non-causal
      attention at head_dim 128 and 256 (it reads K/V from DRAM once; at head_dim 64 it
      was slower), else 24 MB, 8 MB for causal head_dim 256 (faster there up to 8k
      tokens); docs/attention-journal.md.
    - replicated: the consumer warpgroups run one copy of the consumer code
      (a warp_specialize worker with `worker_replicas`, each copy reading its index at run
      time) rather than a partition each with its index compiled in: the kernel's code is
      a half to a third the size, so short tiles, which go through all of it often, wait
      less on instruction fetches (where Nsight Compute found many of the consumers' stall
      samples at causal head_dim 64, 512 tokens); the index costs a few instructions per
      key step.
      Replicated consumers also release ring slots warp by warp. None: replicated for
      causal head_dim 64, and causal head_dim 128 up to REPLICATE_UP_TO keys, where it
      measured faster; elsewhere it measured level or slower (docs/attention-journal.md).
    - per_warp_release: consumers release ring slots and pass turns with one
      arrival per warp, as soon as each warp gets there, rather than one per warpgroup
      after a warpgroup-wide named barrier (which holds the first warps back until the
      last gets there). None: where the consumers are replicated (which needs it) and at
      head_dim 128, where it measured faster; level at 256, slower at 64
      (docs/attention-journal.md).
    - conditional_rescale: FlashAttention-4's rescale. A row's running max,
      which the softmax subtracts before exp2, moves only in warps where some row's max
      grew past it by more than `rescale_above` (log2 units), so the other warps skip
      rescaling O (a branch per warp, `ll.warp_any`); P then stays below
      2^rescale_above. The result is the same up to rounding. False: the max moves at
      every key tile and O is rescaled at every step, as in FlashAttention-2 and 3.
      None: on wherever lazy_max is (which moves the max only where rows grew) and at head_dim
      256 without it, whose 64-key tiles rescale 128 O registers per thread every 64 keys
      (where it measured faster); without lazy_max at 64 and 128 it measured level
      (docs/attention-journal.md).
    - claim_ahead (causal, persistent): the producer claims the CTA's next tile before
      the last `claim_ahead` K/V loads of a tile, rather than after all of them, so the
      next tile's Q is in when the consumers get there; claimed earlier, the longest-first
      order balances the CTAs worse. None: 2 at head_dim 64, whose key steps are the
      shortest (it gains at 512 tokens, level elsewhere), 0 at 128 and 256 (there 2 was
      level at 128 and slower at 256; docs/attention-journal.md).
      Non-causal tiles are all alike: the next is claimed as soon as a tile starts.
    - cluster (persistent): CTAs per cluster, 1 or 2. With 2, the CTAs of a
      cluster run the two query tiles of one (batch, head) side by side, and each loads
      half of every K/V tile into both by multicast TMA, so K and V leave L2 once per
      pair (FlashAttention-3 does this for non-causal head_dim 128 and 256). It needs
      non-causal attention, head_dim 128 or 256, an even count of query tiles per head and
      one head per tile group (l2_group_bytes None). None: 2 wherever that holds, else 1.
      Side by side with single CTAs at the power cap, pairs gain a little from 2k tokens
      and are level below: the clock rises with half the L2 traffic, and the pair gives
      most of it back in work per cycle (docs/attention-journal.md).
    - lazy_max: no row max is taken at a key step: P is computed against the
      running max m of the key tiles before, and only in warps where a row of P summed
      past 2^rescale_above (scores grew), overflowed or saw its first keys does m move,
      with P, l and O rescaled to match (kernels.exps_on_last_max). The result is the
      same up to rounding; a step spends no instructions on the max, its shuffles or O's
      rescale, and its exps start as soon as S is in. Needs rescale_above above
      log2(block_n) (a row of P against a max sums to at most block_n). How m moves
      depends on the registers: at head_dim 128, S stays live beside P and those warps
      take the exact max from it and compute P again (a quarter fewer instructions a
      step); at 64 and 256, where S beside P spilled, m moves up by log2 of the row's sum
      and P is scaled down (max_from_sums; 429 instructions a step become 332 at 64), a
      warpgroup with a P overflowed to inf computes S again from its K tile (released only
      then) to take the max, and key tiles that need a mask take the max as without
      lazy_max. A row's first key tile takes P against the max of its first 32 keys and
      the exact max, from S, only where a row grew past that. None: on at head_dim 64 and
      128, where it measured faster side by side with it off; off at 256, where it gained
      less (without its overflow path) and spills with one tile's Q buffers
      (docs/attention-journal.md).
    - dynamic_schedule (persistent): how a CTA finds its next tile. True: its producer
      claims one from an atomic counter (zeroed on every launch) as it starts a tile, so a
      CTA that drew short or slow tiles takes more; False: CTA i takes tiles i, i + grid,
      ... and the host zeroes no counter. None: dynamic, except for clusters of two (which
      take their tiles side by side). Static measured slower even for non-causal tiles,
      which are all alike, at lengths whose tiles do not fill the last wave
      (docs/attention-journal.md).
    - half_tiles: a warpgroup's last key tile, where none of its rows sees the
      tile's second half, is taken as a tile of block_n / 2 keys: S's GEMM, its softmax
      and the last P V over half the keys (kernels.attend_tile). Causal 64-row warpgroups
      starting at a multiple of 128 rows cross the diagonal in the first half of a
      128-key tile, half the warpgroups of a causal problem; non-causal, the last key
      tile where seq_k % block_n is at most block_n / 2. None: on for causal attention
      with 128-key tiles (head_dim 64 and 128), where it measured faster, most at short
      sequences. Off non-causal, where the benchmark's lengths have no such tile and the
      code would only grow (docs/attention-journal.md).
    - exp2_fma_share: the share of the softmax's exps computed by FMA polynomials instead
      of the exp unit (`ll.exp2(..., fma_share=)`, FlashAttention-4's trick); 0 because
      every share measured slower: each exp moved costs nine issued instructions, and the
      kernel is not limited by the exp unit alone (docs/attention-journal.md).
    - ctas_per_sm: CTAs an SM holds at once, 1 to MAX_CTAS_PER_SM. Above 1 the
      kernel launches with the registers and shared memory of that share of an SM (the
      launch option maxnreg; the budgets and buffers are checked against it), so that the
      tiles of several CTAs, each with its own producer and K/V ring, run side by side.
      default_config gives 3 (of one warpgroup each) at head_dim 64 and 2 at 128 where the
      keys are a single 64-key tile (`default_config`).
    """

    persistent: bool = True
    q_buffers: int | None = None
    l2_group_bytes: int | None = None
    replicated: bool | None = None
    per_warp_release: bool | None = None
    conditional_rescale: bool | None = None
    rescale_above: float = 8.0
    claim_ahead: int | None = None
    exp2_fma_share: float = 0.0
    cluster: int | None = None
    lazy_max: bool | None = None
    dynamic_schedule: bool | None = None
    half_tiles: bool | None = None
    ctas_per_sm: int = 1

    def __post_init__(self):
        # Each knob alone, then the tile shape, then how the options go together, then what
        # the CTA's registers and shared memory hold.
        _check_values(self)
        check_shape(self)
        _check_options(self)
        check_registers(self)
        _check_q_buffers(self)
        check_shared_memory(self)
        _check_q_buffers_fit(self)


# Knobs that are None (chosen for the problem or head dim, as the functions below do) or a bool.
CHOSEN_PER = {"half_tiles": "problem", "dynamic_schedule": "problem", "lazy_max": "problem",
              "conditional_rescale": "head dim", "replicated": "problem", "per_warp_release": "problem"}


def _check_values(config: PingpongConfig) -> None:
    """Each knob alone: its type and range."""
    if not is_int(config.ctas_per_sm) or not 1 <= config.ctas_per_sm <= MAX_CTAS_PER_SM:
        raise ValueError(f"PingpongConfig.ctas_per_sm must be an int from 1 to {MAX_CTAS_PER_SM} (CTAs an SM "
                         f"holds at once), got {config.ctas_per_sm!r}")
    for name, per in CHOSEN_PER.items():
        value = getattr(config, name)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"PingpongConfig.{name} must be None (chosen per {per}), True or False, got {value!r}")
    if config.cluster is not None and (isinstance(config.cluster, bool) or config.cluster not in (1, 2)):
        raise ValueError(f"PingpongConfig.cluster must be None (2 where it applies), 1 or 2 (CTAs sharing K/V "
                         f"tiles by multicast), got {config.cluster!r}")
    if not is_number(config.exp2_fma_share) or not 0 <= config.exp2_fma_share <= 1:
        raise ValueError(f"PingpongConfig.exp2_fma_share must be a number in [0, 1] (the share of exps "
                         f"computed on the FMA pipe), got {config.exp2_fma_share!r}")
    if not is_number(config.rescale_above) or not 0 <= config.rescale_above <= MAX_RESCALE_ABOVE:
        raise ValueError(f"PingpongConfig.rescale_above must be a number in [0, {MAX_RESCALE_ABOVE}] (log2 "
                         f"units: P reaches 2^rescale_above, and fp16 overflows at 2^16), got "
                         f"{config.rescale_above!r}")
    if config.l2_group_bytes is not None and (not is_int(config.l2_group_bytes) or config.l2_group_bytes < 1):
        raise ValueError(f"PingpongConfig.l2_group_bytes must be None or a positive int (K/V bytes of the "
                         f"heads whose tiles run together), got {config.l2_group_bytes!r}")
    if config.claim_ahead is not None and (not is_int(config.claim_ahead) or config.claim_ahead < 0):
        raise ValueError(f"PingpongConfig.claim_ahead must be None (chosen per head dim) or a count of K/V "
                         f"loads >= 0, got {config.claim_ahead!r}")
    if config.persistent not in (True, False):
        raise ValueError(f"PingpongConfig.persistent must be True or False, got {config.persistent!r}")


def _check_options(config: PingpongConfig) -> None:
    """The options that need the persistent kernel or each other."""
    if config.ctas_per_sm > 1 and config.cluster == 2:
        raise ValueError("PingpongConfig: clusters of two launch one CTA an SM; ctas_per_sm above 1 needs "
                         "cluster 1 (or None)")
    if config.dynamic_schedule is not None and not config.persistent:
        raise ValueError("PingpongConfig.dynamic_schedule is how persistent CTAs find their next tile: it "
                         "needs persistent=True")
    if config.dynamic_schedule and config.cluster == 2:
        raise ValueError("PingpongConfig: clusters of two take their query tiles side by side on a static "
                         "schedule; dynamic_schedule=True needs cluster 1 (or None)")
    if config.lazy_max and config.conditional_rescale is False:
        raise ValueError("PingpongConfig.lazy_max rescales O only where the max moves: it needs "
                         "conditional_rescale None or True")
    if config.lazy_max and 2.0 ** config.rescale_above <= config.block_n:
        raise ValueError(f"PingpongConfig.lazy_max needs rescale_above above log2(block_n) = "
                         f"{math.log2(config.block_n):g}: a row of {config.block_n} keys sums to up to "
                         f"{config.block_n} even with the max exact, so every step would move it; got "
                         f"rescale_above={config.rescale_above!r}")
    if config.cluster == 2 and (not config.persistent or config.head_dim == 64):
        raise ValueError("PingpongConfig.cluster=2 needs persistent=True and head_dim 128 or 256 (each CTA "
                         "multicasts half of a K/V tile's 64-column boxes)")
    if config.replicated is True and config.per_warp_release is False:
        raise ValueError("PingpongConfig: replicated consumers release warp by warp; per_warp_release=False "
                         "needs replicated=False (or None)")


def _check_q_buffers(config: PingpongConfig) -> None:
    """The Q ring's size."""
    if config.q_buffers is not None and (
            not is_int(config.q_buffers) or not config.consumers <= config.q_buffers <= 2 * config.consumers):
        raise ValueError(f"PingpongConfig.q_buffers must be None (as many as fit) or a count from "
                         f"consumers = {config.consumers} to {2 * config.consumers} (warpgroup-sized "
                         f"Q buffers: one to two tiles'), got {config.q_buffers!r}")


def _check_q_buffers_fit(config: PingpongConfig) -> None:
    """The Q ring's buffers against the CTA's share of shared memory."""
    limit = shared_limit(config)
    if config.q_buffers is not None and shared_bytes(config, q_buffers=config.q_buffers) > limit:
        raise ValueError(f"{config} needs {shared_bytes(config, q_buffers=config.q_buffers)} bytes of "
                         f"shared memory with {config.q_buffers} Q buffers; a CTA has {limit}. "
                         f"Use fewer Q buffers (or None: as many as fit).")


def tile_group(config: PingpongConfig, causal: bool, kv_bytes: int, batch_heads: int) -> int:
    """(batch, head) pairs per tile group (`kernels.tile_coordinates`) for heads whose K
    and V take `kv_bytes` each (a GQA group's shared by its query heads)."""
    budget = config.l2_group_bytes
    if budget is None:
        if not causal and config.head_dim >= 128:
            return 1
        budget = L2_GROUP_BYTES_256 if config.head_dim == 256 else L2_GROUP_BYTES
    return max(1, min(batch_heads, budget // max(kv_bytes, 1)))


def cluster_size(config: PingpongConfig, causal: bool, num_m_tiles: int, group: int) -> int:
    """CTAs per cluster (PingpongConfig.cluster) for a problem: 2 needs a pair of query tiles of
    one head to share K/V by multicast. `group`: (batch, head) pairs per tile group
    (`tile_group`). PingpongConfig.cluster None: 2 where it applies, else 1; 2 where it does not
    apply is an error."""
    if config.cluster == 1 or config.dynamic_schedule or config.ctas_per_sm > 1:
        return 1
    why = None
    if not config.persistent or config.head_dim == 64:
        why = "it needs persistent=True and head_dim 128 or 256"
    elif causal:
        why = "causal tiles differ in length, so paired CTAs would not run in step"
    elif num_m_tiles % 2:
        why = (f"the query tiles of a head ({num_m_tiles} of {config.block_m} rows) must pair up: "
               f"use a seq_q that makes their count even")
    elif group != 1:
        why = (f"tiles must run one head at a time, not in groups of {group} heads "
               f"(PingpongConfig.l2_group_bytes None)")
    if why is None:
        return 2
    if config.cluster is None:
        return 1
    raise ValueError(f"flash_attention: PingpongConfig.cluster=2 cannot be used here: {why}")


def dynamic_schedule(config: PingpongConfig, cluster: int) -> bool:
    """Whether persistent CTAs claim their next tile from an atomic counter
    (PingpongConfig.dynamic_schedule), given the CTAs per cluster (`cluster_size`; clusters take
    their tiles on a static schedule)."""
    if cluster > 1:
        return False
    if config.dynamic_schedule is None:
        return True
    return config.dynamic_schedule


def replicated(config: PingpongConfig, causal: bool, seq_k: int) -> bool:
    """Whether the consumer warpgroups share one copy of the code (PingpongConfig.replicated)."""
    if config.replicated is not None:
        return config.replicated
    return causal and (config.head_dim == 64 or config.head_dim == 128 and seq_k <= REPLICATE_UP_TO)


def per_warp_release(config: PingpongConfig, replicate: bool) -> bool:
    """Whether consumers arrive warp by warp (PingpongConfig.per_warp_release), given whether they
    are replicated (`replicated`), which needs it."""
    if replicate:
        return True
    if config.per_warp_release is None:
        return config.head_dim == 128
    return config.per_warp_release


def lazy_max(config: PingpongConfig) -> bool:
    """Whether key steps compute P against the last running max (PingpongConfig.lazy_max)."""
    if config.lazy_max is not None:
        return config.lazy_max
    return config.head_dim <= 128 and config.conditional_rescale is not False \
        and 2.0 ** config.rescale_above > config.block_n


def half_tiles(config: PingpongConfig, causal: bool) -> bool:
    """Whether a warpgroup's last key tile, where no row sees its second half, is taken
    as a tile of half the keys (PingpongConfig.half_tiles)."""
    if config.half_tiles is not None:
        return config.half_tiles
    return causal and config.block_n == 128


def rescale_above(config: PingpongConfig) -> float | None:
    """How far (log2 units) a row's max (with lazy_max: the log2 of its sum of P) may grow
    before its warp rescales O, or None where O is rescaled at every key tile
    (PingpongConfig.conditional_rescale)."""
    conditional = config.conditional_rescale
    if conditional is None:
        conditional = config.head_dim == 256 or lazy_max(config)
    return float(config.rescale_above) if conditional else None


def claim_ahead(config: PingpongConfig) -> int:
    """Before how many of a causal tile's last K/V loads the producer claims the CTA's
    next tile (PingpongConfig.claim_ahead)."""
    if config.claim_ahead is not None:
        return config.claim_ahead
    return 2 if config.head_dim == 64 else 0


def buffering(config: PingpongConfig) -> tuple[bool, int]:
    """(O through its own buffer, Q buffers) of a persistent CTA: O's buffer where it fits
    beside one tile's Q (not head_dim 256), then as many Q buffers as fit, up to two
    tiles' (config.q_buffers: that many; validated to fit)."""
    limit = shared_limit(config)
    o_buffer = shared_bytes(config, o_buffer=True) <= limit
    if config.q_buffers is not None:
        return shared_bytes(config, o_buffer=True, q_buffers=config.q_buffers) <= limit, config.q_buffers
    fits = [n for n in range(config.consumers, 2 * config.consumers + 1)
            if shared_bytes(config, o_buffer=o_buffer, q_buffers=n) <= limit]
    return o_buffer, fits[-1]


def default_config(head_dim: int, causal: bool = False, seq_k: int | None = None) -> PingpongConfig:
    """FA3's H100 tile shapes, rounded to powers of two where they are not: 192 x 128
    (three consumer warpgroups at 160 registers) for head_dim 64, 128 x 128 for 128,
    128 x 64 for 256 (FA3: 192 x 128, 128 x 128 (176 non-causal), 128 x 80). head_dim
    64 keeps more K/V tiles in flight than two where it measured faster: four non-causal,
    and three causal with at most THREE_STAGES_UP_TO keys (seq_k): its short tiles end
    every few key steps, and the third stage lets the next tile's first K/V tiles load
    meanwhile (longer causal sequences measured level or slower; docs/attention-journal.md).
    Non-causal head_dim 64 with at most
    FOUR_CONSUMERS_UP_TO keys runs 256 x 64 tiles: four consumer warpgroups at 112
    registers (the most four get), one replicated copy of their code (faster at 512 and
    1k keys; slower from 2k and causal, where 64-key tiles cost more than the fourth
    warpgroup gives). At most ONE_KEY_TILE_UP_TO keys, a single 64-key tile whose steps cannot hide
    a tile's start and end behind another warpgroup's, run several CTAs an SM of one
    consumer warpgroup each: three at head_dim 64 (136 registers), two at 128 (232), causal
    or not (much faster at 64 keys, level with Triton there; level at 128 keys and slower
    from 256: docs/attention-journal.md)."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"flash_attention supports head_dim {HEAD_DIMS}, got {head_dim}")
    if head_dim == 64 and seq_k is not None and seq_k <= ONE_KEY_TILE_UP_TO:
        return PingpongConfig(head_dim=64, block_n=64, stages=3, consumers=1, consumer_regs=136, replicated=True,
                      ctas_per_sm=3)
    if head_dim == 128 and seq_k is not None and seq_k <= ONE_KEY_TILE_UP_TO:
        return PingpongConfig(head_dim=128, block_n=64, stages=2, consumers=1, consumer_regs=232, replicated=True,
                      ctas_per_sm=2)
    if head_dim == 64 and not causal and seq_k is not None and seq_k <= FOUR_CONSUMERS_UP_TO:
        return PingpongConfig(head_dim=64, block_n=64, stages=4, consumers=4, consumer_regs=112, replicated=True)
    if head_dim == 64:
        stages = 4
        if causal:
            stages = 3 if seq_k is not None and seq_k <= THREE_STAGES_UP_TO else 2
        return PingpongConfig(head_dim=64, block_n=128, stages=stages, consumers=3, consumer_regs=160)
    return PingpongConfig(head_dim=head_dim, block_n=64 if head_dim == 256 else 128)
