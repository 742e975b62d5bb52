"""Small kernels of shared-memory traffic, built from a list of ops, for insert_barriers'
property test: register stores and loads, cp.async, TMA loads and stores and async wgmma
reads over two [R, 64] fp16 buffers, in a prologue, a run-time loop and an epilogue,
optionally inside a worker partition of warp_specialize.

The builder writes every wait the async protocol needs (mbarrier waits with their phases,
wait_group, store_wait, warpgroup_mma_wait) and a fence_async_shared after every generic
access, as a careful author would; it writes no CTA barrier but the ops that ask for one.
So a race the emulator reports is a barrier insert_barriers missed. A numpy model runs the
same ops for the values each load, wgmma and TMA store must see.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import os
import tempfile
from typing import Optional

import numpy as np

BUFFERS = 2
SOURCES = 3  # tiles of the input a buffer can be filled with


@dataclasses.dataclass(frozen=True)
class Op:
    """kind: "store" (registers -> buffer, tile `arg`), "load" (buffer -> registers ->
    global), "cp_async" (tile `arg`), "tma_load" (tile `arg`), "tma_store" (to output
    tile `arg`), "wgmma" (buffer @ buffer `arg`^T), "barrier"."""

    kind: str
    buffer: int = 0
    arg: int = 0


@dataclasses.dataclass(frozen=True)
class Program:
    prologue: tuple[Op, ...]
    body: tuple[Op, ...]  # run `iterations` times in a run-time loop
    epilogue: tuple[Op, ...]
    num_warps: int = 4  # of the partition running the ops
    worker: bool = False  # the ops run in a worker partition (the default one idles)

    @property
    def rows(self) -> int:
        return 16 * self.num_warps if self.num_warps >= 4 else 64

    def ops(self):
        return self.prologue + self.body + self.epilogue


class _Writer:
    """Writes the ops as lowlevel source, adding the waits each op needs first."""

    def __init__(self):
        self.lines: list[str] = []
        self.indent = 1
        self.tma_pending = [False] * BUFFERS   # a TMA load not yet waited for
        self.cp_pending = [False] * BUFFERS    # cp.async not yet waited for
        self.store_pending = [False] * BUFFERS  # a TMA store still reading
        self.wgmma: Optional[tuple[int, int, int]] = None  # (a, b, slot) in flight
        self.loads = self.mmas = self.stores = 0

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    # ---------------------------------------------------------------- waits
    def wait_tma(self, b: int) -> None:
        if self.tma_pending[b]:
            self.emit(f"mbarrier.wait(bar{b}, phase{b})")
            self.emit(f"phase{b} = phase{b} ^ 1")
            self.tma_pending[b] = False

    def wait_cp(self, b: int) -> None:
        if self.cp_pending[b]:
            self.emit("async_copy.wait_group(0)")
            self.emit("ll.fence_async_shared()")  # cp.async writes through the generic proxy
            self.cp_pending = [False] * BUFFERS

    def wait_store(self, b: int) -> None:
        if self.store_pending[b]:
            self.emit("tma.store_wait(0)")
            self.store_pending = [False] * BUFFERS

    def wait_wgmma(self, b: Optional[int] = None) -> None:
        if self.wgmma is not None and (b is None or b in self.wgmma[:2]):
            slot = self.wgmma[2]
            self.emit(f"acc{slot} = ll.warpgroup_mma_wait(0, deps=[acc{slot}])")
            self.emit(f"ll.store(mma_ptr + {slot} * R * R + tile_offsets(R, R, ACC), acc{slot})")
            self.wgmma = None

    def before_write(self, b: int) -> None:
        self.wait_tma(b)
        self.wait_cp(b)
        self.wait_store(b)
        self.wait_wgmma(b)

    def before_read(self, b: int) -> None:
        self.wait_tma(b)
        self.wait_cp(b)

    def settle(self) -> None:
        for b in range(BUFFERS):
            self.before_write(b)

    # ---------------------------------------------------------------- ops
    def op(self, op: Op, slots: dict) -> None:
        b, buf = op.buffer, f"buf{op.buffer}"
        if op.kind == "store":
            self.before_write(b)
            self.emit(f"{buf}.store(ll.load(x_ptr + {op.arg} * R * 64 + tile_offsets(R, 64, ROW)))")
            self.emit("ll.fence_async_shared()")
        elif op.kind == "load":
            self.before_read(b)
            self.emit(f"ll.store(dump_ptr + {slots[op] * 64} * R + tile_offsets(R, 64, COL), "
                      f"{buf}.load(COL).to(ll.float32))")
            self.emit("ll.fence_async_shared()")
        elif op.kind == "cp_async":
            self.before_write(b)
            self.emit(f"async_copy.async_copy_global_to_shared({buf}, x_ptr + {op.arg} * R * 64 "
                      "+ tile_offsets(R, 64, ROW))")
            self.emit("async_copy.commit_group()")
            self.cp_pending[b] = True
        elif op.kind == "tma_load":
            self.before_write(b)
            self.emit(f"mbarrier.expect(bar{b}, src_desc.nbytes)")
            self.emit(f"tma.async_copy_global_to_shared(src_desc, [{op.arg} * R, 0], bar{b}, {buf})")
            self.tma_pending[b] = True
        elif op.kind == "tma_store":
            self.before_read(b)
            self.emit(f"tma.async_copy_shared_to_global(out_desc, [{op.arg} * R, 0], {buf})")
            self.store_pending[b] = True
        elif op.kind == "wgmma":
            self.before_read(b)
            self.before_read(op.arg)
            self.wait_wgmma()
            slot = slots[op]
            self.emit(f"acc{slot} = ll.warpgroup_mma({buf}, buf{op.arg}.permute((1, 0)), "
                      "ll.zeros([R, R], ll.float32, ACC), is_async=True)")
            self.wgmma = (b, op.arg, slot)
        elif op.kind == "barrier":
            self.emit("ll.barrier()")
        else:
            raise ValueError(op.kind)


def slots_of(program: Program) -> dict:
    """The dump slot of each load and wgmma (ops are values: equal ops share a slot, and
    the last write of the slot is the one checked)."""
    slots, counts = {}, {"load": 0, "wgmma": 0}
    for op in program.ops():
        if op.kind in counts and op not in slots:
            slots[op] = counts[op.kind]
            counts[op.kind] += 1
    return slots


def source_of(program: Program) -> str:
    """The module text: a kernel `traffic` (and its partitions) running the program."""
    writer, slots = _Writer(), slots_of(program)
    for op in program.prologue:
        writer.op(op, slots)
    writer.settle()
    writer.emit("for it in range(iterations):")
    writer.indent += 1
    writer.emit("pass")
    for op in program.body:
        writer.op(op, slots)
    writer.settle()
    writer.indent -= 1
    for op in program.epilogue:
        writer.op(op, slots)
    writer.settle()
    body = "\n".join(writer.lines)
    nw, rows = program.num_warps, program.rows
    default_warps = 4 if program.worker else nw
    specialize = (
        "    ll.warp_specialize((x_ptr,), idle, (x_ptr, src_desc, out_desc, dump_ptr, mma_ptr, iterations, buf0, buf1, "
        f"bar0, bar1), [run_ops], worker_num_warps=[{nw}], worker_num_regs=[0])"
        if program.worker else
        "    run_ops(x_ptr, src_desc, out_desc, dump_ptr, mma_ptr, iterations, buf0, buf1, bar0, bar1)")
    return f'''from weft import lowlevel as ll
from weft.lowlevel import async_copy, mbarrier, tma

R: ll.constexpr = {rows}
ROW: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [{nw}, 1], [1, 0])
COL: ll.constexpr = ll.BlockedLayout([8, 1], [8, 4], [1, {nw}], [0, 1])
ACC: ll.constexpr = ll.NVMMADistributedLayout([3, 0], [{max(nw, 4)}, 1], [16, {rows}, 16])
INIT: ll.constexpr = ll.BlockedLayout([1, 8], [4, 8], [{default_warps}, 1], [1, 0])


@ll.jit
def tile_offsets(ROWS: ll.constexpr, COLS: ll.constexpr, LAYOUT: ll.constexpr):
    rows = ll.arange(0, ROWS, ll.SliceLayout(1, LAYOUT))
    cols = ll.arange(0, COLS, ll.SliceLayout(0, LAYOUT))
    return rows[:, None] * COLS + cols[None, :]


@ll.jit
def run_ops(x_ptr, src_desc, out_desc, dump_ptr, mma_ptr, iterations, buf0, buf1, bar0, bar1):
    phase0 = 0
    phase1 = 0
{body}


@ll.jit
def idle(x_ptr):
    pass


@ll.jit
def traffic(x_ptr, src_desc, out_desc, dump_ptr, mma_ptr, iterations):
    buf0 = ll.allocate_shared_memory(ll.float16, [R, 64], src_desc.layout,
                                     ll.load(x_ptr + tile_offsets(R, 64, INIT)))
    buf1 = ll.allocate_shared_memory(ll.float16, [R, 64], src_desc.layout,
                                     ll.load(x_ptr + R * 64 + tile_offsets(R, 64, INIT)))
    ll.fence_async_shared()
    bar0 = mbarrier.allocate_mbarrier()
    bar1 = mbarrier.allocate_mbarrier()
    mbarrier.init(bar0, count=1)
    mbarrier.init(bar1, count=1)
{specialize}
'''


def import_written_module(text: str, prefix: str):
    """The module whose source is `text`, written once under the temp dir (the frontend
    reads kernels' source from their files) as `<prefix>_<digest>.py`; returns it and its path."""
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), f"weft-{prefix}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{prefix}_{digest}.py")
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    spec = importlib.util.spec_from_file_location(f"{prefix}_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


@functools.lru_cache(maxsize=None)
def load_kernel(program: Program):
    """The `traffic` kernel of a program; one per program, so its compilation is reused
    while hypothesis shrinks the seed, the iterations and the shuffle."""
    module, path = import_written_module(source_of(program), "traffic")
    return module.traffic, path


def expected(program: Program, x: np.ndarray, iterations: int):
    """What each load slot, wgmma slot and output tile holds after the run (NaN where
    nothing was written), by running the ops on numpy copies of the buffers."""
    rows, slots = program.rows, slots_of(program)
    tiles = x.astype(np.float64).reshape(SOURCES, rows, 64)
    buffers = [tiles[0].copy(), tiles[1].copy()]
    loads = np.full((max(1, sum(op.kind == "load" for op in slots)), rows, 64), np.nan)
    mmas = np.full((max(1, sum(op.kind == "wgmma" for op in slots)), rows, rows), np.nan)
    out = np.full((SOURCES * rows, 64), np.nan)

    def run(op: Op) -> None:
        if op.kind in ("store", "cp_async", "tma_load"):
            buffers[op.buffer] = tiles[op.arg].copy()
        elif op.kind == "load":
            loads[slots[op]] = buffers[op.buffer]
        elif op.kind == "tma_store":
            out[op.arg * rows:(op.arg + 1) * rows] = buffers[op.buffer]
        elif op.kind == "wgmma":
            mmas[slots[op]] = buffers[op.buffer] @ buffers[op.arg].T

    for op in program.prologue:
        run(op)
    for _ in range(iterations):
        for op in program.body:
            run(op)
    for op in program.epilogue:
        run(op)
    return loads, mmas, out
