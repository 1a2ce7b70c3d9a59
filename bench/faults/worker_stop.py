"""``worker-stop``: a worker freezes (SIGSTOP) until the site released it, then resumes."""

from __future__ import annotations

import signal

from .base import BEAT_S, WORKER_TIMEOUT_S, Action, Fault, register_fault


@register_fault
class WorkerStop(Fault):
    name = "worker-stop"
    about = "SIGSTOP of a worker until the site released it, then SIGCONT"
    target = "worker"
    detect = f"worker timeout {WORKER_TIMEOUT_S:g} s + expiry beat {BEAT_S:g} s"
    does = (f"SIGSTOP of an active non-relay worker; SIGCONT 2 s after the site released it (past the "
            f"{WORKER_TIMEOUT_S:g} s worker timeout, at the next {BEAT_S:g} s expiry beat), "
            f"{WORKER_TIMEOUT_S + BEAT_S + 5:g} s at most, so the job runs on with the resumed agent")
    detected_by = f"worker timeout + expiry beat, {WORKER_TIMEOUT_S + BEAT_S:g} s"

    def plan(self, run, victim: str) -> list[Action]:
        return [(0, f"SIGSTOP {victim}", lambda: run.signal(victim, signal.SIGSTOP)),
                (WORKER_TIMEOUT_S, f"SIGCONT {victim} once released",
                 lambda: run.came_back(run.cont_once_released, victim))]

    def detection_s(self, *, down: float, restart: float | None) -> float:
        return WORKER_TIMEOUT_S + BEAT_S
