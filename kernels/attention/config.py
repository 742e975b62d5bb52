"""Flash-attention forward configurations, one type per kernel variant: what both variants
share (`ForwardConfig`: the tile shape, the K/V ring, the register budgets), validated,
with the shared memory and registers a CTA needs; the simple kernel's `SimpleConfig`.
The FA3 kernel's `PingpongConfig`, with its own knobs, is in pingpong_config.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...compiler.backend.lower_warp_specialize import launch_register_cap
from ...compiler.hardware import SHARED_LIMIT, SM_SHARED
from .rings import ready_barriers

HEAD_DIMS = (64, 128, 256)
BOX = 64                   # 16-bit elements in one 128-byte swizzle row: one TMA box's width
ROWS = 64                  # query rows per consumer warpgroup (one wgmma M)
TILE_FIELDS = 4            # int32 words published with each Q buffer: tile, batch, head, first row


@dataclass(frozen=True)
class ForwardConfig:
    """What both forward kernels are configured by (a `PingpongConfig` or a
    `SimpleConfig`, never this type itself): key tiles of `block_n` keys, `stages` K/V
    tiles in flight, `consumers` warpgroups of ROWS query rows each, and the setmaxnreg
    budgets of the TMA producer warpgroup (`producer_regs`) and of each consumer
    warpgroup (`consumer_regs`). A subclass's __post_init__ validates all of its knobs."""

    head_dim: int = 128
    block_n: int = 128
    stages: int = 2
    consumers: int = 2
    producer_regs: int = 24
    consumer_regs: int = 240

    MAX_CONSUMERS: ClassVar[int] = 4

    def __post_init__(self):
        raise TypeError("ForwardConfig is what PingpongConfig and SimpleConfig share: construct one of those "
                        "(PingpongConfig for the FA3 kernel, SimpleConfig for the simple baseline)")

    @property
    def block_m(self) -> int:
        """Query rows per CTA tile."""
        return ROWS * self.consumers

    @property
    def threads(self) -> int:
        """Threads of a CTA whose registers setmaxnreg shares out: the producer warpgroup
        and the consumer warpgroups."""
        return 128 * (1 + self.consumers)


@dataclass(frozen=True)
class SimpleConfig(ForwardConfig):
    """The simple kernel (simple.py; a baseline for the FA3 kernel's `PingpongConfig`): one
    partition of all `consumers` warpgroups (1 or 2), with no overlap inside a warpgroup,
    one CTA per query tile, every key tile taken whole and every exp on the exp unit."""

    MAX_CONSUMERS: ClassVar[int] = 2

    def __post_init__(self):
        check_shape(self)
        check_registers(self)
        check_shared_memory(self)

    @property
    def ctas_per_sm(self) -> int:
        """One CTA an SM at launch (several is a PingpongConfig knob)."""
        return 1


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_shape(config: ForwardConfig) -> None:
    """The tile shape and the register budgets' granularity."""
    name = type(config).__name__
    if config.head_dim not in HEAD_DIMS:
        raise ValueError(f"{name}.head_dim must be one of {HEAD_DIMS}, got {config.head_dim}")
    if config.consumers not in range(1, config.MAX_CONSUMERS + 1):
        raise ValueError(f"{name}.consumers (warpgroups of {ROWS} query rows) must be 1 to "
                         f"{config.MAX_CONSUMERS}, got {config.consumers}")
    if config.block_n not in (16, 32, 64, 128, 256):
        raise ValueError(f"{name}.block_n must be a power of two from 16 to 256 (the wgmma N "
                         f"of S = Q K^T and the K of O += P V), got {config.block_n}")
    if not 2 <= config.stages <= 4:
        raise ValueError(f"{name}.stages must be 2..4 (K/V tiles in flight), got {config.stages}")
    for knob in ("producer_regs", "consumer_regs"):
        regs = getattr(config, knob)
        if regs % 8 or not 24 <= regs <= 256:
            raise ValueError(f"{name}.{knob} must be a multiple of 8 in [24, 256] "
                             f"(setmaxnreg), got {regs}")


def check_registers(config: ForwardConfig) -> None:
    """setmaxnreg moves registers between warpgroups within what the CTA got at launch:
    65536 for three consumer warpgroups but 61440 for four (96 a thread for 640)."""
    threads = config.threads
    pool = threads * register_cap(config)
    used = 128 * (config.producer_regs + config.consumers * config.consumer_regs)
    if used > pool:
        raise ValueError(f"{type(config).__name__}: a producer warpgroup at {config.producer_regs} registers and "
                         f"{config.consumers} consumer warpgroups at {config.consumer_regs} need "
                         f"{used} registers, a CTA of {threads} threads gets {pool}"
                         f"{f' with {config.ctas_per_sm} CTAs an SM' if config.ctas_per_sm > 1 else ''}; lower "
                         f"consumer_regs to {(pool // 128 - config.producer_regs) // config.consumers // 8 * 8}")


def check_shared_memory(config: ForwardConfig) -> None:
    """The buffers (one tile's Q) against the CTA's share of shared memory."""
    limit = shared_limit(config)
    if shared_bytes(config) > limit:
        raise ValueError(f"{config} needs {shared_bytes(config)} bytes of shared memory; a CTA "
                         f"has {limit}. Use a smaller block_n or fewer stages"
                         f"{' (or fewer CTAs an SM)' if config.ctas_per_sm > 1 else ''}.")


def register_cap(config: ForwardConfig) -> int:
    """The registers each thread of a CTA gets at launch (setmaxnreg moves them between
    its warpgroups): an SM's share for config.ctas_per_sm CTAs."""
    return launch_register_cap(config.threads * config.ctas_per_sm)


def shared_limit(config: ForwardConfig) -> int:
    """Bytes of shared memory one CTA may use: all a CTA can have, or with ctas_per_sm
    above 1 its share of the SM's."""
    if config.ctas_per_sm == 1:
        return SHARED_LIMIT
    return SM_SHARED // config.ctas_per_sm - 1024


def shared_bytes(config: ForwardConfig, element_bytes: int = 2, o_buffer: bool = False, q_buffers: int = 0) -> int:
    """`q_buffers` warpgroup-sized Q buffers (0: one tile's, `consumers`; O leaves through
    them unless `o_buffer`), the K and V rings, the mbarriers and the tile fields
    (TILE_FIELDS words per Q buffer: kernels.publish_tile)."""
    q_buffers = q_buffers or config.consumers
    q = ROWS * config.head_dim * element_bytes
    kv = 2 * config.stages * config.block_n * config.head_dim * element_bytes
    ready = ready_barriers(q_buffers, config.consumers)  # the Q ring's `ready` barriers
    barriers = 8 * (ready + q_buffers + 4 * config.stages + config.consumers)
    return q * (q_buffers + o_buffer * config.consumers) + kv + barriers + 4 * TILE_FIELDS * q_buffers
