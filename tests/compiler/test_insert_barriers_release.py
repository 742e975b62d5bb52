"""insert_barriers' release rule: an arrival from every warp on an mbarrier, then an elected
wait on it, orders the elected thread (the TMA issuer) after what the warps did before
arriving, so its refill of a slot they read needs no CTA barrier; and nothing else is
settled by it (other threads, another barrier, reads after the arrival)."""

from weft.compiler.passes.insert_barriers import _Pending
from weft.compiler.passes.shared_accesses import ASYNC_KINDS, Access, ByteRange

SLOT, EMPTY, OTHER = ByteRange(0, 1024), ByteRange(2048, 2056), ByteRange(2056, 2064)
REFILL = Access(writes=(SLOT,), solo=True, on_mbarrier=True)  # a TMA load into the slot
ARRIVE = Access(reads=(EMPTY,), solo=True, releases=EMPTY)  # per-warp arrivals on EMPTY


def wait_on(barrier: ByteRange) -> Access:
    return Access(reads=(barrier,), solo=True, settles_for_solo=barrier)


def read_slot() -> _Pending:
    pending = _Pending({kind: 2 for kind in ASYNC_KINDS})
    pending.apply(Access(reads=(SLOT,)))  # every warp read the slot (a retired wgmma)
    return pending


def test_the_refill_after_arrive_and_elected_wait_needs_no_barrier():
    pending = read_slot()
    assert pending.conflicts(REFILL)
    pending.apply(ARRIVE)
    pending.apply(wait_on(EMPTY))
    assert not pending.conflicts(REFILL)
    assert pending.conflicts(Access(writes=(SLOT,)))  # every thread writing still needs one


def test_a_wait_on_another_barrier_or_without_the_arrival_settles_nothing():
    other = read_slot()
    other.apply(ARRIVE)
    other.apply(wait_on(OTHER))
    assert other.conflicts(REFILL)
    unreleased = read_slot()
    unreleased.apply(wait_on(EMPTY))
    assert unreleased.conflicts(REFILL)


def test_a_read_after_the_arrival_is_not_released_by_it():
    pending = read_slot()
    pending.apply(ARRIVE)
    pending.apply(Access(reads=(SLOT,)))  # read again after arriving
    pending.apply(wait_on(EMPTY))
    assert pending.conflicts(REFILL)


def test_merged_paths_keep_only_what_both_settled():
    settled, unsettled = read_slot(), read_slot()
    settled.apply(ARRIVE)
    settled.apply(wait_on(EMPTY))
    assert settled.union(unsettled).conflicts(REFILL)
