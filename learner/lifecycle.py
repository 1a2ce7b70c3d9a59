"""Where a learning run stands between steps: a small state machine, with no site, Redis or torch in it.

``run_job`` (learner/trainer.py) feeds it what happened (a step trained; a wait brought no data and the
site says the job is X; Redis, publication or the report failed) and acts on the state it lands in.

::

    RUNNING --no data, site running--> IDLE --no data for data_timeout_s--> FAILED
    RUNNING/IDLE --no data, site paused--> PAUSED --no data, site running again--> IDLE
    IDLE --trained--> RUNNING               PAUSED --trained (queued data)--> PAUSED
    any --no data, or Redis/report failed, and the site ended the job--> ENDED (its status)
    any --Redis failed / publication failed / report failed--> FAILED
    RUNNING/PAUSED --max_steps or reward target--> COMPLETED

The data timeout only runs while the job is running: a paused job waits as long as it stays paused
(the idle time restarts on pause), and the site being unreachable counts as running.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dataplane.jobs import TERMINAL, JobStatus


class State(StrEnum):
    RUNNING = "running"  # training: the last wait brought data (or nothing was waited for yet)
    IDLE = "idle"  # running, but no admissible data for ``idle_s`` seconds
    PAUSED = "paused"  # paused on the site: no data timeout; what is queued is still trained
    COMPLETED = "completed"  # final: max_steps, or the reward target
    FAILED = "failed"  # final, our failure: no data, Redis, publication or report
    ENDED = "ended"  # final: the job ended on the site (cancelled, say); stop with the site's status


FINAL = frozenset({State.COMPLETED, State.FAILED, State.ENDED})

TRANSITIONS: dict[State, frozenset[State]] = {
    State.RUNNING: frozenset({State.RUNNING, State.IDLE, State.PAUSED, *FINAL}),
    State.IDLE: frozenset({State.RUNNING, State.IDLE, State.PAUSED, State.FAILED, State.ENDED}),
    State.PAUSED: frozenset({State.PAUSED, State.IDLE, *FINAL}),
    **{final: frozenset() for final in FINAL},
}


class TransitionError(RuntimeError):
    """A move the table above does not allow (a bug in the caller)."""


@dataclass
class Lifecycle:
    """The learner's state between steps, the time it has waited for data, and how a final state ends.

    ``status`` is what the run returns once final; ``reason`` what it tells the site; ``commit``
    whether what was trained since the last checkpoint is committed before stopping (not after a Redis
    failure, nor when publication or the report failed).
    """

    data_timeout_s: float
    state: State = State.RUNNING
    idle_s: float = 0.0  # without data while running: the data timeout's clock
    waited_s: float = 0.0  # without data while running, since the last step: the next step's bubble
    status: JobStatus | None = None
    reason: str = ""
    commit: bool = False

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def trained(self) -> float:
        """A step trained; returns the earlier polls' waiting time, which belongs to its bubble."""
        waited, self.idle_s, self.waited_s = self.waited_s, 0.0, 0.0
        self._move(State.PAUSED if self.state is State.PAUSED else State.RUNNING)
        return waited

    def no_data(self, site_status: str | None, poll_s: float, *, waiting_for: str = "") -> State:
        """A wait of ``poll_s`` brought no data; ``site_status`` is the job's on the site (None: no answer)."""
        if site_status in TERMINAL:
            return self._ended(site_status)
        if site_status == JobStatus.PAUSED:
            self.idle_s = 0.0
            return self._move(State.PAUSED)
        self.idle_s += poll_s
        self.waited_s += poll_s
        if self.idle_s >= self.data_timeout_s:
            return self._fail(f"no admissible trajectories for {self.idle_s:.0f}s{waiting_for}", commit=True)
        return self._move(State.IDLE)

    def redis_failed(self, site_status: str | None, error: str) -> State:
        """Redis failed: the site dropped the streams of a job it ended (cancelled), or it is our failure."""
        if site_status in TERMINAL:
            return self._ended(site_status)
        return self._fail(f"Redis failed: {error}")

    def publish_failed(self, version: int, error: str) -> State:
        return self._fail(f"publishing v{version} failed: {error}")

    def report_failed(self, site_status: str | None, version: int, error: str) -> State:
        """The site refused the report: because it ended the job meanwhile (not our failure), or ours."""
        if site_status in TERMINAL:
            return self._ended(site_status)
        return self._fail(f"reporting step {version} failed: {error}")

    def complete(self, reason: str) -> State:
        self.status, self.reason, self.commit = JobStatus.COMPLETED, reason, True
        return self._move(State.COMPLETED)

    def _ended(self, site_status: str) -> State:
        self.status, self.reason, self.commit = JobStatus(site_status), f"{site_status} on the site", True
        return self._move(State.ENDED)

    def _fail(self, reason: str, *, commit: bool = False) -> State:
        self.status, self.reason, self.commit = JobStatus.FAILED, reason, commit
        return self._move(State.FAILED)

    def _move(self, to: State) -> State:
        if to not in TRANSITIONS[self.state]:
            raise TransitionError(f"{self.state} -> {to}")
        self.state = to
        return to
