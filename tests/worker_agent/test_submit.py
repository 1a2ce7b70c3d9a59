"""Cutting a group too big for one frame into parts, on the agent: each part fits, together they are the group."""

from __future__ import annotations

import json

import pytest

from dataplane import messages as m
from dataplane.records import Trajectory, TrajectoryGroup
from worker_agent.submit import RecordTooBig, frames, pack


def group(n: int, tokens: int, *, prompt: str = "12+30=") -> TrajectoryGroup:
    return TrajectoryGroup.of([Trajectory(job_id=3, lease_id="1-0", group_id="g", prompt=prompt, prompt_ids=[1, 2],
                                          completion="4" * tokens, completion_ids=list(range(tokens)),
                                          logprobs=[-0.1234567890123 - i for i in range(tokens)], reward=float(i % 2),
                                          version=2) for i in range(n)])


def test_a_group_under_the_limit_goes_as_one_trajectories_frame():
    message = m.Trajectories(group=group(4, 10), id="r1")
    assert frames(message, limit=1 << 20) == [message.model_dump_json()]
    assert frames(m.LeaseRequest(job_id=3, id="r2"), limit=10) == [m.LeaseRequest(job_id=3, id="r2").model_dump_json()]


@pytest.mark.parametrize("limit", [6_000, 12_000, 30_000])
def test_a_group_over_the_limit_goes_in_ordered_parts_that_fit_and_join_into_the_same_group(limit):
    whole = group(8, 200, prompt="é" * 50)  # non-ASCII: the limit counts bytes, not characters
    message = m.Trajectories(group=whole, id="r9")
    assert len(message.model_dump_json().encode()) > limit
    texts = frames(message, limit=limit)
    assert all(len(text.encode()) <= limit for text in texts)
    parts = [m.parse_agent_message(json.loads(text)) for text in texts]
    assert all(isinstance(p, m.TrajectoriesPart) for p in parts)
    assert [(p.part, p.parts, p.id) for p in parts] == [(i, len(parts), "r9") for i in range(len(parts))]
    joined = [record for p in parts for record in p.group.records]
    assert TrajectoryGroup.of(joined) == whole
    assert len(parts) == len(frames(message, limit=limit))  # deterministic


def test_a_record_that_alone_exceeds_the_limit_cannot_be_split():
    with pytest.raises(RecordTooBig, match="record 0 is .* bytes of JSON alone"):
        frames(m.Trajectories(group=group(2, 300), id="r1"), limit=2_000)


def test_pack_is_greedy_in_order():
    assert pack(sizes=[3, 3, 3, 3, 9], budget=10) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    with pytest.raises(RecordTooBig):
        pack(sizes=[3, 10], budget=10)
