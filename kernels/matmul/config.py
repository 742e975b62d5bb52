"""Matmul tile configurations: validated, with the shared-memory budget they need."""

from __future__ import annotations

from dataclasses import dataclass

from ...compiler.hardware import SHARED_LIMIT

VARIANTS = ("warp_specialized", "pipelined")


@dataclass(frozen=True)
class Config:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 3
    num_warps: int = 8           # consumer warps (whole warpgroups, 64 rows each)
    group_m: int = 16            # tile rows that sweep the columns together (L2 reuse)
    variant: str = "warp_specialized"
    producer_regs: int = 40      # setmaxnreg budget of the TMA producer partition

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"Config.variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.num_warps not in (4, 8):
            raise ValueError(f"Config.num_warps must be 4 or 8 (one or two warpgroups), got {self.num_warps}")
        if self.block_m != 16 * self.num_warps:
            raise ValueError(f"Config.block_m must be 16 x num_warps = {16 * self.num_warps} "
                             f"(each warp owns 16 rows of the wgmma tile), got {self.block_m}")
        if self.block_n % 8 or not 8 <= self.block_n <= 256 or self.block_n & (self.block_n - 1):
            raise ValueError(f"Config.block_n must be a power of two from 8 to 256, got {self.block_n}")
        if self.block_k not in (32, 64, 128, 256):
            raise ValueError(f"Config.block_k must be 32, 64, 128 or 256, got {self.block_k}")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"Config.stages must be 2..8, got {self.stages}")
        if self.group_m < 1:
            raise ValueError(f"Config.group_m must be positive, got {self.group_m}")

    def check_fits(self, in_bits: int, out_bits: int) -> None:
        needed = shared_bytes(self, in_bits, out_bits)
        if needed > SHARED_LIMIT:
            raise ValueError(f"{self} needs {needed} bytes of shared memory for {in_bits}-bit "
                             f"inputs and {out_bits}-bit output; a CTA has {SHARED_LIMIT}. "
                             f"Use fewer stages or a smaller block_n.")
        if self.block_k * in_bits // 8 > 128:
            raise ValueError(f"block_k={self.block_k} of {in_bits}-bit elements is "
                             f"{self.block_k * in_bits // 8} bytes per row; TMA boxes with the "
                             f"128-byte swizzle hold at most 128")


def shared_bytes(config: Config, in_bits: int, out_bits: int) -> int:
    """The ring (A and B slots), the output tile and the barriers."""
    stage = (config.block_m + config.block_n) * config.block_k * in_bits // 8
    out = config.block_m * config.block_n * out_bits // 8
    return config.stages * stage + out + 16 * config.stages


def configs_for(in_bits: int, out_bits: int) -> list[Config]:
    """The candidates the autotuner times; all fit in shared memory. From the config sweep
    (docs/performance-journal.md): 128x256 tiles with 3 stages and 16-row groups lead at 4096^3
    and 8192^3; the others win on shapes where 256-wide tiles leave SMs idle or the
    output tile crowds out stages."""
    block_k = 1024 // in_bits  # 128 bytes: one 128-byte-swizzle row
    candidates = [Config(128, 256, block_k, 3), Config(128, 256, block_k, 3, variant="pipelined"),
                  Config(128, 256, block_k, 2), Config(128, 128, block_k, 5, group_m=8),
                  Config(128, 128, block_k, 4, group_m=8)]
    return [c for c in candidates if shared_bytes(c, in_bits, out_bits) <= SHARED_LIMIT]
