"""What an agent socket holds between messages, and for how long (marketplace/realtime/jobcache.py)."""

from __future__ import annotations

from marketplace.realtime.jobcache import FreshFor


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_value_is_kept_until_its_max_age_counted_from_the_read_and_dropped_by_clear():
    clock = Clock()
    held = FreshFor(2.0, clock=clock)
    held.put(1, "running", read_at=0.0)
    clock.now = 1.9
    assert held.get(1) == "running" and held.get(2) is None
    clock.now = 2.0
    assert held.get(1) is None  # as old as the max age: read again
    held.put(1, "again", read_at=1.5)  # a read that began before: its age counts from then
    clock.now = 3.6
    assert held.get(1) is None
    held.put(1, "third", read_at=3.6)
    held.clear()  # a push
    assert held.get(1) is None


def test_a_max_age_of_zero_holds_nothing():
    held = FreshFor(0.0, clock=Clock())
    held.put(1, "running", read_at=0.0)
    assert held.get(1) is None


def test_a_shared_read_is_taken_only_if_it_began_since_the_socket_last_forgot_and_is_young():
    from marketplace.realtime.jobcache import SharedReads

    clock = Clock()
    shared = SharedReads(clock=clock)
    shared.put(1, "read at 1", read_at=1.0)
    shared.put(1, "read at 0.5", read_at=0.5)  # an older read finishing late: the newer one stays
    clock.now = 2.0
    assert shared.get(1, not_before=1.0, max_age_s=2.0) == (1.0, "read at 1")
    assert shared.get(1, not_before=1.5, max_age_s=2.0) is None  # a push came after that read began
    assert shared.get(2, not_before=0.0, max_age_s=2.0) is None
    clock.now = 3.0
    assert shared.get(1, not_before=0.0, max_age_s=2.0) is None  # as old as the max age


def test_forgetting_marks_when():
    clock = Clock()
    held = FreshFor(2.0, clock=clock)
    assert held.cleared_at == 0.0  # a new socket takes no read older than itself
    clock.now = 5.0
    held.clear()
    assert held.cleared_at == 5.0


async def test_sockets_whose_holds_ran_out_together_wait_for_one_read():
    import asyncio

    from marketplace.realtime.jobcache import SharedReads

    clock = Clock()
    shared = SharedReads(clock=clock)
    reads, gate = [], asyncio.Event()

    async def read():
        reads.append(clock.now)
        which = f"read {len(reads)}"
        await gate.wait()
        return which

    first = asyncio.ensure_future(shared.read(1, read, not_before=0.0, max_age_s=2.0))
    await asyncio.sleep(0)
    joined = asyncio.ensure_future(shared.read(1, read, not_before=0.0, max_age_s=2.0))
    clock.now = 0.5
    pushed_since = asyncio.ensure_future(shared.read(1, read, not_before=0.5, max_age_s=2.0))  # began after it
    await asyncio.sleep(0)
    gate.set()
    assert await first == (0.0, "read 1") and await joined == (0.0, "read 1")
    assert await pushed_since == (0.5, "read 2")
    assert reads == [0.0, 0.5]
    assert await shared.read(1, read, not_before=0.0, max_age_s=2.0) == (0.5, "read 2")  # held now


async def test_the_next_read_starts_aside_once_the_newest_is_half_its_age_and_the_holds_that_run_out_take_it():
    """Every socket took the same read, so their holds run out together; the first socket to use its hold past half
    the read's age starts the next read in the background (one, however many sockets ask meanwhile), and the holds
    that run out later find it held: no socket waits for a read of its own."""
    import asyncio

    from marketplace.realtime.jobcache import REFRESH_AT, SharedReads

    clock = Clock()
    shared = SharedReads(clock=clock)
    reads = []

    async def read():
        reads.append(clock.now)
        return f"read {len(reads)}"

    assert await shared.read(1, read, not_before=0.0, max_age_s=2.0) == (0.0, "read 1")
    clock.now = 0.9 * REFRESH_AT * 2.0
    shared.refresh(1, read, max_age_s=2.0)  # young enough: nothing
    await asyncio.sleep(0)
    assert reads == [0.0]
    clock.now = REFRESH_AT * 2.0
    for _ in range(5):  # five sockets use their holds now: one read starts
        shared.refresh(1, read, max_age_s=2.0)
    for _ in range(3):
        await asyncio.sleep(0)
    assert reads == [0.0, 1.0]
    clock.now = 2.0  # the sockets' holds of the first read run out: the second is taken, no read of their own
    assert await shared.read(1, read, not_before=0.0, max_age_s=2.0) == (1.0, "read 2")
    assert reads == [0.0, 1.0]


async def test_a_read_aside_that_fails_is_logged_and_the_next_socket_reads_itself(caplog):
    import asyncio

    from marketplace.realtime.jobcache import SharedReads

    clock = Clock()
    shared = SharedReads(clock=clock)

    async def failing():
        raise ConnectionError("database away")

    async def read():
        return "read"

    clock.now = 5.0
    shared.refresh(1, failing, max_age_s=2.0)
    for _ in range(3):
        await asyncio.sleep(0)
    assert "reading it ahead failed (ConnectionError: database away)" in caplog.text
    assert await shared.read(1, read, not_before=0.0, max_age_s=2.0) == (5.0, "read")
