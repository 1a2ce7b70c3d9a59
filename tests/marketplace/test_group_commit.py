"""The group commit that writes install reports of many sockets together (marketplace/realtime/batches.py)."""

from __future__ import annotations

import asyncio

import pytest

from marketplace.realtime.batches import GroupCommit


class Writes:
    """A ``write`` that records its batches; each waits for :attr:`go` to be set (set already unless held)."""

    def __init__(self, *, held: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.go = asyncio.Event()
        if not held:
            self.go.set()

    async def __call__(self, items):
        self.batches.append(list(items))
        await self.go.wait()
        if "outage" in items:
            raise ConnectionError("database away")
        return [ValueError(f"{item} refused") if item.startswith("bad") else None for item in items]


async def until(predicate, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.001)


async def held_with(commit: GroupCommit, writes: Writes, first: str, *behind: str):
    """``first`` being written (its write held), and ``behind`` queued for the next write: their tasks."""
    task = asyncio.create_task(commit.submit(first))
    await until(lambda: len(writes.batches) == 1)  # alone: written at once, no wait for company
    tasks = [asyncio.create_task(commit.submit(item)) for item in behind]
    await until(lambda: commit.waiting() == len(behind))
    return task, tasks


async def test_what_arrives_while_a_write_runs_is_written_together_and_each_caller_gets_its_own_outcome():
    writes = Writes(held=True)
    commit = GroupCommit(writes)
    first, rest = await held_with(commit, writes, "a", "b", "bad-c", "d")
    writes.go.set()
    await first
    results = await asyncio.gather(*rest, return_exceptions=True)
    assert writes.batches == [["a"], ["b", "bad-c", "d"]]  # one write per round, not one per item
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], ValueError) and str(results[1]) == "bad-c refused"
    assert commit.waiting() == 0


async def test_a_write_that_fails_fails_its_batch_only():
    writes = Writes(held=True)
    commit = GroupCommit(writes)
    first, (later,) = await held_with(commit, writes, "outage", "e")
    writes.go.set()
    with pytest.raises(ConnectionError, match="database away"):
        await first
    await later  # the next batch is written as if nothing happened
    assert writes.batches == [["outage"], ["e"]]


async def test_batches_hold_at_most_max_items():
    writes = Writes(held=True)
    commit = GroupCommit(writes, max_items=2)
    first, rest = await held_with(commit, writes, "a", *"bcde")
    writes.go.set()
    await asyncio.gather(first, *rest)
    assert writes.batches == [["a"], ["b", "c"], ["d", "e"]]


async def test_a_caller_that_gives_up_leaves_its_item_written():
    writes = Writes(held=True)
    commit = GroupCommit(writes)
    first, (gone,) = await held_with(commit, writes, "a", "b")
    gone.cancel()  # its socket closed
    writes.go.set()
    await first
    await until(lambda: len(writes.batches) == 2)
    assert writes.batches[1] == ["b"]
    assert gone.cancelled()


async def test_callers_are_never_left_waiting_when_the_writer_is_cancelled():
    writes = Writes(held=True)
    commit = GroupCommit(writes)
    first, (second,) = await held_with(commit, writes, "a", "b")
    drain = next(task for task in asyncio.all_tasks() if task.get_name() == "group-commit")
    drain.cancel()  # the loop shutting down
    results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), timeout=5)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    writes.go.set()
    await asyncio.wait_for(commit.submit("c"), timeout=5)  # a new writer starts with the next item
    assert writes.batches[-1] == ["c"]
