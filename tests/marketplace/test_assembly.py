"""Joining a group's parts on one connection: in order, consistent, bounded, all or nothing."""

from __future__ import annotations

import pytest

from dataplane import messages as m
from dataplane.records import Trajectory, TrajectoryGroup
from marketplace.core.assembly import AssemblyError, GroupAssembler, JobLimits, group_bytes_bound

LIMITS = JobLimits(group_size=4, max_bytes=10_000, timeout_s=30.0)


def record(i: int, **overrides) -> Trajectory:
    fields = {"job_id": 3, "lease_id": "1-0", "group_id": "g", "prompt": "1+1=", "prompt_ids": [1, 2],
              "completion": "2", "completion_ids": [4], "logprobs": [-0.5], "reward": float(i), "version": 1}
    return Trajectory(**fields | overrides)


def part(index: int, records: list[Trajectory], *, parts: int = 2, id: str | None = "r1") -> m.TrajectoriesPart:
    return m.TrajectoriesPart(group=TrajectoryGroup.of(records), part=index, parts=parts, id=id)


def add(assembler: GroupAssembler, message: m.TrajectoriesPart, *, size: int = 100, now: float = 0.0,
        limits: JobLimits = LIMITS):
    return assembler.add(message, frame_bytes=size, limits=limits, now=now)


def test_parts_in_order_join_into_the_whole_group_once():
    assembler = GroupAssembler()
    assert add(assembler, part(0, [record(0), record(1)])) is None
    whole = add(assembler, part(1, [record(2), record(3)]))
    assert [r.reward for r in whole.records] == [0.0, 1.0, 2.0, 3.0] and whole.version == 1
    assert assembler.partial is None


@pytest.mark.parametrize(("second", "reason"), [
    (part(1, [record(2, lease_id="2-0")]), "group.lease_id: part 1 says '2-0', the group in assembly '1-0'"),
    (part(1, [record(2)], parts=3), "part 1: of 3 parts under id 'r1', the group in assembly has 2 under id 'r1'"),
    (part(1, [record(2)], id="r2"), "part 1: of 2 parts under id 'r2'"),
    (part(2, [record(2)], parts=3), "part 2: out of order, expected part 1 of 3"),
    (part(1, [record(2), record(3), record(4)]), "records: more than the job's group size of 4"),
    (part(1, [record(2, prompt="2+2=")]), "group: records.2.prompt: differs from the rest of the group"),
])
def test_a_part_that_does_not_fit_is_refused_with_a_reason_and_drops_the_group(second, reason):
    assembler = GroupAssembler()
    add(assembler, part(0, [record(0), record(1)], parts=second.parts if second.part == 2 else 2))
    with pytest.raises(AssemblyError) as refused:
        add(assembler, second)
    assert str(refused.value).startswith(reason)
    assert refused.value.records == 2 + len(second.group.records)
    assert assembler.partial is None  # the group must start again from part 0


def test_duplicates_strays_timeouts_and_oversize_are_refused():
    assembler = GroupAssembler()
    with pytest.raises(AssemblyError, match="part 1: no group of lease '1-0' in assembly"):
        add(assembler, part(1, [record(0)]))
    add(assembler, part(0, [record(0)], parts=3))
    add(assembler, part(1, [record(1)], parts=3))
    with pytest.raises(AssemblyError, match="part 1: a duplicate, expected part 2 of 3"):
        add(assembler, part(1, [record(1)], parts=3))
    add(assembler, part(0, [record(0)]))
    with pytest.raises(AssemblyError, match="took over 30 s to arrive"):
        add(assembler, part(1, [record(1)]), now=31.0)
    add(assembler, part(0, [record(0)]), size=6_000)
    with pytest.raises(AssemblyError, match="the parts exceed 10000 bytes"):
        add(assembler, part(1, [record(1)]), size=6_000)
    with pytest.raises(AssemblyError, match="parts: 5 parts for a group of 4 records"):
        add(assembler, part(0, [record(0)], parts=5))


def test_a_new_group_replaces_an_unfinished_one():
    assembler = GroupAssembler()
    add(assembler, part(0, [record(0)], id="r1"))
    add(assembler, part(0, [record(0), record(1)], id="r2"))
    assert len(add(assembler, part(1, [record(2), record(3)], id="r2")).records) == 4


def test_a_part_index_past_its_count_is_refused_by_the_schema():
    with pytest.raises(m.MessageError, match="part 2 is out of range for a group of 2 parts"):
        m.parse_agent_message(part(0, [record(0)]).model_dump(mode="json") | {"part": 2})


def test_the_byte_bound_covers_the_longest_legal_group():
    # 64 completions of 32768 tokens: the brief's example, far above one 8 MiB frame
    assert group_bytes_bound(group_size=64, max_new_tokens=32_768) > 64 * 32_768 * 34
    assert group_bytes_bound(group_size=2, max_new_tokens=8) < group_bytes_bound(group_size=2, max_new_tokens=9)
