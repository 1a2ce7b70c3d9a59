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
