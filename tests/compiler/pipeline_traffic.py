"""Pipelined kernels of shared-memory traffic, for insert_barriers' property test: a ring of
`stages` [64, 64] fp16 buffers, indexed by the loop iteration, that a producer fills with
one input tile per iteration and a consumer (the default partition, 4 warps) reads, the
way real Hopper kernels pipeline their K loops.

- The producer fills a slot by TMA load (signalled on the slot's `full` mbarrier), by
  cp.async or by register stores; inline in the consumer's loop (refilling the slot it
  has just released, as a software-pipelined loop does) or, `specialized`, in a worker
  partition of 1 or 4 warps that waits on the slot's `empty` mbarrier and arrives on
  `full` (cp.async with `producer_lag` groups left in flight across its back edge).
- The consumer reads each tile into registers or into an async wgmma accumulating
  sum(x_t @ x_t^T), optionally TMA-stores (`echo`) the tile back out, and releases the
  tile `lag` iterations later (warpgroup_mma_wait(lag), store_wait(lag): work in flight
  across the loop's back edge), by refilling its slot or by arriving on `empty` (per
  partition or `per_warp`).

The builder writes every mbarrier wait (with its phase), wait_group, store_wait,
warpgroup_mma_wait and proxy fence the protocol needs, and no CTA barrier: a race the
emulator reports is one insert_barriers missed, a hang a barrier it put where not every
thread comes.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .shared_traffic import import_written_module

R = 64  # rows of a tile: one warpgroup's wgmma of M = 64, N = 64


@dataclasses.dataclass(frozen=True)
class Pipeline:
    producer: str  # "tma_load" | "cp_async" | "store"
    consumer: str  # "load" | "wgmma"
    stages: int = 2
    lag: int = 0  # iterations a tile stays held after its use (< stages)
    echo: bool = False  # the consumer TMA-stores every tile it reads
    specialized: bool = False  # the producer is a worker partition
    producer_warps: int = 1
    producer_lag: int = 0  # specialized cp.async: groups left in flight before `full`
    per_warp: bool = False  # specialized: each consumer warp arrives on `empty` itself

    def __post_init__(self):
        # Tiles the consumer holds past their use and tiles the producer holds unsignalled
        # each keep a slot; with none left over the two wait on each other.
        assert self.lag + self.producer_lag < self.stages, self


class _Lines:
    def __init__(self):
        self.lines: list[str] = []
        self.indent = 1

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def block(self, header: str):
        self(header)
        lines = self

        class _Indented:
            def __enter__(self):
                lines.indent += 1

            def __exit__(self, *exc):
                lines.indent -= 1

        return _Indented()

    def text(self) -> str:
        return "\n".join(self.lines)


def _fill(w: _Lines, p: Pipeline, tile: str, layout: str) -> None:
    """Start filling slot tile % stages with input tile `tile`; a TMA load completes on
    `full`, the others are done (cp.async: committed) when this returns."""
    slot = f"({tile}) % STAGES"
    if p.producer == "tma_load":
        w(f"mbarrier.expect(full.index({slot}), src_desc.nbytes)")
        w(f"tma.async_copy_global_to_shared(src_desc, [({tile}) * R, 0], full.index({slot}), ring.index({slot}))")
    elif p.producer == "cp_async":
        w(f"async_copy.async_copy_global_to_shared(ring.index({slot}), x_ptr + ({tile}) * R * 64 "
          f"+ tile_offsets(R, 64, {layout}))")
    else:
        w(f"ring.index({slot}).store(ll.load(x_ptr + ({tile}) * R * 64 + tile_offsets(R, 64, {layout})))")
        w("ll.fence_async_shared()")  # the consumer's wgmma or TMA store reads in the async proxy


def _consumer_loop(w: _Lines, p: Pipeline) -> None:
    with w.block("for it in range(iterations):"):
        w("s = it % STAGES")
        if p.producer == "tma_load" or p.specialized:
            w("mbarrier.wait(full.index(s), (it // STAGES) & 1)")
        elif p.producer == "cp_async":
            # One group committed per prologue slot and per iteration (empty ones too),
            # and tile t >= STAGES in group t + lag: tile `it` is done with these left.
            w(f"async_copy.wait_group({max(p.stages - 1 - p.lag, 0)})")
            w("ll.fence_async_shared()")
        if p.consumer == "load":
            w("ll.store(dump_ptr + it * R * 64 + tile_offsets(R, 64, COL), ring.index(s).load(COL).to(ll.float32))")
            w("ll.fence_async_shared()")  # a TMA load may overwrite what the generic proxy read
        else:
            w("acc = ll.warpgroup_mma(ring.index(s), ring.index(s).permute((1, 0)), acc, is_async=True)")
        if p.echo:
            w("tma.async_copy_shared_to_global(out_desc, [it * R, 0], ring.index(s))")
        # Release tile r = it - lag: its wgmma and TMA store must be done first.
        if p.consumer == "wgmma":
            w(f"acc = ll.warpgroup_mma_wait({p.lag}, deps=[acc])")
        if p.echo:
            w(f"tma.store_wait({p.lag})")
        w(f"r = it - {p.lag}")
        if p.specialized:
            with w.block("if r >= 0:"):
                w(f"mbarrier.arrive(empty.index(r % STAGES){', per_warp=True' if p.per_warp else ''})")
        else:
            with w.block("if (r >= 0) & (r + STAGES < iterations):"):
                _fill(w, p, "r + STAGES", "COL" if p.producer == "cp_async" else "ROW")
            if p.producer == "cp_async":
                w("async_copy.commit_group()")
    if p.consumer == "wgmma":
        w("acc = ll.warpgroup_mma_wait(0, deps=[acc])")
        w("ll.store(mma_ptr + tile_offsets(R, R, ACC), acc)")
    if p.echo:
        w("tma.store_wait(0)")
    if p.producer == "cp_async" and not p.specialized:
        w("async_copy.wait_group(0)")


def _consumer(p: Pipeline) -> str:
    w = _Lines()
    if p.consumer == "wgmma":
        w("acc = ll.zeros([R, R], ll.float32, ACC)")
    if not p.specialized:  # the prologue fills every slot it has a tile for
        for t in range(p.stages):
            with w.block(f"if {t} < iterations:"):
                _fill(w, p, str(t), "COL" if p.producer == "cp_async" else "ROW")
            if p.producer == "cp_async":
                w("async_copy.commit_group()")
    _consumer_loop(w, p)
    return w.text()


def _producer(p: Pipeline) -> str:
    w = _Lines()
    with w.block("for t in range(iterations):"):
        w("s = t % STAGES")
        w("mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)")  # a fresh barrier passes phase 1
        _fill(w, p, "t", "PROD")
        if p.producer == "cp_async":
            w("async_copy.commit_group()")
            w(f"async_copy.wait_group({p.producer_lag})")
            w("ll.fence_async_shared()")
            with w.block(f"if t >= {p.producer_lag}:"):
                w(f"mbarrier.arrive(full.index((t - {p.producer_lag}) % STAGES))")
        elif p.producer == "store":
            w("mbarrier.arrive(full.index(s))")
    if p.producer == "cp_async" and p.producer_lag:
        w("async_copy.wait_group(0)")
        w("ll.fence_async_shared()")
        with w.block("if iterations >= 1:"):
            w("mbarrier.arrive(full.index((iterations - 1) % STAGES))")
    return w.text()


ARGS = "x_ptr, src_desc, out_desc, dump_ptr, mma_ptr, iterations, ring, full, empty"


def source_of(p: Pipeline) -> str:
    """The module text: a kernel `pipeline` (and its partitions) running the pipeline."""
    pw = p.producer_warps if p.specialized else 4
    empty_count = 4 if p.per_warp else 1
    run = (f"    ll.warp_specialize(({ARGS}), consume, ({ARGS}), [produce], worker_num_warps=[{pw}], "
           "worker_num_regs=[0])" if p.specialized else f"    consume({ARGS})")
    return f'''from weft import lowlevel as ll
from weft.lowlevel import async_copy, mbarrier, tma

R: ll.constexpr = {R}
STAGES: ll.constexpr = {p.stages}
ROW: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
COL: ll.constexpr = ll.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
PROD: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [{pw}, 1], [1, 0])
ACC: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [4, 1], [16, R, 16])


@ll.jit
def tile_offsets(ROWS: ll.constexpr, COLS: ll.constexpr, LAYOUT: ll.constexpr):
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, LAYOUT))
    return rows[:, None] * COLS + cols[None, :]


@ll.jit
def consume({ARGS}):
{_consumer(p)}


@ll.jit
def produce({ARGS}):
{_producer(p) if p.specialized else "    pass"}


@ll.jit
def pipeline(x_ptr, src_desc, out_desc, dump_ptr, mma_ptr, iterations):
    ring = ll.allocate_shared_memory(ll.float16, [STAGES, R, 64], src_desc.layout)
    full = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for i in ll.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count={empty_count})
{run}
'''


@functools.lru_cache(maxsize=None)
def load_kernel(p: Pipeline):
    """The `pipeline` kernel; one per pipeline, so its compilation is reused while
    hypothesis shrinks."""
    module, _ = import_written_module(source_of(p), "pipeline")
    return module.pipeline


def expected(p: Pipeline, x: np.ndarray, iterations: int):
    """What the load dump, the wgmma accumulator and the echoed output hold after the run
    (NaN where nothing is written)."""
    tiles = x.astype(np.float64).reshape(-1, R, 64)[:iterations]
    loads = np.full((max(iterations, 1), R, 64), np.nan)
    mma = np.full((R, R), np.nan)
    out = np.full((max(iterations, 1) * R, 64), np.nan)
    if p.consumer == "load":
        loads[:iterations] = tiles
    else:
        mma = sum((t @ t.T for t in tiles), np.zeros((R, R)))
    if p.echo:
        out[:iterations * R] = tiles.reshape(-1, 64)
    return loads, mma, out
