"""Happens-before between the warps of one CTA, for shared-memory race checks.

With CTA barriers only, "which warps touched this byte since the last barrier" is
enough. Hopper kernels also order warps through named barriers (one partition),
mbarrier arrive -> wait pairs (between partitions) and async copies whose writes become
visible only at a completion point, so the emulator tracks the general relation with
vector clocks (the scheme of race detectors such as FastTrack):

- Every warp w has a clock C[w], one entry per *column*: one column per warp, then one
  per mbarrier (an "agent" standing for the async copies that complete on it).
  C[w][u] is the latest epoch of column u that w is ordered after; C[w][w] is w's own.
- A release (barrier, arrive, fence) hands out a copy of the clock and starts a new
  epoch; an acquire (barrier, wait) takes the entry-wise max. A barrier over warps S
  makes every warp of S acquire every other's release.
- Per byte of shared memory: for each column whose write is still the byte's value, the
  epoch of that write (a TMA load's bytes are stamped with the epoch its barrier phase
  will publish when it completes), and each warp's last read epoch.
- An access by w of a byte whose write (read) by column u has epoch e > C[w][u] is not
  ordered after it: a race (RAW, WAW with async writes, WAR).
- Async accesses in flight are listed apart: a cp.async write until its wait_group, a
  TMA load until it lands, a wgmma / TMA-store read until its wait. Any other access to
  those bytes is a race.
- The async proxy (wgmma, TMA) reads a generic-proxy write only if the writing warp ran
  fence_async_shared after the write and before the release the reader acquired. Bytes
  a cp.async wrote are the exception: once its wait_group retired them and a barrier (or
  mbarrier) published them, wgmma reads them with no proxy fence, as NVIDIA's own cp.async
  wgmma mainloops (CUTLASS's sm90 multistage collectives) and Triton's pipelined loops
  read them.

Epochs only grow during a launch; a new CTA starts with every clock at a fresh epoch, so
what earlier CTAs left behind counts as ordered without clearing the per-byte tables.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .errors import EmulationError
from .racecheck import RacecheckView, hazard_message

_GROW = 8  # agent columns added at a time
_NEVER = np.iinfo(np.int64).max


@dataclass
class AsyncAccess:
    """A wgmma / TMA-store read or a cp.async write still in flight."""

    rows: np.ndarray        # the byte addresses (duplicates allowed)
    warps: np.ndarray       # reads: the warps that own the read once it retires;
    write_rows: Optional[np.ndarray]  # writes: (byte, warp) pairs as two arrays
    write_warps: Optional[np.ndarray]
    op: object
    what: str               # "wgmma", "TMA store", "cp.async"
    remedy: str             # what retires it

    def holds(self, row: int) -> bool:
        return bool((self.rows == row).any())


class Ordering:
    """Vector clocks of one CTA's warps and mbarrier agents, and per-byte access epochs."""

    def __init__(self, size: int, num_warps: int, racecheck: bool = False):
        self.size = size
        self.num_warps = num_warps
        self.columns = num_warps
        self.epoch = 0
        self.clock = np.zeros((num_warps, num_warps + _GROW), np.int64)
        self.written = np.zeros((size, num_warps + _GROW), np.int32)
        self.read = np.zeros((size, num_warps), np.int32)
        self.write_op = np.full(size, -1, np.int32)
        self.read_op = np.full(size, -1, np.int32)
        # Whether a warp's last read of a byte was through the async proxy (wgmma, TMA
        # store): those need no proxy fence before an async write. Per warp: a generic
        # read of the same bytes by another warp (mma_v2 beside wgmma) needs its fence,
        # the wgmma's reads none.
        self.read_async = np.zeros((size, num_warps), bool)
        # Whether a byte's last write was a cp.async that has landed (retired): the async
        # proxy reads it without a proxy fence. A generic write clears it.
        self.copied = np.zeros(size, bool)
        self.pending_write = np.full(size, -1, np.int32)
        self.pending_reads = np.zeros(size, np.int32)
        self.live_barrier = np.zeros(size, bool)
        self.live_barriers = 0
        self.synced = np.zeros(num_warps, np.int64)  # each warp's epoch at its last sync
        self.records: dict[int, AsyncAccess] = {}
        self._record_ids = itertools.count()
        self.fences: list[list[int]] = [[] for _ in range(num_warps)]
        self.ops: list = []
        self._op_index: dict[int, int] = {}
        self.agent_columns: dict[int, int] = {}          # mbarrier byte address -> column
        self.agent_describe: dict[int, Callable] = {}    # column -> (epoch -> (text, completed))
        self.labels: Optional[list[str]] = None           # warp -> name, while partitions run
        self.window: Optional[int] = None                 # a cluster CTA's bytes (SharedMemory)
        self.cta_base = 0
        # WEFT_EMULATE_RACECHECK: the order compute-sanitizer's racecheck follows, beside
        # the hardware's (racecheck.py)
        self.racecheck: Optional[RacecheckView] = RacecheckView(num_warps) if racecheck else None
        self.new_cta()

    # ------------------------------------------------------------------ clocks
    def new_cta(self) -> None:
        """A fresh CTA: everything recorded so far counts as ordered before everyone."""
        self.epoch += 1
        self.cta_base = self.epoch
        self.clock[:] = self.epoch
        for w in range(self.num_warps):
            self.tick(w)
        if self.records:
            self.records.clear()
            self.pending_write.fill(-1)
            self.pending_reads.fill(0)
        self.live_barrier.fill(False)
        self.live_barriers = 0
        self.synced[:] = self.clock[np.arange(self.num_warps), np.arange(self.num_warps)]
        self.fences = [[] for _ in range(self.num_warps)]
        self.labels = None
        if self.racecheck is not None:
            self.racecheck.reset(self.clock)

    def tick(self, warp: int) -> None:
        self.epoch += 1
        self.clock[warp, warp] = self.epoch
        if self.racecheck is not None:
            self.racecheck.tick(warp, self.epoch)

    def reserve(self) -> int:
        """A fresh epoch for an agent column (an mbarrier phase that has not completed)."""
        self.epoch += 1
        return self.epoch

    def join(self, warps) -> None:
        """A barrier over `warps`: each is ordered after all the others' earlier work."""
        warps = np.asarray(warps, dtype=np.int64)
        self.clock[warps] = self.clock[warps].max(axis=0)
        if self.racecheck is not None:
            self.racecheck.join(warps)
        self._synced(warps)

    def _synced(self, warps: np.ndarray) -> None:
        for w in warps:
            self.tick(int(w))
        self.synced[warps] = self.clock[warps, warps]

    def release(self, warp: int) -> np.ndarray:
        """The clock `warp` publishes (arrive); it then starts a new epoch."""
        vc = self.clock[warp].copy()
        self.tick(warp)
        return vc

    def acquire(self, warps, vc: np.ndarray, racecheck_vc: Optional[np.ndarray] = None) -> None:
        """`warps` are ordered after the release `vc` (racecheck's view: `racecheck_vc`)."""
        warps = np.asarray(warps, dtype=np.int64)
        width = min(len(vc), self.clock.shape[1])
        self.clock[warps, :width] = np.maximum(self.clock[warps, :width], vc[:width])
        if self.racecheck is not None:
            self.racecheck.acquire(warps, racecheck_vc)
        self._synced(warps)

    def set_live_barrier(self, address: int, live: bool, nbytes: int = 8) -> None:
        """Mark an mbarrier's bytes live (init) or free (invalidate)."""
        self.live_barrier[address:address + nbytes] = live
        self.live_barriers += 1 if live else -1

    def empty_clock(self) -> np.ndarray:
        return np.zeros(self.clock.shape[1], np.int64)

    def fence(self, warps) -> None:
        """fence.proxy.async by `warps`: their generic writes so far may reach the async proxy."""
        for w in np.asarray(warps, dtype=np.int64):
            self.tick(int(w))
            self.fences[int(w)].append(int(self.clock[w, w]))

    def agent_column(self, address: int, describe: Callable) -> int:
        """The clock column of the mbarrier at `address` (kept across CTAs)."""
        column = self.agent_columns.get(address)
        if column is None:
            column = self.agent_columns[address] = self.columns
            self.columns += 1
            if self.columns > self.clock.shape[1]:
                grow = self.clock.shape[1] + _GROW
                clock = np.full((self.num_warps, grow), self.cta_base, np.int64)
                clock[:, :self.clock.shape[1]] = self.clock
                written = np.zeros((self.size, grow), np.int32)
                written[:, :self.written.shape[1]] = self.written
                self.clock, self.written = clock, written
            self.clock[:, column] = self.cta_base
        self.agent_describe[column] = describe
        return column

    # ------------------------------------------------------------------ messages
    def label(self, warp: int) -> str:
        return self.labels[warp] if self.labels else f"warp {warp}"

    def byte(self, row: int) -> str:
        """`byte 81920`, or in a cluster's shared memory `byte 81920 of CTA rank 1`."""
        if self.window is None:
            return f"byte {row}"
        rank, local = divmod(int(row), self.window)
        return f"byte {local} of CTA rank {rank}"

    def _op_id(self, op) -> int:
        key = id(op)
        if key not in self._op_index:
            self._op_index[key] = len(self.ops)
            self.ops.append(op)
        return self._op_index[key]

    def _op(self, index: int):
        return self.ops[index] if index >= 0 else None

    def _raise(self, message: str, op, other_op=None, other_what: str = "conflicting access"):
        other_loc = getattr(other_op, "loc", None)
        raise EmulationError(message, op.loc, other_loc=other_loc, other_what=other_what)

    # ------------------------------------------------------------------ checks
    def _check_barriers(self, rows: np.ndarray, op, verb: str) -> None:
        if self.live_barriers:
            hit = self.live_barrier[rows]
            if hit.any():
                row = int(rows[np.argmax(hit)])
                self._raise(f"{op.NAME} {verb} {self.byte(row)}, which belongs to a live mbarrier; "
                            f"invalidate the barrier (mbarrier.invalidate) before reusing its "
                            f"memory", op, self._op(int(self.write_op[row])), "mbarrier initialised")

    def _check_in_flight(self, rows, who: str, op, verb: str, reads_too: bool) -> None:
        if not self.records:
            return
        hit = self.pending_write[rows] >= 0
        if hit.any():
            row = int(rows[np.argmax(hit)])
            record = self.records[int(self.pending_write[row])]
            self._raise(f"shared-memory race: {who} {verb} {self.byte(row)}, which the {record.what} "
                        f"is still writing; {record.remedy} first",
                        op, record.op, f"{record.what} issued")
        if reads_too:
            hit = self.pending_reads[rows] > 0
            if hit.any():
                row = int(rows[np.argmax(hit)])
                record = next(r for r in self.records.values() if r.write_rows is None and r.holds(row))
                self._raise(f"shared-memory race (WAR): {who} {verb} {self.byte(row)}, which the "
                            f"{record.what} is still reading; {record.remedy} first",
                            op, record.op, f"{record.what} issued")

    def _check_writes(self, rows, clock: np.ndarray, who: str, op, kind: str, verb: str,
                      own: Optional[int] = None, async_only: bool = False) -> np.ndarray:
        """Every write of `rows` must be ordered before `clock` (RAW / WAW); returns the
        rows' write epochs. `own`: the accessing warp, whose own write of a byte since its
        last barrier or wait excuses another warp's unordered write of it (replicated
        layouts store one element from several warps); `async_only` checks only the TMA
        columns."""
        columns = self.columns
        written = self.written[rows, :columns]
        later = written > clock[:columns]
        if async_only:
            later[:, :self.num_warps] = False
        elif own is not None:
            excused = written[:, own] >= self.synced[own]
            later[excused, :self.num_warps] = False
        if not later.any():
            return written
        i = int(np.flatnonzero(later.any(axis=1))[0])
        column = int(np.argmax(later[i]))
        row = int(rows[i])
        if column < self.num_warps:
            self._raise(f"shared-memory race ({kind}): {who} {verb} {self.byte(row)}, which "
                        f"{self.label(column)} wrote with no barrier (or mbarrier wait) ordering "
                        f"the two; insert a barrier between them",
                        op, self._op(int(self.write_op[row])), f"written by {self.label(column)}")
        text, completed = self.agent_describe[column](int(written[i, column]))
        state = ("its phase has completed, but this warp has not waited for it" if completed
                 else "its phase has not completed")
        self._raise(f"shared-memory race ({kind}): {who} {verb} {self.byte(row)}, which {text} is "
                    f"still writing as far as this warp knows: the copy is in flight until a wait "
                    f"on that phase returns ({state}); wait on the barrier first",
                    op, self._op(int(self.write_op[row])), "TMA load issued")

    def _check_reads(self, rows, clock: np.ndarray, warp: int, op, verb: str) -> None:
        """Every read of `rows` by another warp must be ordered before `warp`'s write (WAR)."""
        later = self.read[rows] > clock[:self.num_warps]
        later[:, warp] = False
        if not later.any():
            return
        i = int(np.flatnonzero(later.any(axis=1))[0])
        reader = int(np.argmax(later[i]))
        row = int(rows[i])
        self._raise(f"shared-memory race (WAR): {self.label(warp)} {verb} {self.byte(row)}, which "
                    f"{self.label(reader)} read with no barrier (or mbarrier wait) ordering the "
                    f"two; insert a barrier between them",
                    op, self._op(int(self.read_op[row])), f"read by {self.label(reader)}")

    def _unfenced(self, rows, clock: np.ndarray, epochs: np.ndarray):
        """(warp, row) of a generic access at `epochs` (bytes x warps) that no fence of
        its warp follows before `clock` (the release the async proxy acquired), or None."""
        recent = epochs > self.cta_base
        if not recent.any():
            return None
        for warp in np.flatnonzero(recent.any(axis=0)):
            mask = recent[:, warp]
            accessed = epochs[mask, warp].astype(np.int64)
            fences = np.asarray(self.fences[warp], dtype=np.int64)
            if len(fences):
                at = np.searchsorted(fences, accessed, side="right")
                next_fence = np.where(at < len(fences), fences[np.minimum(at, len(fences) - 1)], _NEVER)
            else:
                next_fence = np.full(len(accessed), _NEVER)
            bad = next_fence > clock[warp]
            if bad.any():
                return int(warp), int(rows[mask][np.argmax(bad)])
        return None

    def _check_fenced(self, rows, clock: np.ndarray, written, op, what: str) -> None:
        """Generic-proxy writes read by the async proxy need a fence between the write and
        the release the reader acquired (`clock`)."""
        found = self._unfenced(rows, clock, np.where(self.copied[rows, None], 0, written[:, :self.num_warps]))
        if found is not None:
            writer, row = found
            self._raise(f"shared-memory race (proxy): generic-proxy write of {self.byte(row)} by "
                        f"{self.label(writer)} read by {what} without fence_async_shared: "
                        f"the writing threads must run fence_async_shared after the write and "
                        f"before the barrier that publishes it",
                        op, self._op(int(self.write_op[row])), f"generic-proxy write by {self.label(writer)}")

    def _check_reads_fenced(self, rows, clock: np.ndarray, op, what: str) -> None:
        """Generic-proxy reads that an async-proxy write (TMA load, bulk copy) overwrites
        need a fence too, between the read and the release the writer acquired: on the
        GPU a bulk copy issued right after a CTA barrier landed under loads of the same
        bytes that were still pending without one."""
        generic_reads = np.where(self.read_async[rows], 0, self.read[rows])
        found = self._unfenced(rows, clock, generic_reads)
        if found is not None:
            reader, row = found
            self._raise(f"shared-memory race (proxy): {what} overwrites {self.byte(row)}, which "
                        f"{self.label(reader)} read through the generic proxy without fence_async_shared: "
                        f"the reading threads must run fence_async_shared after their reads and "
                        f"before the barrier (or arrive) that hands the buffer to the copy",
                        op, self._op(int(self.read_op[row])), f"read by {self.label(reader)}")

    # ------------------------------------------------------------------ accesses
    def access(self, rows: np.ndarray, warps: np.ndarray, op, write: bool,
               barrier_op: bool = False) -> None:
        """A generic (ordinary) read or write: warp `warps[k]` accesses bytes `rows[k]`."""
        verb = "writes" if write else "reads"
        if not barrier_op:
            self._check_barriers(rows.reshape(-1), op, verb)
        op_id = self._op_id(op)
        for warp_rows, warp in zip(rows, warps):
            warp = int(warp)
            clock = self.clock[warp]
            who = self.label(warp)
            self._check_in_flight(warp_rows, who, op, verb, reads_too=write)
            if write:
                self._check_reads(warp_rows, clock, warp, op, verb)
                if self.racecheck is not None:
                    self._check_racecheck(warp_rows, warp, op, write)
                # another warp's unordered generic write is tolerated (replicated layouts
                # store one element from several warps); async writes are not
                if self.columns > self.num_warps:
                    self._check_writes(warp_rows, clock, who, op, "WAW", verb, async_only=True)
                self._record_write(warp_rows, clock, op_id, own=warp)
            else:
                self._check_writes(warp_rows, clock, who, op, "RAW", verb, own=warp)
                if self.racecheck is not None:
                    self._check_racecheck(warp_rows, warp, op, write)
                self.read[warp_rows, warp] = clock[warp]
                self.read_op[warp_rows] = op_id
                self.read_async[warp_rows, warp] = False

    def _check_racecheck(self, rows, warp: int, op, write: bool) -> None:
        """An ordinary access that the hardware orders (the checks above passed) but that
        racecheck would report against another warp's ordinary access (racecheck.py)."""
        who, verb = self.label(warp), "writes" if write else "reads"
        if write:
            found = self.racecheck.unordered_read(self.read[rows], self.read_async[rows], warp)
            kind, other_verb, table = "WAR", "read", self.read_op
        else:
            excused = self.written[rows, warp] >= self.synced[warp]
            found = self.racecheck.unordered_write(self.written[rows, :self.num_warps], excused, warp)
            kind, other_verb, table = "RAW", "wrote", self.write_op
        if found is not None:
            i, other = found
            row = int(rows[i])
            self._raise(hazard_message(kind, who, verb, self.byte(row), self.label(other), other_verb),
                        op, self._op(int(table[row])), f"{other_verb} by {self.label(other)}")

    def _record_write(self, rows, clock: np.ndarray, op_id: int, own: Optional[int]) -> None:
        written = self.written[rows, :self.columns]
        self.written[rows, :self.columns] = np.where(written <= clock[:self.columns], 0, written)
        if own is not None:
            self.written[rows, own] = clock[own]
            self.copied[rows] = False
        self.write_op[rows] = op_id

    def async_read(self, rows: np.ndarray, warps: np.ndarray, op, what: str, remedy: str) -> int:
        """The async proxy reads `rows` for `warps` (wgmma: the partition's warpgroups; TMA
        store: the issuing warp); the read stays in flight until `retire`. Every reader
        must be ordered after the bytes' writers: check against the least they all know."""
        warps = np.asarray(warps, dtype=np.int64)
        self._check_barriers(rows, op, "reads")
        clock = self.clock[warps].min(axis=0)
        late = warps[np.argmin(self.clock[warps], axis=0)]  # who knows least, per column
        who = self.label(int(warps[0])) if len(warps) == 1 else f"{what} (warps {list(map(int, warps))})"
        self._check_in_flight(rows, who, op, "reads", reads_too=False)
        try:
            written = self._check_writes(rows, clock, who, op, "RAW", "reads")
        except EmulationError:
            if len(warps) > 1:  # name the reader that is not ordered
                written = self.written[rows, :self.columns]
                column = int(np.argmax((written > clock[:self.columns]).any(axis=0)))
                self._check_writes(rows, self.clock[int(late[column])], self.label(int(late[column])),
                                   op, "RAW", "reads")
            raise
        self._check_fenced(rows, clock, written, op, what)
        record = AsyncAccess(rows, warps, None, None, op, what, remedy)
        return self._add(record)

    def async_write(self, rows: np.ndarray, warps: np.ndarray, op, what: str, remedy: str,
                    async_proxy: bool = False) -> int:
        """An async write: warp `warps[k]` starts writing bytes `rows[k]`, in flight until
        `retire` (a cp.async) or `land` (a TMA load or bulk copy: one issuing warp, through
        the async proxy)."""
        flat = rows.reshape(-1)
        self._check_barriers(flat, op, "writes")
        op_id = self._op_id(op)
        for warp_rows, warp in zip(rows, warps):
            warp = int(warp)
            clock = self.clock[warp]
            who = self.label(warp)
            self._check_in_flight(warp_rows, who, op, "writes", reads_too=True)
            self._check_reads(warp_rows, clock, warp, op, "writes")
            if async_proxy:
                self._check_reads_fenced(warp_rows, clock, op, what)
            self._check_writes(warp_rows, clock, who, op, "WAW", "writes")
            self._record_write(warp_rows, clock, op_id, own=None)
        record = AsyncAccess(flat.copy(), np.asarray(warps), flat.copy(),
                             np.repeat(np.asarray(warps, dtype=np.int64), rows.shape[1]), op, what, remedy)
        index = self._add(record)
        self.pending_write[flat] = index
        return index

    def land(self, index: int, column: int, epoch: int) -> None:
        """A TMA load lands: its bytes count as written by mbarrier `column`'s agent in the
        phase that publishes `epoch`."""
        record = self.records.pop(index)
        self.pending_write[record.rows] = -1
        self.written[record.rows, column] = epoch

    def _add(self, record: AsyncAccess) -> int:
        index = next(self._record_ids)
        self.records[index] = record
        if record.write_rows is None:
            self.pending_reads[record.rows] += 1
        return index

    def retire(self, index: int) -> None:
        """An async access completes (wait_group / wgmma wait / store_wait): its bytes now
        count as read (written) by its warps at this point."""
        record = self.records.pop(index)
        op_id = self._op_id(record.op)
        if record.write_rows is None:
            self.pending_reads[record.rows] -= 1
            for w in record.warps:
                self.read[record.rows, w] = self.clock[w, w]
                self.read_async[record.rows, w] = True
            self.read_op[record.rows] = op_id
        else:
            self.pending_write[record.rows] = -1
            self.copied[record.write_rows] = True
            self.written[record.write_rows, record.write_warps] = \
                self.clock[record.write_warps, record.write_warps]
