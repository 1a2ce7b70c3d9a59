"""``site-restart``: daphne dies and is started again at once; the agents reconnect."""

from __future__ import annotations

import signal

from .base import Action, Fault, reconnect_s, register_fault


@register_fault
class SiteRestart(Fault):
    name = "site-restart"
    about = "SIGKILL of daphne, started again at once"
    target = "daphne"
    detect = "the outage + agent reconnect"
    does = "SIGKILL of daphne, started again at once"
    detected_by = ("the outage (kill to the site answering) + the agents' reconnect delay (a quarter to half of the "
                   "time away so far: at most half the outage again)")

    def plan(self, run, victim: str) -> list[Action]:
        return [(0, "SIGKILL daphne", lambda: run.signal(victim, signal.SIGKILL)),
                (0, "restart daphne", lambda: run.came_back(run.restart_site))]

    def detection_s(self, *, down: float, restart: float | None) -> float:
        return reconnect_s(down)
