"""The learner's state machine alone (no Redis, no site): paused waits without failing, idle fails after the
data timeout, a job ended on the site stops the learner with the site's status, and our failures fail."""

from __future__ import annotations

import pytest

from dataplane.jobs import JobStatus
from learner.lifecycle import FINAL, TRANSITIONS, Lifecycle, State, TransitionError


def test_idle_fails_after_the_data_timeout_and_commits_what_was_trained() -> None:
    life = Lifecycle(data_timeout_s=30)
    assert life.no_data("running", 10) is State.IDLE
    assert life.no_data(None, 10) is State.IDLE  # the site not answering counts as running
    assert life.no_data("running", 10, waiting_for=" (waiting for 2 groups at v3)") is State.FAILED
    assert life.final and life.status is JobStatus.FAILED and life.commit
    assert life.reason == "no admissible trajectories for 30s (waiting for 2 groups at v3)"


def test_data_resets_the_timeout_and_its_wait_goes_into_the_bubble() -> None:
    life = Lifecycle(data_timeout_s=30)
    life.no_data("running", 10)
    life.no_data("running", 10)
    assert life.trained() == 20  # the earlier polls belong to this step's wait
    assert (life.state, life.idle_s, life.waited_s) == (State.RUNNING, 0.0, 0.0)
    life.no_data("running", 25)
    assert life.state is State.IDLE  # 25 s, not 45: the step reset the clock


def test_paused_waits_past_the_timeout_trains_what_is_queued_and_resumes() -> None:
    life = Lifecycle(data_timeout_s=15)
    life.no_data("running", 10)
    for _ in range(5):  # far past the data timeout
        assert life.no_data("paused", 10) is State.PAUSED
    assert life.idle_s == 0 and life.waited_s == 10  # paused time is neither idle nor bubble
    assert life.trained() == 10 and life.state is State.PAUSED  # queued groups still train while paused
    assert life.no_data("running", 10) is State.IDLE  # resumed: the timeout runs again, from zero
    assert life.no_data("running", 10) is State.FAILED


@pytest.mark.parametrize("status", ["cancelled", "completed", "failed"])
@pytest.mark.parametrize("start", ["running", "idle", "paused"])
def test_a_job_ended_on_the_site_stops_with_the_sites_status(status: str, start: str) -> None:
    life = Lifecycle(data_timeout_s=30, state=State(start))
    assert life.no_data(status, 10) is State.ENDED
    assert life.status == status and life.commit


def test_redis_failure_is_ours_unless_the_site_ended_the_job() -> None:
    ours = Lifecycle(data_timeout_s=30)
    assert ours.redis_failed("running", "ConnectionError: gone") is State.FAILED
    assert ours.reason == "Redis failed: ConnectionError: gone" and not ours.commit  # Redis cannot acknowledge
    cancelled = Lifecycle(data_timeout_s=30)
    assert cancelled.redis_failed("cancelled", "ResponseError: NOGROUP") is State.ENDED
    assert cancelled.status is JobStatus.CANCELLED and cancelled.commit


def test_report_failure_is_ours_unless_the_site_ended_the_job() -> None:
    ours = Lifecycle(data_timeout_s=30)
    assert ours.report_failed(None, 4, "500") is State.FAILED and ours.reason == "reporting step 4 failed: 500"
    ended = Lifecycle(data_timeout_s=30)
    assert ended.report_failed("cancelled", 4, "400 job cancelled") is State.ENDED
    assert ended.status is JobStatus.CANCELLED


def test_publish_failure_fails_and_completion_completes() -> None:
    failed = Lifecycle(data_timeout_s=30)
    assert failed.publish_failed(2, "400 bad manifest") is State.FAILED
    assert failed.reason == "publishing v2 failed: 400 bad manifest"
    done = Lifecycle(data_timeout_s=30, state=State.PAUSED)
    assert done.complete("reached 6 steps") is State.COMPLETED
    assert done.status is JobStatus.COMPLETED and done.commit


def test_final_states_are_final_and_the_table_is_closed() -> None:
    life = Lifecycle(data_timeout_s=30)
    life.publish_failed(2, "x")
    with pytest.raises(TransitionError):
        life.trained()
    with pytest.raises(TransitionError):
        Lifecycle(data_timeout_s=30, state=State.IDLE).complete("only after a step")  # completion follows a step
    assert set(TRANSITIONS) == set(State) and all(not TRANSITIONS[s] for s in FINAL)
    assert all(targets <= set(State) for targets in TRANSITIONS.values())
