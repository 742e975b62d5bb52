"""Matmul tile configurations: validated, with the shared-memory budget they need, and the
candidates each shape class gets (see `configs_for`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...compiler.hardware import SHARED_LIMIT

VARIANTS = ("warp_specialized", "pipelined", "gemv")  # gemv: M = 1 without tensor cores (gemv.py)
SPLIT_REDUCES = ("atomic", "tma")  # how split-K parts add up: split_k.py, split_k_tma.py
MAX_SPLIT_K = 32
MIN_PART_STEPS = 4   # K steps a split-K part keeps at least: its ring must fill before it drains
DECODE_ROWS = 64     # M up to one warpgroup's wgmma rows: the decode class
LONG_K = 4           # K at least this many times max(M, N): the long-K class
BLOCK_NS = (8, 16, 32, 64, 128, 192, 256)  # wgmma widths whose tiles split into whole TMA boxes
FILL = 0.9           # wave efficiency under which tile shapes that fill the waves join


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
    split_k: int = 1             # parts each tile's K range is cut into (split_k.py)
    split_reduce: str = "atomic"  # split-K parts add by per-element atomics, or by TMA
                                  # reduce-add of whole tiles and a converting launch
    stream_k: bool = False       # the partial wave's tiles shared by K step among all CTAs
                                 # (stream_k.py)
    cluster_m: int = 1           # 2: CTAs in pairs of tiles neighbouring along M, sharing
                                 # each B tile by TMA multicast (cluster.py)
    cluster_n: int = 1           # 2: pairs neighbouring along N, sharing each A tile
    staged_halves: bool = False  # the tile multiplied as two column halves (two accumulators) and
                                 # written through a half-tile buffer, one half after the other:
                                 # the other half's staging goes to a deeper ring (staged_halves.py)

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"Config.variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.num_warps not in (4, 8):
            raise ValueError(f"Config.num_warps must be 4 or 8 (one or two warpgroups), got {self.num_warps}")
        self._check_cluster()
        if self.variant == "gemv":
            return self._check_gemv()
        if self.block_m != 16 * self.num_warps:
            raise ValueError(f"Config.block_m must be 16 x num_warps = {16 * self.num_warps} "
                             f"(each warp owns 16 rows of the wgmma tile), got {self.block_m}")
        if self.block_n not in BLOCK_NS:
            raise ValueError(f"Config.block_n must be one of {BLOCK_NS} (a power of two, or 192: three "
                             f"128-byte swizzle columns of 16-bit elements), got {self.block_n}")
        if self.block_k not in (32, 64, 128, 256):
            raise ValueError(f"Config.block_k must be 32, 64, 128 or 256, got {self.block_k}")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"Config.stages must be 2..8, got {self.stages}")
        if self.group_m < 1:
            raise ValueError(f"Config.group_m must be positive, got {self.group_m}")
        if self.block_n == 192 and (self.split_k > 1 or self.variant != "warp_specialized"):
            raise ValueError(f"Config.block_n=192 (two_piece.py) has only the warp-specialized unsplit "
                             f"kernel: use split_k=1 and variant='warp_specialized', got {self}")
        if self.split_reduce not in SPLIT_REDUCES:
            raise ValueError(f"Config.split_reduce must be one of {SPLIT_REDUCES}, got {self.split_reduce!r}")
        if self.split_reduce == "tma" and self.split_k == 1:
            raise ValueError("Config.split_reduce='tma' adds split-K parts; it needs split_k > 1")
        if not 1 <= self.split_k <= MAX_SPLIT_K:
            raise ValueError(f"Config.split_k must be 1..{MAX_SPLIT_K}, got {self.split_k}")
        if self.split_k > 1 and self.variant != "warp_specialized":
            raise ValueError(f"Config.split_k={self.split_k} needs variant='warp_specialized' "
                             f"(only that kernel has a split-K form), got {self.variant!r}")
        if self.stream_k and (self.split_k > 1 or self.variant != "warp_specialized" or self.block_n == 192):
            raise ValueError(f"Config.stream_k=True shares tiles by K step in the warp-specialized kernel "
                             f"(stream_k.py): use split_k=1, variant='warp_specialized' and a power-of-two "
                             f"block_n, got {self}")
        if self.staged_halves and (self.block_n not in (128, 256) or self.split_k > 1 or self.stream_k
                                   or self.variant != "warp_specialized"):
            raise ValueError(f"Config.staged_halves=True writes the tile of the unsplit warp-specialized "
                             f"kernel (or its CTA pairs) in two column halves of whole TMA boxes: use "
                             f"block_n 128 or 256, split_k=1, stream_k=False and "
                             f"variant='warp_specialized', got {self}")
        if self.split_k > 1 and self.split_reduce == "atomic" and self.block_n > 128:
            raise ValueError(f"Config.split_k > 1 with atomic adds takes block_n <= 128: each thread "
                             f"holds block_n / 2 accumulators beside their workspace addresses, and "
                             f"{self.block_n} / 2 of each would spill; got block_n={self.block_n} "
                             f"(split_reduce='tma' takes 256)")

    def _check_cluster(self) -> None:
        """A config of CTA pairs (cluster.py; two_piece.py for 192-wide tiles): one
        direction, the warp-specialized kernel (unsplit, or split with TMA adds), and for
        pairs along M, B tiles of at least two TMA boxes (the CTAs load them in turn)."""
        pair = (self.cluster_m, self.cluster_n)
        if pair == (1, 1) and not any(isinstance(x, bool) for x in pair):
            return
        if pair not in ((2, 1), (1, 2)) or any(isinstance(x, bool) for x in pair):
            raise ValueError(f"Config.cluster_m and cluster_n pair CTAs along M (cluster_m=2) or along N "
                             f"(cluster_n=2), not both; each is 1 or 2, got cluster_m={self.cluster_m!r}, "
                             f"cluster_n={self.cluster_n!r}")
        atomic_split = self.split_k > 1 and self.split_reduce == "atomic"
        if self.variant != "warp_specialized" or atomic_split or self.stream_k:
            raise ValueError(f"Config.cluster_m/cluster_n=2 pairs the CTAs of the warp-specialized kernel, "
                             f"unsplit or split with TMA adds (cluster.py): use variant='warp_specialized', "
                             f"split_k=1 or split_reduce='tma', and stream_k=False, got {self}")
        if self.cluster_m == 2 and self.block_n < 128:
            raise ValueError(f"Config.cluster_m=2 shares B tiles as whole 64-column TMA boxes, each loaded by "
                             f"one CTA of the pair: block_n must be 128, 192 or 256, got {self.block_n}")

    def _check_gemv(self) -> None:
        """A gemv config: one row a CTA, power-of-two strips, K parts added by atomics."""
        if self.block_m != 1:
            raise ValueError(f"Config(variant='gemv') computes one row of C a CTA: block_m must be 1, "
                             f"got {self.block_m}")
        if self.block_n not in (16, 32, 64, 128, 256) or self.block_k not in (64, 128, 256, 512, 1024):
            raise ValueError(f"Config(variant='gemv') takes block_n 16..256 and block_k 64..1024, powers "
                             f"of two; got block_n={self.block_n}, block_k={self.block_k}")
        if not 1 <= self.split_k <= MAX_SPLIT_K or self.split_reduce != "atomic":
            raise ValueError(f"Config(variant='gemv') takes split_k 1..{MAX_SPLIT_K} with "
                             f"split_reduce='atomic', got {self.split_k}, {self.split_reduce!r}")

    def check_fits(self, in_bits: int, out_bits: int) -> None:
        if self.variant == "gemv":
            if in_bits != 16:
                raise ValueError(f"Config(variant='gemv') takes 16-bit inputs, got {in_bits}-bit ones")
            return
        needed = shared_bytes(self, in_bits, out_bits)
        if needed > SHARED_LIMIT:
            halves = "" if self.staged_halves or self.block_n not in (128, 256) or self.split_k > 1 \
                else ", or staged_halves=True (the output tile staged half at a time)"
            raise ValueError(f"{self} needs {needed} bytes of shared memory for {in_bits}-bit "
                             f"inputs and {out_bits}-bit output; a CTA has {SHARED_LIMIT}. "
                             f"Use fewer stages or a smaller block_n{halves}.")
        if self.block_k * in_bits // 8 > 128:
            raise ValueError(f"block_k={self.block_k} of {in_bits}-bit elements is "
                             f"{self.block_k * in_bits // 8} bytes per row; TMA boxes with the "
                             f"128-byte swizzle hold at most 128")


def shared_bytes(config: Config, in_bits: int, out_bits: int) -> int:
    """The ring (A and B slots), the output tile (fp32 partial tiles, where TMA adds the
    split-K parts) and the barriers. gemv keeps B in registers: only its cross-warp sums."""
    if config.variant == "gemv":
        return config.block_n * config.num_warps * 4
    stage = (config.block_m + config.block_n) * config.block_k * in_bits // 8
    out = config.block_m * config.block_n * out_bits // 8
    if config.staged_halves:
        out //= 2
    if config.split_k > 1 and config.split_reduce == "tma":
        out = config.block_m * staged_columns(config.block_m, config.block_n) * 4
    return config.stages * stage + out + 16 * config.stages


def staged_columns(block_m: int, block_n: int) -> int:
    """Columns of the fp32 partial tile a TMA-reduced split-K unit stages in shared memory
    at a time: the whole tile, or half of a 128x256 one (128 KiB whole would leave room
    for 2 ring stages; in halves, 64 KiB and 3)."""
    return block_n // 2 if block_m * block_n > 128 * 128 else block_n


def configs_for(in_bits: int, out_bits: int, m: int | None = None, n: int | None = None,
                k: int | None = None, sm_count: int | None = None, b_k_major: bool | None = None) -> list[Config]:
    """The candidates the autotuner times for an [m, k] x [k, n] problem on `sm_count` SMs;
    all fit in shared memory. Without a shape: the large-problem candidates.

    Shape classes, by what limits them:
    - one row (m = 1, 16-bit inputs, B's layout given by `b_k_major`): first the gemv
      candidates (`_gemv`: B read straight into registers, no tensor cores), then the
      decode ones.
    - decode (m <= 64): reading B from DRAM. One warpgroup's 64 rows (wgmma's minimum;
      the rows past m load as TMA zeros and cost no bandwidth, and the multiply is far
      under the memory time), 64 or 128 columns, as many stages as fit to keep the most
      bytes in flight, and K split so that the units (tiles x parts) fill whole waves
      of SMs (`split_for`; up to 4 waves: the partial tiles are a few rows, so more
      parts cost little).
      Where 64x128 tiles are too few to fill the SMs unsplit (the first candidate splits
      K), also TMA-reduced split-K candidates (split_k_tma.py) of 64x128 and 64x256
      tiles: the wider tile reads longer runs of each B row, and a part's add is one
      bulk copy, not an atomic per element.
    - few tiles (128x128 tiles cannot fill half the SMs: small M x N, usually long K):
      too few CTAs. 128x128 tiles (or 64x128) with K split to fill one wave of SMs (each
      part adds a whole fp32 tile into the workspace, so no more parts than that). For
      long K (K >= LONG_K x max(M, N): parts long enough that their adds all come at
      once), also 128x128 tiles whose parts add by TMA reduce-add, filling one wave and,
      where more parts fill the SMs better, up to 4 waves, and 128x256 tiles so split
      (their partial tiles added in two halves: split_k_tma.py); with 16-bit inputs, also
      128x128 CTA pairs (cluster.py) split to fill a wave of clusters.
    - everything else: the sweeps of docs/performance-journal.md: 128x256 tiles with 3
      stages lead at 4096^3 and 8192^3, with 8- or 16-row groups (8 led on the LLM
      projections of benchmarks/sweep_matmul_classes.py, by up to 15%; the autotuner
      times both); the others win on shapes where
      256-wide tiles leave SMs idle or the output tile crowds out stages. Where 128x128
      tiles make under two waves (e.g. 1000x3000: 192 tiles on 132 SMs, a second wave
      45% full), also a split-K 128x128 candidate whose units fill up to 3 waves, with
      atomic and with TMA adds, and a TMA-reduced 128x256 one (the autotuner weighs
      their workspace traffic against the idle SMs they save); and where neither
      128x256 nor 128x128 tiles fill FILL of their waves, the unsplit tile shapes of
      `WAVE_FILLING_TILES` that do (128x192 first: whole waves of large tiles); with
      16-bit inputs, then CTA pairs along M of the unsplit 128x256 and 128x192 ones
      (`PAIRED_TILES`) and, with 16-bit output, a 4-stage 128x256 pair (`_deep_pair`).
    """
    block_k = 1024 // in_bits  # 128 bytes: one 128-byte-swizzle row
    if m is not None and sm_count is not None:
        k_steps = -(-k // block_k)
        if m <= DECODE_ROWS:
            one_row = _gemv(n, k, sm_count, b_k_major) if m == 1 and in_bits == 16 and b_k_major is not None else []
            return one_row + _decode(m, n, k_steps, sm_count, block_k, in_bits, out_bits)
        if 2 * _tiles(m, n, 128, 128) <= sm_count:
            return _few_tiles(m, n, k, k_steps, sm_count, block_k, in_bits, out_bits)
    candidates = [Config(128, 256, block_k, 3, group_m=8), Config(128, 256, block_k, 3),
                  Config(128, 256, block_k, 3, variant="pipelined"),
                  Config(128, 256, block_k, 2), Config(128, 128, block_k, 5, group_m=8),
                  Config(128, 128, block_k, 4, group_m=8)]
    if m is not None and sm_count is not None and _tiles(m, n, 128, 128) < 2 * sm_count:
        parts = split_for(_tiles(m, n, 128, 128), -(-k // block_k), sm_count, 3)
        if parts > 1:
            candidates.append(Config(128, 128, block_k, 5, group_m=8, split_k=parts))
            candidates.append(Config(128, 128, block_k, 5, group_m=8, split_k=parts, split_reduce="tma"))
        candidates += [_deepest(c, in_bits, out_bits) for c in _wide_reduce_add(m, n, -(-k // block_k), sm_count,
                                                                                  block_k, 3)]
        if max(_efficiency(_tiles(m, n, 128, b), sm_count) for b in (256, 128)) < FILL:
            candidates += [_deepest(Config(block_m, block_n, block_k, 8, num_warps=block_m // 16, group_m=8),
                                    in_bits, out_bits) for block_m, block_n in WAVE_FILLING_TILES
                           if _efficiency(_tiles(m, n, block_m, block_n), sm_count) >= FILL]
        if in_bits == 16:
            candidates += [replace(c, cluster_m=2) for c in candidates if c.variant == "warp_specialized"
                           and c.split_k == 1 and c.group_m == 8 and (c.block_m, c.block_n) in PAIRED_TILES]
            candidates.append(_deep_pair(block_k))
    return [c for c in candidates if shared_bytes(c, in_bits, out_bits) <= SHARED_LIMIT]


# Tiles whose CTA pairs along M (cluster.py: B tiles loaded once a pair, by multicast) join
# the candidates of shapes under two waves of 128x128 tiles, 16-bit inputs: on the H200 they
# led where a row stride is not a multiple of 128 bytes (1000 x 3000 x 5000: 128x256 pairs
# 0.87x cuBLAS, unpaired tiles 0.68x; 1024 x 3000 x 5120: 128x192 pairs 0.97x, unpaired 0.81x)
# and tied elsewhere; at 4096^3 they lost (0.92x) and are not offered. Pairs along N (sharing
# A) trailed those along M on every shape measured.
PAIRED_TILES = ((128, 256), (128, 192))


def _deep_pair(block_k: int) -> Config:
    """The 128x256 pair along M with 4 stages, its tile written half at a time (staged_halves:
    a whole-tile buffer leaves room for 3), beside PAIRED_TILES' pairs; it fits with 16-bit
    output only. On the H200 at 1000 x 3000 x 5000 it led the 3-stage pair (0.88x cuBLAS
    against 0.84x with B [K, N], 0.80x against 0.77x with B K-major) even when it multiplied
    the halves as two 128-wide wgmmas a K step (3 stages so: 0.74x; staged_halves.py now
    issues one 256-wide wgmma); at 4096^3 that form lost (0.91x against 1.00x unpaired), so
    only this class gets it."""
    return Config(128, 256, block_k, 4, group_m=8, staged_halves=True, cluster_m=2)


# Other unsplit tiles for shapes whose 128x256 and 128x128 tiles leave a wave part
# empty: 128x192 (two_piece.py; 1000 x 3000 makes 128 of them, one wave on 132 SMs) and
# narrower ones, whose more tiles fill the last wave better.
WAVE_FILLING_TILES = ((128, 192), (128, 64), (64, 128))


def _wide_reduce_add(m: int, n: int, k_steps: int, sm_count: int, block_k: int, max_waves: int) -> list[Config]:
    """128x256 tiles (the large problems' leader) split by TMA reduce-add over at most
    `max_waves` waves, where splitting fills the SMs better: [] or one candidate."""
    parts = split_for(_tiles(m, n, 128, 256), k_steps, sm_count, max_waves)
    return [Config(128, 256, block_k, 3, group_m=8, split_k=parts, split_reduce="tma")] if parts > 1 else []


def _decode(m: int, n: int, k_steps: int, sm_count: int, block_k: int, in_bits: int, out_bits: int) -> list[Config]:
    candidates = [Config(64, block_n, block_k, 8, num_warps=4, group_m=1,
                         split_k=split_for(_tiles(m, n, 64, block_n), k_steps, sm_count, 4))
                  for block_n in (128, 64)]
    if candidates[0].split_k > 1:
        for block_n in (128, 256):
            parts = split_for(_tiles(m, n, 64, block_n), k_steps, sm_count, 4)
            if parts > 1:
                candidates.append(Config(64, block_n, block_k, 8, num_warps=4, group_m=1, split_k=parts,
                                         split_reduce="tma"))
    return [_deepest(c, in_bits, out_bits) for c in candidates]


GEMV_CTAS_PER_SM = 8  # CTAs of gemv resident per SM: each keeps one K step's B loads in flight


def _gemv(n: int, k: int, sm_count: int, b_k_major: bool) -> list[Config]:
    """gemv candidates for one row: strips of B (16 columns by 512 (or 256) of K where B is
    K-major, 64 columns by 128 of K where it is row-major; each a warp's whole 16-byte
    vectors), K split so that about GEMV_CTAS_PER_SM CTAs per SM (or twice that) keep
    loads in flight, each part at least two K steps; and unsplit where the strips alone
    are two per SM (one launch: split parts add in a workspace a second launch converts)."""
    shapes = ((16, 512), (16, 256)) if b_k_major else ((64, 128), (64, 64))
    candidates = []
    for (block_n, block_k), per_sm in zip(shapes, (GEMV_CTAS_PER_SM, 2 * GEMV_CTAS_PER_SM)):
        strips = -(-n // block_n)
        parts = -(-per_sm * sm_count // strips)
        parts = max(1, min(parts, k // (2 * block_k), MAX_SPLIT_K))
        candidates.append(Config(1, block_n, block_k, num_warps=4, group_m=1, variant="gemv", split_k=parts))
    block_n, block_k = shapes[0]
    if -(-n // block_n) >= 2 * sm_count:  # strips enough to fill the SMs in one launch, no workspace
        candidates.append(Config(1, block_n, block_k, num_warps=4, group_m=1, variant="gemv"))
    return list(dict.fromkeys(candidates))


def _few_tiles(m: int, n: int, k: int, k_steps: int, sm_count: int, block_k: int, in_bits: int,
               out_bits: int) -> list[Config]:
    candidates = [Config(block_m, 128, block_k, 8, num_warps=block_m // 16, group_m=8,
                         split_k=split_for(_tiles(m, n, block_m, 128), k_steps, sm_count))
                  for block_m in (128, 64)]
    if k >= LONG_K * max(m, n):
        tiles = _tiles(m, n, 128, 128)
        for parts in dict.fromkeys((split_for(tiles, k_steps, sm_count), split_for(tiles, k_steps, sm_count, 4))):
            if parts > 1:
                candidates.append(Config(128, 128, block_k, 8, group_m=8, split_k=parts, split_reduce="tma"))
        candidates += _wide_reduce_add(m, n, k_steps, sm_count, block_k, 4)
        # CTA pairs along M, split to fill a wave of clusters (about half the SMs): on the
        # H200, 512 x 512 x 32768 went from 0.72x cuBLAS (unpaired) to 0.87x.
        parts = split_for(_tiles(m, n, 256, 128), k_steps, sm_count // 2)
        if in_bits == 16 and parts > 1:
            candidates.append(Config(128, 128, block_k, 8, group_m=8, split_k=parts, split_reduce="tma", cluster_m=2))
    return [_deepest(c, in_bits, out_bits) for c in candidates]


def split_for(tiles: int, k_steps: int, sm_count: int, max_waves: int = 1) -> int:
    """K parts per tile for persistent CTAs on `sm_count` SMs: the fewest whose units
    (tiles x parts) come within 2% of the best wave efficiency (units / the SM slots
    of ceil(units / SMs) waves) among part counts giving at most `max_waves` waves,
    each part at least MIN_PART_STEPS K steps. 1 where splitting gains nothing."""
    def efficiency(parts):
        return _efficiency(tiles * parts, sm_count)

    limit = max(1, min(k_steps // MIN_PART_STEPS, MAX_SPLIT_K))
    allowed = [p for p in range(1, limit + 1) if p == 1 or -(-tiles * p // sm_count) <= max_waves]
    best = max(map(efficiency, allowed))
    return next(p for p in allowed if efficiency(p) >= best - 0.02)


def _efficiency(units: int, sm_count: int) -> float:
    """units / the SM slots of the waves they take."""
    return units / (-(-units // sm_count) * sm_count)


def _tiles(m: int, n: int, block_m: int, block_n: int) -> int:
    return -(-m // block_m) * -(-n // block_n)


def _deepest(config: Config, in_bits: int, out_bits: int) -> Config:
    """`config` with as many stages (up to its own) as fit in shared memory."""
    stages = config.stages
    while stages > 2 and shared_bytes(replace(config, stages=stages), in_bits, out_bits) > SHARED_LIMIT:
        stages -= 1
    return replace(config, stages=stages)
