"""The rings of the flash-attention kernel (kernels.py): where a position falls in a ring
of buffers (its slot and the parity of the slot's use), and how consumer warpgroups hand
ring slots back and pass the turn to issue GEMMs on, through mbarriers."""

from __future__ import annotations

import math

from ... import lowlevel as ll
from ...lowlevel import mbarrier


@ll.constexpr_function
def _shift_of(slots):
    """log2(slots) where slots is a power of two, else None."""
    return slots.bit_length() - 1 if slots & (slots - 1) == 0 else None


@ll.constexpr_function
def ready_barriers(slots, readers):
    """How many `ready` barriers a ring of `slots` buffers needs whose positions go to
    `readers` in turn (position j to reader j % readers), each reader reading only its
    own: lcm(slots, readers), barrier j % that for position j, so that each barrier has
    one reader, who waits for each of its phases in order. A wait names its phase by
    parity alone, so a reader sharing a barrier could pass on the phase two back: its
    last wait was on another barrier, and the other reader's load there, issued earlier,
    may land later (the Q ring of head_dim 256: three buffers, two warpgroups)."""
    return math.lcm(slots, readers)


@ll.jit
def ring_slot(position, SLOTS: ll.constexpr):
    """position % SLOTS for a ring position (>= 0): a mask where SLOTS is a power of two
    (positions are signed ints, and % would fix up the negative ones they never are:
    three uniform instructions more per use, in every key step)."""
    SHIFT: ll.constexpr = _shift_of(SLOTS)
    if SHIFT is None:
        return position % SLOTS
    return position & (SLOTS - 1)


@ll.jit
def ring_phase(position, SLOTS: ll.constexpr):
    """(position // SLOTS) & 1: the parity of the slot's use (a shift where SLOTS is a
    power of two, as `ring_slot`)."""
    SHIFT: ll.constexpr = _shift_of(SLOTS)
    if SHIFT is None:
        return (position // SLOTS) & 1
    return (position >> SHIFT) & 1


@ll.jit
def release(bar, PER_WARP: ll.constexpr):
    """This warpgroup's arrival on `bar` (a ring slot's `empty`, the next warpgroup's
    turn): warp by warp (PER_WARP; the barriers count 4 a warpgroup), else once, after a
    warpgroup-wide named barrier."""
    mbarrier.arrive(bar, per_warp=PER_WARP)


@ll.jit
def release_slot(bar, PER_WARP: ll.constexpr, CLUSTER: ll.constexpr):
    """This warpgroup's release of a K or V ring slot (`release`). In a cluster of two,
    each CTA's producer multicasts half of every K/V tile into both CTAs' slots, so it may
    reload a slot only once the consumers of both have released it: they arrive on their
    own CTA's barrier and on the peer's. That arrival releases at CTA scope: the slot was
    only read, by GEMMs already waited for, so nothing needs to become visible to the peer,
    and a cluster-scope release at every step slowed the kernel badly (docs/attention-journal.md)."""
    release(bar, PER_WARP)
    if CLUSTER > 1:
        mbarrier.arrive(bar, per_warp=PER_WARP, cta=ll.program_id(0) % CLUSTER ^ 1, scope="cta")


@ll.jit
def take_turn(turns, turn, wg):
    """Wait for warpgroup wg's turn-th turn (from 0, over the CTA's tiles) to issue its
    GEMMs. Its barrier completes a phase each time the warpgroup before it passes the
    turn on, so the turn-th turn waits for the (turn + 1)-th phase; warpgroup 0's, which
    goes first, for the turn-th (a fresh barrier's phase counts as passed)."""
    mbarrier.wait(turns.index(wg), (turn + 1 - ll.minimum(wg, 1)) & 1)


@ll.jit
def pass_turn(turns, wg, active, PER_WARP: ll.constexpr):
    """Pass the turn to the next of the tile's `active` warpgroups (`turn_takers`; the
    last passes to warpgroup 0). A select, not `% active`: replicated consumers read wg at
    run time, where a modulo is an integer division in every key step."""
    after = wg + 1
    release(turns.index(ll.where(after < active, after, 0)), PER_WARP)
