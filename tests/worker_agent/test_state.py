"""The state an agent reports (and is billed by), and when it reports it."""

from __future__ import annotations

import pytest

from worker_agent.state import Facts, crash_reason, derive_state, heartbeat_due

IDLE = Facts(assigned=True, failure=None, producing=False, loading=False, installing=False)


@pytest.mark.parametrize(("facts", "state"), [
    (Facts(assigned=False, failure="x", producing=True, loading=True, installing=True), "idle"),  # no job
    (IDLE, "idle"),  # assigned, no work from the site or waiting for a version
    (Facts(assigned=True, failure="RuntimeError", producing=True, loading=False, installing=True), "failed"),
    (Facts(assigned=True, failure=None, producing=True, loading=False, installing=True), "generating"),
    (Facts(assigned=True, failure=None, producing=False, loading=True, installing=True), "loading"),
    (Facts(assigned=True, failure=None, producing=False, loading=False, installing=True), "installing"),
])
def test_the_state_follows_the_facts_by_precedence(facts, state):
    assert derive_state(facts) == state


def test_a_change_is_reported_at_once_but_never_twice_within_the_least_gap():
    due = dict(interval=5.0, min_gap=1.0)
    assert heartbeat_due(state="idle", last_state=None, last_sent=None, now=0.0, **due)  # the first, at once
    assert not heartbeat_due(state="idle", last_state="idle", last_sent=0.0, now=4.9, **due)
    assert heartbeat_due(state="idle", last_state="idle", last_sent=0.0, now=5.0, **due)
    assert not heartbeat_due(state="failed", last_state="generating", last_sent=0.0, now=0.5, **due)  # no flood
    assert heartbeat_due(state="failed", last_state="generating", last_sent=0.0, now=1.0, **due)


def test_a_crash_reason_is_one_short_line():
    assert crash_reason(TimeoutError()) == "TimeoutError"
    assert crash_reason(RuntimeError("CUDA error\nstack...")) == "RuntimeError: CUDA error"
    assert len(crash_reason(ValueError("x" * 500))) == 200


def test_entering_a_billed_state_is_reported_at_once_leaving_one_waits_for_the_gap():
    due = dict(interval=5.0, min_gap=1.0)
    assert heartbeat_due(state="generating", last_state="loading", last_sent=0.0, now=0.1, **due)
    assert heartbeat_due(state="installing", last_state="idle", last_sent=0.0, now=0.1, **due)
    assert not heartbeat_due(state="idle", last_state="generating", last_sent=0.0, now=0.5, **due)
    assert not heartbeat_due(state="installing", last_state="generating", last_sent=0.0, now=0.5, **due)
