"""Flash-attention tile configurations: validated, with the shared memory they need."""

from __future__ import annotations

from dataclasses import dataclass

SHARED_LIMIT = 227 * 1024  # bytes one CTA may use on sm_90 (HOPPER.md)
HEAD_DIMS = (64, 128, 256)
BOX = 64  # elements of a 16-bit type in one 128-byte swizzle row: one TMA box's width


@dataclass(frozen=True)
class Config:
    """One forward-kernel variant for a head dim.

    block_m query rows per CTA (64 per consumer warpgroup), block_n keys per K/V tile,
    `stages` K/V tiles in flight, the register budgets (setmaxnreg) of the TMA producer
    warpgroup and of the two consumer warpgroups.
    """

    head_dim: int = 128
    block_m: int = 128
    block_n: int = 128
    stages: int = 2
    num_warps: int = 8           # consumer warps: two warpgroups of 64 rows
    producer_regs: int = 24
    consumer_regs: int = 240

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"Config.head_dim must be one of {HEAD_DIMS}, got {self.head_dim}")
        if self.num_warps not in (4, 8):
            raise ValueError(f"Config.num_warps must be 4 or 8 (one or two consumer warpgroups), "
                             f"got {self.num_warps}")
        if self.block_m != 16 * self.num_warps:
            raise ValueError(f"Config.block_m must be 16 x num_warps = {16 * self.num_warps} "
                             f"(each consumer warp owns 16 query rows), got {self.block_m}")
        if self.block_n not in (16, 32, 64, 128, 256):
            raise ValueError(f"Config.block_n must be a power of two from 16 to 256 (the wgmma N "
                             f"of S = Q K^T and the K of O += P V), got {self.block_n}")
        if not 2 <= self.stages <= 4:
            raise ValueError(f"Config.stages must be 2..4 (K/V tiles in flight), got {self.stages}")
        for name in ("producer_regs", "consumer_regs"):
            regs = getattr(self, name)
            if regs % 8 or not 24 <= regs <= 256:
                raise ValueError(f"Config.{name} must be a multiple of 8 in [24, 256] "
                                 f"(setmaxnreg), got {regs}")
        warps = self.num_warps + 4
        if 32 * (4 * self.producer_regs + self.num_warps * self.consumer_regs) > 65536:
            raise ValueError(f"Config: {warps} warps at {self.producer_regs} (producer) and "
                             f"{self.consumer_regs} (consumers) registers exceed the 64K "
                             f"registers of an SM; lower consumer_regs")
        if shared_bytes(self) > SHARED_LIMIT:
            raise ValueError(f"{self} needs {shared_bytes(self)} bytes of shared memory; a CTA "
                             f"has {SHARED_LIMIT}. Use a smaller block_n or fewer stages.")


def shared_bytes(config: Config, element_bytes: int = 2) -> int:
    """Q (reused for the O tile), the K and V rings, the mbarriers."""
    q = config.block_m * config.head_dim * element_bytes
    kv = 2 * config.stages * config.block_n * config.head_dim * element_bytes
    return q + kv + 8 * (2 + 4 * config.stages)


def default_config(head_dim: int) -> Config:
    """The tile shapes FA3 uses on H100, rounded to powers of two."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"flash_attention supports head_dim {HEAD_DIMS}, got {head_dim}")
    block_n = {64: 128, 128: 128, 256: 64}[head_dim]
    return Config(head_dim=head_dim, block_n=block_n)
