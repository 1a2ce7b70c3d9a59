"""A relay's failed parent is reported to the site only for the job the agent serves.

When a job ends (or releases this worker) the chain above closes as well; reporting that parent as failed would
only earn a refusal from the site ("job 1 is completed; this worker was released from it"), which the demo's
agent logs showed at every job end."""

from __future__ import annotations

import asyncio

from tests.worker_agent.test_session import assign, make_session


def parent_failed(job_id: int) -> dict:
    return {"event": "parent_failed", "job_id": job_id, "version": 4, "parent": "127.0.0.1:9", "reason": "closed"}


async def test_a_parent_failure_is_reported_for_the_job_served_and_not_after_leaving_it(tmp_path) -> None:
    session, socket = make_session(tmp_path, [])
    session.assignment = assign(1, None)
    session.relaying._event(parent_failed(1))
    await asyncio.sleep(0.2)
    assert [r["job_id"] for r in socket.of("relay_failed")] == [1]

    session.assignment = None  # released: the job completed
    session.relaying._event({**parent_failed(1), "version": 5})
    session.relaying._event(parent_failed(2))  # a job this worker never served
    await asyncio.sleep(0.2)
    assert len(socket.of("relay_failed")) == 1
