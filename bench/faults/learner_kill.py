"""``learner-kill``: the learner dies right after a step and is started again with the same command."""

from __future__ import annotations

import signal

from .base import Action, Fault, register_fault


@register_fault
class LearnerKill(Fault):
    name = "learner-kill"
    about = "SIGKILL of the learner, restarted with the same command"
    target = "learner"
    detect = "its restart (kill -> resumed)"
    does = "SIGKILL of the learner right after a step, the same command again 0.5 s later"
    detected_by = ("the restart: kill to the restarted learner's \"resumed at vN, set up; training\" line, logged once "
                   "its checkpoint is loaded, its snapshots announced again from its new ports and its owed reports "
                   "queued")

    def plan(self, run, victim: str) -> list[Action]:
        return [(0, "SIGKILL learner", lambda: run.signal(victim, signal.SIGKILL)),
                (0.5, "restart learner", lambda: run.restart(victim))]

    def detection_s(self, *, down: float, restart: float | None) -> float:
        """The learner's own restart (0 when it was never seen set up again)."""
        return restart or 0.0
