"""What compute-sanitizer's racecheck can see of the order between warps (WEFT_EMULATE_RACECHECK).

The emulator's race detection (ordering.py) follows every order the hardware gives. racecheck
follows less: it reported the accesses of every thread but the arriving one, where a
partition's named barrier was followed by ONE thread's mbarrier arrive (mbarrier.arrive's
default, "one thread issues"), as hazards against the waiter's accesses, although the GPU
orders them. So here an arrival publishes only what its warp accessed itself or learnt
through mbarrier waits, never what it learnt through a named barrier (the arrive's own or an
earlier one): named barriers order the warps that take part in them, and that is all.
Ordinary loads and stores (what racecheck watches) are checked against this order; wgmma and
TMA accesses, which it does not watch, are not.

The emulator orders whole warps, so a warp stands for its threads: an arrival from one lane of
each warp (per_warp) passes here, although racecheck may not follow that warp's sync either.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class RacecheckView:
    """Two [warps, warps] clocks; entry [w, u] is the latest epoch of warp u that w is
    ordered after as racecheck sees it: `known` through anything it follows (the checks),
    `publishable` leaving out named barriers (what w's arrivals publish). Ordering ticks,
    joins and acquires them beside its own clock."""

    def __init__(self, num_warps: int):
        self.known = np.zeros((num_warps, num_warps), np.int64)
        self.publishable = np.zeros((num_warps, num_warps), np.int64)

    def reset(self, clock: np.ndarray) -> None:
        """A fresh CTA: everything before counts as ordered (Ordering.new_cta's clock)."""
        self.known[:] = clock[:, :self.known.shape[0]]
        self.publishable[:] = self.known

    def tick(self, warp: int, epoch: int) -> None:
        self.known[warp, warp] = self.publishable[warp, warp] = epoch

    def join(self, warps: np.ndarray) -> None:
        """A barrier over `warps` (named, or the CTA's): they know each other's accesses."""
        self.known[warps] = self.known[warps].max(axis=0)

    def view(self, warp: int) -> np.ndarray:
        """What an arrival of `warp` publishes."""
        return self.publishable[warp].copy()

    def acquire(self, warps: np.ndarray, published: Optional[np.ndarray]) -> None:
        if published is not None:
            self.known[warps] = np.maximum(self.known[warps], published)
            self.publishable[warps] = np.maximum(self.publishable[warps], published)

    def unordered_write(self, written: np.ndarray, excused: np.ndarray,
                        warp: int) -> Optional[tuple[int, int]]:
        """(row of `written`, writer warp) of a write by another warp that racecheck
        sees unordered before `warp`'s read, or None. `written`: [bytes, warps] epochs;
        `excused`: bytes whose value `warp` wrote itself since its last sync (a replicated
        layout's store)."""
        later = written > self.known[warp]
        later[:, warp] = False
        later[excused] = False
        return _first(later)

    def unordered_read(self, read: np.ndarray, read_async: np.ndarray,
                       warp: int) -> Optional[tuple[int, int]]:
        """(row of `read`, reader warp) of an ordinary read by another warp that
        racecheck sees unordered before `warp`'s write, or None."""
        later = (read > self.known[warp]) & ~read_async
        later[:, warp] = False
        return _first(later)


def _first(later: np.ndarray) -> Optional[tuple[int, int]]:
    if not later.any():
        return None
    i = int(np.flatnonzero(later.any(axis=1))[0])
    return i, int(np.argmax(later[i]))


def hazard_message(kind: str, who: str, verb: str, byte: str, other: str, other_verb: str) -> str:
    return (f"racecheck hazard ({kind}): {who} {verb} {byte}, which {other} {other_verb}; the two are "
            f"ordered on the GPU, but only through a named barrier and one thread's mbarrier arrive, "
            f"which compute-sanitizer's racecheck does not follow: have every thread that {other_verb} "
            f"it arrive for itself (mbarrier.arrive(per_thread=True), the barrier's count in threads)")
